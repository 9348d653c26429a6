//! Fuzz target `store` (see the crate's documentation).
fn main() -> std::process::ExitCode {
    kolo_fuzz::main("store")
}
