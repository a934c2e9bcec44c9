fn main() -> std::process::ExitCode {
    gpu_driver_installer::cli::run()
}
