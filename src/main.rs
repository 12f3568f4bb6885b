fn main() -> std::process::ExitCode {
    leasefs::cli::run()
}
