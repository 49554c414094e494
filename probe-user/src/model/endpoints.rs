//! Remote endpoints: a worker's socket peers as the kernel keeps them, named by the user's
//! `--endpoint NAME=CIDR[:PORT]` rules, or as `local`, `ip:port`, `other` (beyond the bound)
//! and `unconnected` (sockets with no peer, e.g. UDP with sendto).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use probe_common::net::{AF_INET, AF_INET6, AF_UNIX, ENDPOINT_OTHER, EndpointKey, EndpointStats};
use serde::{Deserialize, Serialize};

use super::Measured;

/// One `--endpoint` rule: a name for the peers in a network, on a port, or both.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointRule {
    /// The group's name.
    pub name: String,
    /// Network and prefix length, when the rule has one.
    pub network: Option<(IpAddr, u8)>,
    /// Port, when the rule has one.
    pub port: Option<u16>,
}

/// The expected form, for error sentences.
const FORM: &str =
    "NAME=CIDR[:PORT] or NAME=:PORT, like object-store=10.20.0.0/16:9000 or web=:443";

/// Parses `NAME=CIDR[:PORT]`, `NAME=ADDRESS[:PORT]` or `NAME=:PORT` (IPv6 in brackets when a
/// port follows: `[fd00::]/8:443`).
pub fn parse_rule(text: &str) -> Result<EndpointRule, String> {
    let (name, target) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}` is not an endpoint rule: use {FORM}"))?;
    let valid_name = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !valid_name {
        return Err(format!(
            "`{name}` is not an endpoint name: use up to 64 letters, digits, '-', '_' or '.' ({FORM})"
        ));
    }
    let reserved = ["local", "other", "unconnected", "unnamed"];
    if reserved.contains(&name) {
        return Err(format!(
            "`{name}` names a built-in endpoint group: choose another name ({FORM})"
        ));
    }
    let bad = || format!("`{text}` is not an endpoint rule: use {FORM}");
    let (address, port) = split_port(target).ok_or_else(bad)?;
    let network = if address.is_empty() {
        None
    } else {
        let (ip, prefix) = match address.split_once('/') {
            Some((ip, prefix)) => (ip, Some(prefix)),
            None => (address, None),
        };
        let ip: IpAddr = ip
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| bad())?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(prefix) => prefix
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(bad)?,
            None => max,
        };
        Some((ip, prefix))
    };
    if network.is_none() && port.is_none() {
        return Err(bad());
    }
    Ok(EndpointRule {
        name: name.to_string(),
        network,
        port,
    })
}

/// Splits `ADDRESS[:PORT]` (IPv6 addresses in brackets when a port follows).
fn split_port(target: &str) -> Option<(&str, Option<u16>)> {
    // `:PORT`, but not a bare IPv6 address that starts with `::` (`::1`, `::/0`).
    if let Some(rest) = target.strip_prefix(':')
        && !rest.contains(':')
    {
        return Some(("", Some(rest.parse().ok()?)));
    }
    if target.starts_with('[') {
        let close = target.find(']')?;
        let after = &target[close + 1..];
        // `[addr]/prefix:port` or `[addr]:port` or `[addr]/prefix`.
        let (prefix, port) = match after.rsplit_once(':') {
            Some((prefix, port)) => (prefix, Some(port.parse().ok()?)),
            None => (after, None),
        };
        let address_end = close + 1 + prefix.len();
        return Some((&target[..address_end], port));
    }
    // IPv4 (or a bare IPv6 without a port: more than one colon).
    if target.matches(':').count() == 1 {
        let (address, port) = target.split_once(':')?;
        return Some((address, Some(port.parse().ok()?)));
    }
    Some((target, None))
}

impl EndpointRule {
    fn matches(&self, ip: IpAddr, port: u16) -> bool {
        let port_ok = self.port.is_none_or(|p| p == port);
        let network_ok = self
            .network
            .is_none_or(|(network, prefix)| in_network(ip, network, prefix));
        port_ok && network_ok
    }
}

fn in_network(ip: IpAddr, network: IpAddr, prefix: u8) -> bool {
    match (ip, network) {
        (IpAddr::V4(ip), IpAddr::V4(network)) => {
            let mask = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(prefix))
            };
            u32::from(ip) & mask == u32::from(network) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(network)) => {
            let mask = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(prefix))
            };
            u128::from(ip) & mask == u128::from(network) & mask
        }
        // An IPv4 peer on an IPv6 socket (::ffff:a.b.c.d) matches IPv4 rules.
        (IpAddr::V6(ip), IpAddr::V4(_)) => ip
            .to_ipv4_mapped()
            .is_some_and(|v4| in_network(IpAddr::V4(v4), network, prefix)),
        _ => false,
    }
}

/// How an endpoint is named.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EndpointName {
    /// The group: a rule's name, `local`, `other`, `unconnected`, or `None` for a peer no
    /// rule names.
    pub group: Option<String>,
    /// `ip:port` for an IP peer, else the group.
    pub address: String,
}

impl EndpointName {
    /// What outputs show: the group if any, else the address.
    pub fn label(&self) -> &str {
        self.group.as_deref().unwrap_or(&self.address)
    }
}

/// Names endpoints by the user's rules, first match first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointNamer {
    rules: Vec<EndpointRule>,
}

impl EndpointNamer {
    /// A namer with these rules.
    pub fn new(rules: Vec<EndpointRule>) -> Self {
        Self { rules }
    }

    /// The name of a kernel endpoint key.
    pub fn name(&self, key: &EndpointKey) -> EndpointName {
        let named = |group: &str| EndpointName {
            group: Some(group.to_string()),
            address: group.to_string(),
        };
        let ip = match key.family {
            ENDPOINT_OTHER => return named("other"),
            AF_UNIX => return named("local"),
            AF_INET => IpAddr::V4(Ipv4Addr::new(
                key.addr[0],
                key.addr[1],
                key.addr[2],
                key.addr[3],
            )),
            AF_INET6 => IpAddr::V6(Ipv6Addr::from(key.addr)),
            _ => return named("local"),
        };
        if ip.is_unspecified() {
            return named("unconnected");
        }
        let address = match ip {
            IpAddr::V4(v4) => format!("{v4}:{}", key.port),
            IpAddr::V6(v6) => format!("[{v6}]:{}", key.port),
        };
        if let Some(rule) = self.rules.iter().find(|rule| rule.matches(ip, key.port)) {
            return EndpointName {
                group: Some(rule.name.clone()),
                address,
            };
        }
        let loopback = match ip {
            IpAddr::V4(v4) => v4.is_loopback(),
            IpAddr::V6(v6) => {
                v6.is_loopback() || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
            }
        };
        EndpointName {
            group: loopback.then(|| "local".to_string()),
            address,
        }
    }
}

/// One endpoint of a worker over an interval (or its life).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointDelta {
    /// The kernel's key (its cgroup id is the worker's).
    pub key: EndpointKey,
    /// What happened with it.
    pub stats: EndpointStats,
}

/// Endpoints summed by name (label), busiest first: bytes, then wait.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NamedEndpoint {
    /// What outputs show.
    pub label: String,
    /// The group it belongs to, when one names it.
    pub group: Option<String>,
    /// Summed figures.
    pub stats: EndpointStats,
}

/// A worker's endpoints summed by label: every group once, and each unnamed address once.
pub fn by_label(namer: &EndpointNamer, endpoints: &[EndpointDelta]) -> Vec<NamedEndpoint> {
    let mut named: Vec<NamedEndpoint> = Vec::new();
    for endpoint in endpoints {
        let name = namer.name(&endpoint.key);
        let label = name.label().to_string();
        let entry = match named.iter_mut().find(|n| n.label == label) {
            Some(entry) => entry,
            None => {
                named.push(NamedEndpoint {
                    label,
                    group: name.group.clone(),
                    stats: EndpointStats::default(),
                });
                named.last_mut().expect("just pushed")
            }
        };
        add_stats(&mut entry.stats, &endpoint.stats);
    }
    named.retain(|n| n.stats != EndpointStats::default());
    named.sort_by(|a, b| {
        let bytes = |s: &EndpointStats| s.sent_bytes + s.received_bytes;
        bytes(&b.stats)
            .cmp(&bytes(&a.stats))
            .then(b.stats.wait_ns.cmp(&a.stats.wait_ns))
            .then(a.label.cmp(&b.label))
    });
    named
}

/// One remote endpoint (or group) of a worker or process as every output shows it: exit
/// summaries, snapshots, recordings and process exits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointFigures {
    /// The group's name (`--endpoint`, `local`, `other`, `unconnected`), else `ip:port`.
    pub endpoint: String,
    /// Whether a group names it (false: a raw address).
    pub named: bool,
    /// Payload bytes sent to it.
    pub sent_bytes: u64,
    /// Payload bytes received from it.
    pub received_bytes: u64,
    /// Send calls.
    pub sent_calls: u64,
    /// Receive calls.
    pub received_calls: u64,
    /// Thread-seconds its sockets' calls slept before they returned (null without the
    /// delays programs).
    pub wait_seconds: Option<f64>,
}

/// `endpoints` by label, busiest first, as outputs show them; `None` where endpoints were
/// not measured.
pub fn figures(
    namer: &EndpointNamer,
    endpoints: &[EndpointDelta],
    measured: Measured,
) -> Option<Vec<EndpointFigures>> {
    measured.endpoints.then(|| {
        by_label(namer, endpoints)
            .into_iter()
            .map(|endpoint| EndpointFigures {
                named: endpoint.group.is_some(),
                endpoint: endpoint.label,
                sent_bytes: endpoint.stats.sent_bytes,
                received_bytes: endpoint.stats.received_bytes,
                sent_calls: endpoint.stats.sent_calls,
                received_calls: endpoint.stats.received_calls,
                wait_seconds: measured.delays.then(|| endpoint.stats.wait_ns as f64 / 1e9),
            })
            .collect()
    })
}

/// `sum += add`, field by field.
pub fn add_stats(sum: &mut EndpointStats, add: &EndpointStats) {
    sum.sent_bytes += add.sent_bytes;
    sum.received_bytes += add.received_bytes;
    sum.sent_calls += add.sent_calls;
    sum.received_calls += add.received_calls;
    sum.wait_ns += add.wait_ns;
    sum.waits += add.waits;
}

/// `now - before`, field by field, from zero where a counter went backwards.
pub fn sub_stats(now: &EndpointStats, before: &EndpointStats) -> EndpointStats {
    let delta = |n: u64, b: u64| n.checked_sub(b).unwrap_or(n);
    EndpointStats {
        sent_bytes: delta(now.sent_bytes, before.sent_bytes),
        received_bytes: delta(now.received_bytes, before.received_bytes),
        sent_calls: delta(now.sent_calls, before.sent_calls),
        received_calls: delta(now.received_calls, before.received_calls),
        wait_ns: delta(now.wait_ns, before.wait_ns),
        waits: delta(now.waits, before.waits),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(a: [u8; 4], port: u16) -> EndpointKey {
        let mut addr = [0; 16];
        addr[..4].copy_from_slice(&a);
        EndpointKey {
            cgroup_id: 1,
            addr,
            port,
            family: AF_INET,
            reserved: 0,
        }
    }

    #[test]
    fn parses_rules_and_refuses_bad_ones() {
        let rule = parse_rule("object-store=10.20.0.0/16:9000").unwrap();
        assert_eq!(rule.network, Some(("10.20.0.0".parse().unwrap(), 16)));
        assert_eq!(rule.port, Some(9000));
        assert_eq!(parse_rule("web=:443").unwrap().port, Some(443));
        assert_eq!(parse_rule("peers=10.30.0.0/16").unwrap().port, None);
        assert_eq!(parse_rule("one=10.0.0.1").unwrap().network.unwrap().1, 32);
        let v6 = parse_rule("v6=[fd00::]/8:443").unwrap();
        assert_eq!(v6.network, Some(("fd00::".parse().unwrap(), 8)));
        assert_eq!(v6.port, Some(443));
        assert_eq!(parse_rule("v6b=fd00::/8").unwrap().port, None);
        // A bare IPv6 address may start with `::`: not a port.
        let loopback = parse_rule("lo6=::1").unwrap();
        assert_eq!(loopback.network, Some(("::1".parse().unwrap(), 128)));
        assert_eq!(loopback.port, None);
        assert_eq!(parse_rule("all6=::/0").unwrap().network.unwrap().1, 0);
        assert_eq!(parse_rule("lo6p=[::1]:80").unwrap().port, Some(80));
        for bad in [
            "nothing",
            "=10.0.0.0/8",
            "x=10.0.0.0/33",
            "x=:http",
            "x=",
            "local=:1",
            "a b=:1",
        ] {
            let message = parse_rule(bad).unwrap_err();
            assert!(
                message.contains("NAME=CIDR") || message.contains("built-in"),
                "{bad}: {message}"
            );
        }
    }

    #[test]
    fn names_by_first_matching_rule_then_loopback() {
        let namer = EndpointNamer::new(vec![
            parse_rule("store=127.0.0.2/32").unwrap(),
            parse_rule("web=:443").unwrap(),
        ]);
        assert_eq!(namer.name(&v4([127, 0, 0, 2], 80)).label(), "store");
        assert_eq!(namer.name(&v4([1, 2, 3, 4], 443)).label(), "web");
        assert_eq!(namer.name(&v4([127, 0, 0, 3], 80)).label(), "local");
        let raw = namer.name(&v4([10, 0, 0, 9], 5432));
        assert_eq!((raw.group.clone(), raw.label()), (None, "10.0.0.9:5432"));
        assert_eq!(namer.name(&v4([0, 0, 0, 0], 0)).label(), "unconnected");
        let other = EndpointKey {
            family: ENDPOINT_OTHER,
            ..EndpointKey::default()
        };
        assert_eq!(namer.name(&other).label(), "other");
        let mut mapped = v4([0; 4], 443);
        mapped.family = AF_INET6;
        mapped.addr = "::ffff:127.0.0.2".parse::<Ipv6Addr>().unwrap().octets();
        assert_eq!(namer.name(&mapped).label(), "store");
    }

    #[test]
    fn sums_by_label() {
        let namer = EndpointNamer::new(vec![parse_rule("store=10.0.0.0/8").unwrap()]);
        let stats = |sent| EndpointStats {
            sent_bytes: sent,
            ..EndpointStats::default()
        };
        let endpoints = [
            EndpointDelta {
                key: v4([10, 0, 0, 1], 1),
                stats: stats(5),
            },
            EndpointDelta {
                key: v4([10, 0, 0, 2], 1),
                stats: stats(7),
            },
            EndpointDelta {
                key: v4([8, 8, 8, 8], 53),
                stats: stats(100),
            },
        ];
        let named = by_label(&namer, &endpoints);
        assert_eq!(named.len(), 2);
        assert_eq!(
            (named[0].label.as_str(), named[0].stats.sent_bytes),
            ("8.8.8.8:53", 100)
        );
        assert_eq!(
            (named[1].label.as_str(), named[1].stats.sent_bytes),
            ("store", 12)
        );
    }
}
