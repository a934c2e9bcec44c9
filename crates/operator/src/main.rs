fn main() -> std::process::ExitCode {
    gpu_driver_operator::cli::run()
}
