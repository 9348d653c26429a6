//! What the tests of `kolo run` share: the binary, a run to completion, its output.
#![allow(dead_code)]

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn kolo() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kolo"))
}

/// Runs `kolo run <args>` to completion; returns its output and how long it took.
pub fn run(args: &[&str]) -> (Output, Duration) {
    let start = Instant::now();
    let output = kolo()
        .arg("run")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("the kolo binary starts");
    (output, start.elapsed())
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
