//! This host's name and its interfaces' addresses.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The host name (`"?"` where it cannot be read).
pub fn hostname() -> String {
    kolo_core::host::hostname().unwrap_or_else(|| "?".into())
}

/// Every (interface name, address) of this host, IPv4 before IPv6.
pub fn interfaces() -> Vec<(String, IpAddr)> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut p = head;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list getifaddrs returned.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a NUL-terminated name owned by the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: ifa_addr points to a sockaddr whose family says which struct it is.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let ip = if family == libc::AF_INET {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
        } else if family == libc::AF_INET6 {
            // SAFETY: an AF_INET6 address is a sockaddr_in6.
            let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
            IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
        } else {
            continue;
        };
        out.push((name, ip));
    }
    // SAFETY: the list from getifaddrs, freed once.
    unsafe { libc::freeifaddrs(head) };
    out.sort_by_key(|(_, ip)| ip.is_ipv6());
    out
}

/// The local address (and its interface, when known) that traffic to `host:port` leaves from.
pub fn route_to(host: &str, port: u16) -> Option<(IpAddr, Option<String>)> {
    let ip = kolo_core::host::route_to(host, port)?;
    let name = interfaces()
        .into_iter()
        .find(|(_, a)| *a == ip)
        .map(|(n, _)| n);
    Some((ip, name))
}

/// The first address of interface `name`, or an error listing the interfaces there are.
pub fn iface_addr(name: &str) -> Result<IpAddr, String> {
    let all = interfaces();
    if let Some((_, ip)) = all.iter().find(|(n, _)| n == name) {
        return Ok(*ip);
    }
    let mut names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    Err(format!(
        "no interface {name:?} with an address on this host (there are: {})",
        names.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_found_and_a_missing_interface_is_named() {
        assert_eq!(iface_addr("lo"), Ok(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        let err = iface_addr("no-such-if0").expect_err("no such interface");
        assert!(err.contains("no-such-if0") && err.contains("lo"), "{err}");
        assert!(!hostname().is_empty());
    }
}
