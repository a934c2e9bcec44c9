fn main() -> std::process::ExitCode {
    gpu_driver::exporter::cli::run()
}
