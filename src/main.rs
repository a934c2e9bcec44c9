fn main() -> std::process::ExitCode {
    gpu_driver::cli::run()
}
