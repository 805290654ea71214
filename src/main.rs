//! The `hwaccel` binary. Every subcommand's flags and output live in the library's `cli`
//! module; this file only hands the process over to it.

fn main() -> std::process::ExitCode {
    hwaccel::cli::main()
}
