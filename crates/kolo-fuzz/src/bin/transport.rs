//! Fuzz target `transport` (see the crate's documentation).
fn main() -> std::process::ExitCode {
    kolo_fuzz::main("transport")
}
