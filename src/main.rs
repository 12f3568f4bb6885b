//! The `leasefs` command: everything it does is in the library (`cli`),
//! so that tests and tools reach the same code.

fn main() -> std::process::ExitCode {
    leasefs::cli::run()
}
