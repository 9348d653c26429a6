//! One module per `kolo` subcommand.

pub mod bench;
pub mod run;
pub mod train;

use std::error::Error;
use std::process::ExitCode;

/// Prints `kolo <command>: <error>: <source>: ...` to stderr, leaving out
/// sources whose text the message already contains.
pub fn report_error(command: &str, err: &dyn Error) {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !text.is_empty() && !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    eprintln!("kolo {command}: {message}");
}

/// Converts an exit code to an [`ExitCode`], mapping codes outside 0..=255 to 1.
pub fn exit_code(code: i32) -> ExitCode {
    match u8::try_from(code) {
        Ok(code) => ExitCode::from(code),
        Err(_) => ExitCode::FAILURE,
    }
}
