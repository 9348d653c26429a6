//! Hosts a store that speaks PyTorch's c10d `TCPStore` protocol, so that PyTorch programs
//! (`torch.distributed.TCPStore(host, port, is_master=False)`) and kolo ranks (`c10d://HOST:PORT`)
//! can rendezvous on it. Prints the address, then serves until stdin closes.
//!
//! Run: `cargo run -p kolo-store --example c10d_server [ADDR]` (default `127.0.0.1:0`).

use std::io::Read;

fn main() -> Result<(), kolo_store::StoreError> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:0".into());
    let server = kolo_store::C10dStoreServer::bind(addr.as_str())?;
    println!("{}", server.local_addr());
    // Serve until whoever started us closes our stdin.
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    server.shutdown();
    Ok(())
}
