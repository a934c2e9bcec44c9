fn main() -> std::process::ExitCode {
    gpu_driver::operator::cli::main()
}
