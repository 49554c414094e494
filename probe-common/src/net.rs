//! Socket payload bytes and calls per cgroup, written by the `sock_send_length` and
//! `sock_recv_length` programs.

/// Name of the per-CPU hash map: cgroup id (`u64`) → [`NetStats`].
pub const NET_STATS_MAP: &str = "NET_STATS";
/// Name of the read-only global holding `offsetof(struct sock, __sk_common.skc_family)`,
/// resolved from the kernel's BTF at load time.
pub const SOCK_FAMILY_OFFSET_GLOBAL: &str = "SOCK_FAMILY_OFFSET";
/// Name of the read-only global holding `offsetof(struct socket, sk)`, for the programs that
/// receive a `struct socket *` (the fexit variant on kernels before 6.3).
pub const SOCKET_SK_OFFSET_GLOBAL: &str = "SOCKET_SK_OFFSET";

/// Index of a socket family in [`NetStats::families`].
pub const FAMILY_IPV4: usize = 0;
/// Index of AF_INET6 sockets.
pub const FAMILY_IPV6: usize = 1;
/// Index of AF_UNIX sockets.
pub const FAMILY_UNIX: usize = 2;
/// Index of every other family (netlink, packet, vsock, …).
pub const FAMILY_OTHER: usize = 3;
/// Number of family slots.
pub const FAMILY_COUNT: usize = 4;
/// Family names, in slot order, as shown to users and in labels.
pub const FAMILY_NAMES: [&str; FAMILY_COUNT] = ["ipv4", "ipv6", "unix", "other"];

/// Linux `AF_UNIX`.
pub const AF_UNIX: u16 = 1;
/// Linux `AF_INET`.
pub const AF_INET: u16 = 2;
/// Linux `AF_INET6`.
pub const AF_INET6: u16 = 10;
/// Linux `MSG_PEEK`: a read that leaves the data queued; not counted.
pub const MSG_PEEK: i32 = 2;

/// Maps an address family to its slot in [`NetStats::families`].
#[inline(always)]
pub fn family_slot(family: u16) -> usize {
    match family {
        AF_INET => FAMILY_IPV4,
        AF_INET6 => FAMILY_IPV6,
        AF_UNIX => FAMILY_UNIX,
        _ => FAMILY_OTHER,
    }
}

/// Payload moved through sockets of one family. Counters only grow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FamilyCounters {
    /// Bytes accepted by successful send calls.
    pub sent_bytes: u64,
    /// Successful send calls.
    pub sent_calls: u64,
    /// Bytes returned by successful, non-peeking receive calls.
    pub received_bytes: u64,
    /// Successful, non-peeking receive calls.
    pub received_calls: u64,
}

impl FamilyCounters {
    /// Adds `other`'s counts to these (user space sums CPUs and workers).
    pub fn add(&mut self, other: &FamilyCounters) {
        self.sent_bytes += other.sent_bytes;
        self.sent_calls += other.sent_calls;
        self.received_bytes += other.received_bytes;
        self.received_calls += other.received_calls;
    }
}

/// One cgroup's socket traffic on one CPU, per family.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Indexed by `FAMILY_*`.
    pub families: [FamilyCounters; FAMILY_COUNT],
}

const _: () = assert!(core::mem::size_of::<NetStats>() == 128);

impl NetStats {
    /// Adds `other`'s counts to these, family by family (user space sums CPUs and workers).
    pub fn add(&mut self, other: &NetStats) {
        for (sum, add) in self.families.iter_mut().zip(&other.families) {
            sum.add(add);
        }
    }
}

#[cfg(feature = "user")]
// SAFETY: plain `#[repr(C)]` integers, no padding, every bit pattern valid.
unsafe impl aya::Pod for FamilyCounters {}
#[cfg(feature = "user")]
// SAFETY: an array of Pod structs, no padding.
unsafe impl aya::Pod for NetStats {}

/// Name of the per-CPU hash map: (cgroup id, remote endpoint) → [`EndpointStats`].
pub const ENDPOINTS_MAP: &str = "ENDPOINTS";
/// Name of the hash map counting each cgroup's endpoints (`u64` cgroup id → `u64`), which
/// bounds them per worker (a `u64`: the BPF target's only atomic width).
pub const ENDPOINT_COUNTS_MAP: &str = "ENDPOINT_COUNTS";
/// Global: 1 when the socket programs keep per-endpoint figures (`--programs endpoints`).
pub const ENDPOINTS_ON_GLOBAL: &str = "ENDPOINTS_ON";
/// Global: most endpoints kept per worker; the rest go to its [`ENDPOINT_OTHER`] entry.
pub const ENDPOINTS_PER_WORKER_GLOBAL: &str = "ENDPOINTS_PER_WORKER";
/// Global: `offsetof(struct sock, __sk_common.skc_daddr)`.
pub const SOCK_DADDR_OFFSET_GLOBAL: &str = "SOCK_DADDR_OFFSET";
/// Global: `offsetof(struct sock, __sk_common.skc_dport)`.
pub const SOCK_DPORT_OFFSET_GLOBAL: &str = "SOCK_DPORT_OFFSET";
/// Global: `offsetof(struct sock, __sk_common.skc_v6_daddr)`.
pub const SOCK_V6_DADDR_OFFSET_GLOBAL: &str = "SOCK_V6_DADDR_OFFSET";

/// Default of `--max-endpoints-per-worker`.
pub const DEFAULT_ENDPOINTS_PER_WORKER: u32 = 64;
/// Default capacity of the endpoints map, all workers together.
pub const DEFAULT_MAX_ENDPOINTS: u32 = 65_536;

/// [`EndpointKey::family`] of a worker's entry for the endpoints beyond its bound.
pub const ENDPOINT_OTHER: u16 = 0xffff;

/// Name of the per-CPU hash map of process workers' endpoints: (pid, remote endpoint) →
/// [`EndpointStats`], kept apart from the cgroups' so that processes never crowd out
/// workers' entries; user space frees each process's at its end.
pub const PROCESS_ENDPOINTS_MAP: &str = "PROCESS_ENDPOINTS";
/// Name of the hash map counting each process's endpoints (`u64` pid → `u64`).
pub const PROCESS_ENDPOINT_COUNTS_MAP: &str = "PROCESS_ENDPOINT_COUNTS";

/// A worker's remote endpoint: the socket's peer as the kernel holds it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EndpointKey {
    /// cgroup v2 id of the worker (the process id in `PROCESS_ENDPOINTS`).
    pub cgroup_id: u64,
    /// Peer address: IPv4 in the first 4 bytes, IPv6 in all 16, zeros for unix sockets and
    /// unconnected ones.
    pub addr: [u8; 16],
    /// Peer port, host order (0 for unix and unconnected sockets).
    pub port: u16,
    /// Address family (`AF_INET`, `AF_INET6`, `AF_UNIX`, …), or [`ENDPOINT_OTHER`].
    pub family: u16,
    /// Keeps the size a multiple of 8 with no implicit padding.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<EndpointKey>() == 32);

/// What a worker did with one endpoint on one CPU. Counters only grow.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointStats {
    /// Payload bytes sent to it.
    pub sent_bytes: u64,
    /// Payload bytes received from it.
    pub received_bytes: u64,
    /// Successful send calls.
    pub sent_calls: u64,
    /// Successful receive calls.
    pub received_calls: u64,
    /// Nanoseconds the calls on its sockets slept before they returned.
    pub wait_ns: u64,
    /// Calls that slept.
    pub waits: u64,
}

const _: () = assert!(core::mem::size_of::<EndpointStats>() == 48);

#[cfg(feature = "user")]
// SAFETY: plain `#[repr(C)]` integers, explicit padding field, every bit pattern valid.
unsafe impl aya::Pod for EndpointKey {}
#[cfg(feature = "user")]
// SAFETY: plain `#[repr(C)]` integers, no padding.
unsafe impl aya::Pod for EndpointStats {}

/// Name of the per-CPU array of [`EndpointSlot`]s: the fast path for workers' endpoints, one
/// slot per (worker, peer), found through a slot number each socket keeps in its local
/// storage (an array update per call instead of a hash lookup). Endpoints beyond its slots
/// use [`ENDPOINTS_MAP`].
pub const ENDPOINT_SLOTS_MAP: &str = "ENDPOINT_SLOTS";
/// Name of the hash map: [`EndpointKey`] → its slot in [`ENDPOINT_SLOTS_MAP`] (`u64`).
pub const ENDPOINT_SLOT_OF_MAP: &str = "ENDPOINT_SLOT_OF";
/// Name of the stack of free endpoint slots (`u32`): the programs take one for a new
/// endpoint, user space gives it back when its worker's summary is taken.
pub const FREE_ENDPOINT_SLOTS_MAP: &str = "FREE_ENDPOINT_SLOTS";

/// Kernel memory the endpoint slot array may take, all CPUs together (allocated whole at load).
pub const ENDPOINT_SLOT_MEMORY_BYTES: usize = 4 << 20;
/// Most endpoint slots, whatever the memory allows: the loader fills the free-slot stack one
/// system call per slot (about 1.7 µs each here: 26,214 slots on 2 CPUs took 45 ms of the
/// start), and 8,192 is 128 workers with 64 peers each; more pairs use the hash.
pub const MOST_ENDPOINT_SLOTS: u32 = 8_192;

/// Slots of the endpoint slot array for `possible_cpus`: within
/// [`ENDPOINT_SLOT_MEMORY_BYTES`], at least 64, at most [`MOST_ENDPOINT_SLOTS`] and
/// `max_endpoints`.
pub fn fast_endpoint_slots(possible_cpus: usize, max_endpoints: u32) -> u32 {
    crate::slots_within(
        ENDPOINT_SLOT_MEMORY_BYTES,
        core::mem::size_of::<EndpointSlot>(),
        possible_cpus,
        max_endpoints.min(MOST_ENDPOINT_SLOTS),
    )
}

/// One slot of [`ENDPOINT_SLOTS_MAP`] on one CPU: whose counters these are, and the counters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EndpointSlot {
    /// The (worker, peer) that owns the slot on this CPU (all zeros: unused here). Written
    /// when the slot is first used on this CPU, zeroed with the counters when it is given back.
    pub key: EndpointKey,
    /// Its counters on this CPU.
    pub stats: EndpointStats,
}

const _: () = assert!(core::mem::size_of::<EndpointSlot>() == 80);

#[cfg(feature = "user")]
// SAFETY: two Pod structs, no padding between them.
unsafe impl aya::Pod for EndpointSlot {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_slots_fit_their_memory_within_their_bounds() {
        // 2 CPUs: the memory would allow 26,214; the fill's cost caps them.
        assert_eq!(fast_endpoint_slots(2, 65_536), MOST_ENDPOINT_SLOTS);
        // 64 CPUs: as many as 4 MiB holds.
        assert_eq!(
            fast_endpoint_slots(64, 65_536) as usize,
            ENDPOINT_SLOT_MEMORY_BYTES / (64 * 80)
        );
        assert_eq!(fast_endpoint_slots(4_096, 65_536), 64);
        assert_eq!(fast_endpoint_slots(2, 100), 100);
        assert_eq!(fast_endpoint_slots(0, 1_000), fast_endpoint_slots(1, 1_000));
    }
}
