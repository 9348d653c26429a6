//! This host's name and the local address that routes to a peer: the one copy of each that the
//! launcher, the rendezvous and the metrics writers share.

use std::net::{IpAddr, ToSocketAddrs, UdpSocket};

/// The host name (`uname`'s node name, as `gethostname` returns it), or `None` when it is empty or
/// cannot be read. Callers choose their own fallback.
pub fn hostname() -> Option<String> {
    let uname = rustix::system::uname();
    let name = uname.nodename().to_string_lossy().trim().to_string();
    (!name.is_empty()).then_some(name)
}

/// The local address that traffic to `host:port` leaves from (no packet is sent: a UDP `connect`
/// only picks a route), or `None` when `host` does not resolve or has no route.
pub fn route_to(host: &str, port: u16) -> Option<IpAddr> {
    let target = (host, port).to_socket_addrs().ok()?.next()?;
    let bind = if target.is_ipv4() {
        "0.0.0.0:0"
    } else {
        "[::]:0"
    };
    let s = UdpSocket::bind(bind).ok()?;
    s.connect(target).ok()?;
    Some(s.local_addr().ok()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostname_is_not_empty() {
        assert!(hostname().is_some_and(|h| !h.is_empty()));
    }

    #[test]
    fn loopback_routes_through_loopback() {
        let ip = route_to("127.0.0.1", 9).expect("a route to loopback");
        assert!(ip.is_loopback());
    }
}
