//! An address or a network (`10.0.0.5`, `10.0.0.0/8`, `::1`, `fd00::/8`):
//! how `auth.trusted_proxies` names the reverse proxies in front of a node.
//! A value type; it never touches the network.

use std::net::IpAddr;

/// One address (a /32 or /128) or a network given by its prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Network {
    addr: IpAddr,
    prefix: u8,
}

impl Network {
    /// Parse `a.b.c.d`, `a.b.c.d/n`, an IPv6 address, or one with `/n`.
    pub fn parse(s: &str) -> Option<Network> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().ok()?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p.parse::<u8>().ok().filter(|p| *p <= max)?,
            None => max,
        };
        Some(Network { addr, prefix })
    }

    /// Whether `ip` is inside this network (an IPv4-mapped IPv6 address
    /// counts as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn an_address_contains_itself_only_and_a_network_its_range() {
        let one = Network::parse("10.0.0.5").unwrap();
        assert!(one.contains(ip("10.0.0.5")));
        assert!(!one.contains(ip("10.0.0.6")));
        let net = Network::parse("10.0.0.0/8").unwrap();
        assert!(net.contains(ip("10.200.1.1")));
        assert!(!net.contains(ip("11.0.0.1")));
        assert!(Network::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        let v6 = Network::parse("fd00::/8").unwrap();
        assert!(v6.contains(ip("fd12::1")));
        assert!(!v6.contains(ip("fe80::1")));
        assert!(
            Network::parse("127.0.0.1")
                .unwrap()
                .contains(ip("::ffff:127.0.0.1")),
            "an IPv4-mapped peer is its IPv4 address"
        );
    }

    #[test]
    fn what_is_not_an_address_or_a_prefix_does_not_parse() {
        for bad in ["", "proxy", "10.0.0.0/33", "10.0.0.0/x", "::1/129", "1.2.3"] {
            assert_eq!(Network::parse(bad), None, "{bad:?}");
        }
    }
}
