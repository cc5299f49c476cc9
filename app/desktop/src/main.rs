//! `mergescope`: the command-line interface (and, later, the desktop app) over the engine.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    mergescope_engine::sys::tune_allocator();
    mergescope_engine::sys::default_sigpipe();
    match cli::run() {
        Ok(code) => code,
        Err(e) => {
            // One paragraph: the error and its causes.
            let mut msg = format!("error: {e}");
            for cause in e.chain().skip(1) {
                msg.push_str(&format!("\n  caused by: {cause}"));
            }
            eprintln!("{msg}");
            ExitCode::FAILURE
        }
    }
}
