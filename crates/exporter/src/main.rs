fn main() -> std::process::ExitCode {
    gpu_driver_exporter::cli::run()
}
