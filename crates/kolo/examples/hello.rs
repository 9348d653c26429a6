//! Hello world: every process joins the world and prints its rank (mpi4py's `helloworld.py`).
//!
//! Run: `kolo run -n 4 -- target/release/examples/hello` (without a launcher it is a world of one).

use std::process::ExitCode;

fn main() -> ExitCode {
    match kolo::init() {
        Ok(comm) => {
            println!(
                "Hello world from process {} of {}",
                comm.rank(),
                comm.size()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            // No communicator, so no rank from it: take the launcher's.
            let rank = std::env::var("RANK").unwrap_or_else(|_| "?".into());
            eprintln!("rank {rank}: error: {e}");
            kolo::error_file::record_error(&e.to_string()); // shown by torchrun
            ExitCode::FAILURE
        }
    }
}
