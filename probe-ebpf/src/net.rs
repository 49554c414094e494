//! Socket payload per cgroup, in one of two variants the loader chooses from the kernel:
//!
//! - `tp_btf/sock_send_length` and `tp_btf/sock_recv_length` (Linux 6.3+): both fire in the
//!   thread that made the call, after the protocol returned, with `ret` = bytes moved or a
//!   negative errno.
//! - before 6.3, `fexit` on the IPv4, IPv6 and unix protocols' `sendmsg` and `recvmsg`, which
//!   every socket call of those families reaches (the tracepoints sit right after them).
//!   Other families (netlink, packet, vsock, …) are not counted by this variant.
//!
//! Before 6.5, sendfile and splice into a socket take the protocols' `sendpage` instead,
//! which neither reaches: where the kernel has it and allows fexit, `fexit` on TCP's, UDP's
//! and unix streams' `sendpage` is added to either variant.
//!
//! splice() from a TCP or unix stream socket reads through the protocols' `splice_read`,
//! which neither reaches either: where fexit is allowed, it is added to either variant.
//!
//! Payload bytes either way, so they match what the application wrote and read, whatever the
//! network namespace.

use aya_ebpf::{
    Global,
    helpers::{bpf_get_current_task_btf, generated::bpf_sk_storage_get},
    macros::{btf_map, btf_tracepoint, fexit, map},
    maps::{HashMap, PerCpuArray, PerCpuHashMap, Stack},
    programs::{BtfTracePointContext, FExitContext},
};
use probe_common::{
    DEFAULT_MAX_WORKERS,
    drops::{DROP_ENDPOINT_OVERFLOW, DROP_ENDPOINTS, DROP_NET_STATS},
    net::{
        AF_INET, AF_INET6, DEFAULT_ENDPOINTS_PER_WORKER, DEFAULT_MAX_ENDPOINTS, ENDPOINT_OTHER,
        EndpointKey, EndpointSlot, EndpointStats, MSG_PEEK, NetStats, family_slot,
    },
};

use crate::{
    local_storage::{LocalStorage, SK_STORAGE},
    sched::{BPF_F_NO_PREALLOC, BPF_NOEXIST, count_drop},
    task::{self, field},
};

/// cgroup id → its socket traffic on this CPU.
#[map]
static NET_STATS: PerCpuHashMap<u64, NetStats> =
    PerCpuHashMap::with_max_entries(DEFAULT_MAX_WORKERS, BPF_F_NO_PREALLOC);

/// (cgroup id, peer) → what the worker did with that peer on this CPU (`--programs
/// endpoints`).
#[map]
static ENDPOINTS: PerCpuHashMap<EndpointKey, EndpointStats> =
    PerCpuHashMap::with_max_entries(DEFAULT_MAX_ENDPOINTS, BPF_F_NO_PREALLOC);

/// The fast path of workers' endpoints: slot → the (worker, peer) that owns it on this CPU and
/// its counters there. Sized by the loader (`probe_common::net::fast_endpoint_slots`);
/// endpoints beyond it use `ENDPOINTS`.
#[map]
static ENDPOINT_SLOTS: PerCpuArray<EndpointSlot> = PerCpuArray::with_max_entries(1, 0);

/// (cgroup id, peer) → its slot in `ENDPOINT_SLOTS`.
#[map]
static ENDPOINT_SLOT_OF: HashMap<EndpointKey, u64> = HashMap::with_max_entries(1, 0);

/// Endpoint slots free to take, filled by the loader and refilled by user space as workers
/// end.
#[map]
static FREE_ENDPOINT_SLOTS: Stack<u32> = Stack::with_max_entries(1, 0);

/// What a socket remembers of its last call: the worker that made it and the slot of that
/// worker's entry for the socket's peer. A hint only: the slot's key says whose it is.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SockEndpoint {
    /// The cgroup of the call's thread.
    cgroup_id: u64,
    /// Its entry's slot in `ENDPOINT_SLOTS`, or `NO_ENDPOINT_SLOT`.
    slot: u32,
    /// Keeps the size a multiple of 8.
    reserved: u32,
}

/// Per-socket endpoint hint, freed with the socket.
#[btf_map]
static SOCK_ENDPOINT: LocalStorage<SockEndpoint, SK_STORAGE> = LocalStorage::new();

/// `SockEndpoint::slot` of a socket whose endpoint has no slot (its counters are in
/// `ENDPOINTS`): past the array's end, so no lookup succeeds.
const NO_ENDPOINT_SLOT: u32 = u32::MAX;

/// cgroup id → how many endpoints it has in `ENDPOINTS` and `ENDPOINT_SLOTS`, to bound them
/// per worker.
#[map]
static ENDPOINT_COUNTS: HashMap<u64, u64> =
    HashMap::with_max_entries(DEFAULT_MAX_WORKERS, BPF_F_NO_PREALLOC);

/// (pid, peer) → what the process did with that peer on this CPU (`--processes` with
/// endpoints); apart from the cgroups', so processes never crowd workers out.
#[map]
static PROCESS_ENDPOINTS: PerCpuHashMap<EndpointKey, EndpointStats> =
    PerCpuHashMap::with_max_entries(DEFAULT_MAX_ENDPOINTS, BPF_F_NO_PREALLOC);

/// pid → how many endpoints it has in `PROCESS_ENDPOINTS`.
#[map]
static PROCESS_ENDPOINT_COUNTS: HashMap<u64, u64> = HashMap::with_max_entries(
    probe_common::process::PROCESS_CPU_ENTRIES,
    BPF_F_NO_PREALLOC,
);

/// 1 when per-endpoint figures are kept; read-only, so the verifier drops the endpoint code
/// from the programs when it is 0.
#[unsafe(no_mangle)]
static ENDPOINTS_ON: Global<u32> = Global::new(0);
/// Endpoints kept per worker before the rest share its `other` entry.
#[unsafe(no_mangle)]
static ENDPOINTS_PER_WORKER: Global<u32> = Global::new(DEFAULT_ENDPOINTS_PER_WORKER);
/// `offsetof(struct sock, __sk_common.skc_daddr)`.
#[unsafe(no_mangle)]
static SOCK_DADDR_OFFSET: Global<u32> = Global::new(0);
/// `offsetof(struct sock, __sk_common.skc_dport)`.
#[unsafe(no_mangle)]
static SOCK_DPORT_OFFSET: Global<u32> = Global::new(0);
/// `offsetof(struct sock, __sk_common.skc_v6_daddr)`.
#[unsafe(no_mangle)]
static SOCK_V6_DADDR_OFFSET: Global<u32> = Global::new(0);

/// `offsetof(struct sock, __sk_common.skc_family)`, set by the loader from the kernel's BTF.
#[unsafe(no_mangle)]
static SOCK_FAMILY_OFFSET: Global<u32> = Global::new(16);

/// `offsetof(struct socket, sk)`, set by the loader from the kernel's BTF (fexit variant).
#[unsafe(no_mangle)]
static SOCKET_SK_OFFSET: Global<u32> = Global::new(24);

/// `sock_send_length(struct sock *sk, int ret, int flags)`.
#[btf_tracepoint(function = "sock_send_length")]
pub fn sock_send(ctx: BtfTracePointContext) -> u32 {
    let ret: i64 = ctx.arg::<u64>(1) as i32 as i64;
    if ret <= 0 {
        return 0;
    }
    account(ctx.arg(0), ret as u64, true);
    0
}

/// `sock_recv_length(struct sock *sk, int ret, int flags)`.
#[btf_tracepoint(function = "sock_recv_length")]
pub fn sock_recv(ctx: BtfTracePointContext) -> u32 {
    let ret: i64 = ctx.arg::<u64>(1) as i32 as i64;
    let flags = ctx.arg::<u64>(2) as i32;
    if ret <= 0 || flags & MSG_PEEK != 0 {
        return 0;
    }
    account(ctx.arg(0), ret as u64, false);
    0
}

/// fexit of a protocol's `sendmsg(struct socket *sock, struct msghdr *msg, size_t len)`: the
/// function `sock_sendmsg` calls through `sock->ops`, where the 6.3 tracepoint was later put.
/// (Not `sock_sendmsg` itself: its callers in net/socket.c get it inlined.)
macro_rules! sendmsg_exit {
    ($program:ident, $function:literal) => {
        #[doc = concat!("fexit of `", $function, "`.")]
        #[fexit(function = $function)]
        pub fn $program(ctx: FExitContext) -> u32 {
            let ret: i64 = ctx.arg::<u64>(3) as i32 as i64;
            if ret > 0 {
                account(sock_of(ctx.arg(0)), ret as u64, true);
            }
            0
        }
    };
}

/// fexit of a protocol's `recvmsg(struct socket *sock, struct msghdr *msg, size_t size, int
/// flags)`.
macro_rules! recvmsg_exit {
    ($program:ident, $function:literal) => {
        #[doc = concat!("fexit of `", $function, "`.")]
        #[fexit(function = $function)]
        pub fn $program(ctx: FExitContext) -> u32 {
            let flags = ctx.arg::<u64>(3) as i32;
            let ret: i64 = ctx.arg::<u64>(4) as i32 as i64;
            if ret > 0 && flags & MSG_PEEK == 0 {
                account(sock_of(ctx.arg(0)), ret as u64, false);
            }
            0
        }
    };
}

// Names fit the kernel's 15 characters, so bpftool and bpf_stats show them whole; every
// socket program starts with `sock_`.
sendmsg_exit!(sock_tx_inet, "inet_sendmsg");
sendmsg_exit!(sock_tx_inet6, "inet6_sendmsg");
sendmsg_exit!(sock_tx_ustream, "unix_stream_sendmsg");
sendmsg_exit!(sock_tx_udgram, "unix_dgram_sendmsg");
recvmsg_exit!(sock_rx_inet, "inet_recvmsg");
recvmsg_exit!(sock_rx_inet6, "inet6_recvmsg");
recvmsg_exit!(sock_rx_ustream, "unix_stream_recvmsg");

/// fexit of `int __unix_dgram_recvmsg(struct sock *sk, struct msghdr *msg, size_t size, int
/// flags)`: unix datagram and seqpacket receives (`unix_seqpacket_recvmsg` gets
/// `unix_dgram_recvmsg` inlined, so this is the one function both reach).
#[fexit(function = "__unix_dgram_recvmsg")]
pub fn sock_rx_udgram(ctx: FExitContext) -> u32 {
    let flags = ctx.arg::<u64>(3) as i32;
    let ret: i64 = ctx.arg::<u64>(4) as i32 as i64;
    if ret > 0 && flags & MSG_PEEK == 0 {
        account(ctx.arg(0), ret as u64, false);
    }
    0
}

/// fexit of `int tcp_sendpage(struct sock *sk, struct page *page, int offset, size_t size,
/// int flags)` (and `udp_sendpage`, the same shape): before 6.5, sendfile and splice into an
/// IPv4 or IPv6 socket reach the protocol here, past `sendmsg` and the 6.3 tracepoint. A
/// protocol without its own `sendpage` falls back to `sendmsg`, counted there instead.
macro_rules! sendpage_exit {
    ($program:ident, $function:literal) => {
        #[doc = concat!("fexit of `", $function, "`.")]
        #[fexit(function = $function)]
        pub fn $program(ctx: FExitContext) -> u32 {
            let ret: i64 = ctx.arg::<u64>(5) as i32 as i64;
            if ret > 0 {
                account(ctx.arg(0), ret as u64, true);
            }
            0
        }
    };
}

sendpage_exit!(sock_tx_tcppage, "tcp_sendpage");
sendpage_exit!(sock_tx_udppage, "udp_sendpage");

/// fexit of `ssize_t unix_stream_sendpage(struct socket *socket, struct page *page, int
/// offset, size_t size, int flags)`: sendfile into a unix stream socket before 6.5.
#[fexit(function = "unix_stream_sendpage")]
pub fn sock_tx_upage(ctx: FExitContext) -> u32 {
    let ret: i64 = ctx.arg::<u64>(5) as i64;
    if ret > 0 {
        account(sock_of(ctx.arg(0)), ret as u64, true);
    }
    0
}

/// fexit of `ssize_t tcp_splice_read(struct socket *sock, loff_t *ppos, struct
/// pipe_inode_info *pipe, size_t len, unsigned int flags)` (and `unix_stream_splice_read`, the
/// same shape): splice() from a socket into a pipe reads here, past `recvmsg` and the 6.3
/// tracepoint, so without these programs those bytes would count nowhere.
macro_rules! splice_read_exit {
    ($program:ident, $function:literal) => {
        #[doc = concat!("fexit of `", $function, "`.")]
        #[fexit(function = $function)]
        pub fn $program(ctx: FExitContext) -> u32 {
            let ret: i64 = ctx.arg::<u64>(5) as i64;
            if ret > 0 {
                account(sock_of(ctx.arg(0)), ret as u64, false);
            }
            0
        }
    };
}

splice_read_exit!(sock_rx_tsplice, "tcp_splice_read");
splice_read_exit!(sock_rx_usplice, "unix_stream_splice_read");

/// `sock->sk` of a BTF-typed `struct socket *`.
#[inline(always)]
fn sock_of(socket: *const u8) -> *const u8 {
    // SAFETY: `socket` is the traced function's BTF-typed argument; the verifier checks the
    // load against BTF and the result is again a BTF pointer.
    unsafe { field(socket, SOCKET_SK_OFFSET.load()) }
}

#[inline(always)]
fn account(sock: *const u8, bytes: u64, sent: bool) {
    let family = family_of(sock);
    // SAFETY: the helper returns the current task, a BTF pointer.
    let current = unsafe { bpf_get_current_task_btf() } as task::Task;
    let cgroup_id = task::cgroup_id(current);
    // The thread's state holds its cgroup's slot, its unclaimed network sleeps and, for
    // process workers, its own bytes.
    let mut state = task::state(current);
    if ENDPOINTS_ON.load() != 0 {
        let call = Call {
            sock,
            family,
            cgroup_id,
            bytes,
            sent,
        };
        account_endpoint(&call, state.as_deref_mut(), current);
    }
    let Some(state) = state else {
        add_hashed(cgroup_id, family_slot(family), bytes, sent);
        return;
    };
    if crate::process::on() {
        // The thread's own bytes, for its process's summary, and its process's so far, for
        // a running tree's.
        if sent {
            state.sent_bytes += bytes;
        } else {
            state.received_bytes += bytes;
        }
        crate::process::add_bytes(task::tgid(current), bytes, sent);
    }
    match crate::sched::task_slot(state, cgroup_id) {
        // SAFETY: this CPU's value; no other writer while we run.
        Some(slot) => unsafe { add(&mut (*slot).net, family_slot(family), bytes, sent) },
        None => add_hashed(cgroup_id, family_slot(family), bytes, sent),
    }
}

/// `sk->__sk_common.skc_family` of a BTF-typed `struct sock *`.
#[inline(always)]
fn family_of(sock: *const u8) -> u16 {
    // SAFETY: `sock` is the tracepoint's BTF-typed socket pointer; the verifier checks this
    // load against BTF (cheaper than bpf_probe_read_kernel).
    unsafe { field(sock, SOCK_FAMILY_OFFSET.load()) }
}

/// A call of a worker without a slot: its entry in `NET_STATS`, made if missing.
#[inline(never)]
fn add_hashed(cgroup_id: u64, family_slot: usize, bytes: u64, sent: bool) {
    if let Some(stats) = NET_STATS.get_ptr_mut(cgroup_id) {
        // SAFETY: per-CPU value of this CPU; no other writer while we run.
        unsafe { add(&mut *stats, family_slot, bytes, sent) };
        return;
    }
    crate::sched::mark_hash_used(probe_common::cpu::HASHED_NET);
    // Insert zeros from read-only memory, then add: values built on the stack count against
    // its 512 bytes (with the endpoint code's, too many on 6.1).
    #[allow(clippy::needless_borrows_for_generic_args)]
    let _ = NET_STATS.insert(cgroup_id, &ZERO_NET, BPF_NOEXIST);
    if let Some(stats) = NET_STATS.get_ptr_mut(cgroup_id) {
        // SAFETY: as above.
        unsafe { add(&mut *stats, family_slot, bytes, sent) };
    } else {
        count_drop(DROP_NET_STATS);
    }
}

/// One socket call that returned with bytes moved, and whose it was.
struct Call {
    sock: *const u8,
    family: u16,
    cgroup_id: u64,
    bytes: u64,
    sent: bool,
}

/// Adds a call to the worker's entry for the socket's peer, with the network sleeps of the
/// call that just returned (claimed from the thread's state), and, for process workers, to
/// the process's entry for that peer too.
#[inline(always)]
fn account_endpoint(call: &Call, mut state: Option<&mut task::TaskState>, current: task::Task) {
    let (wait_ns, waits) = state
        .as_deref_mut()
        .map_or((0, 0), |state| claim_network_wait(state, current));
    let added = EndpointCall {
        bytes: call.bytes,
        sent: call.sent,
        wait_ns,
        waits,
    };
    let mut key = peer_key(call.sock, call.family, call.cgroup_id);
    let slot = match state {
        Some(state) => thread_endpoint_slot(call, &key, state),
        None => endpoint_slot(call, &key).map(|(_, slot)| slot),
    };
    match slot {
        // SAFETY: this CPU's value; no other writer while we run.
        Some(slot) => add_call(unsafe { &mut (*slot).stats }, &added),
        None => add_to_endpoint::<false>(&mut key, &added),
    }
    if crate::process::on() {
        let mut key = peer_key(call.sock, call.family, u64::from(task::tgid(current)));
        add_to_endpoint::<true>(&mut key, &added);
    }
}

/// The slot of the worker's entry for the socket's peer on this CPU, tried first where the
/// thread's last call went: a thread mostly calls one peer in a row, and its state is at hand
/// already (the socket's storage is a helper call and three loads more). The thread remembers
/// the slot found.
#[inline(always)]
fn thread_endpoint_slot(
    call: &Call,
    key: &EndpointKey,
    state: &mut task::TaskState,
) -> Option<*mut EndpointSlot> {
    if let Some(slot) = ENDPOINT_SLOTS.get_ptr_mut(state.endpoint_slot)
        && holds(slot, key)
    {
        return Some(slot);
    }
    let (index, slot) = endpoint_slot(call, key)?;
    state.endpoint_slot = index;
    Some(slot)
}

/// The slot of the worker's entry for the socket's peer on this CPU, and its index: an array
/// access when the socket knows it, else found or taken on the rare path; `None` when the
/// entry has no slot (none was free, or the worker is past its bound) and is in `ENDPOINTS`.
#[inline(always)]
fn endpoint_slot(call: &Call, key: &EndpointKey) -> Option<(u32, *mut EndpointSlot)> {
    // SAFETY: the map is our socket storage; the helper takes a BTF socket pointer (or
    // returns null for one that is not a full socket).
    let hint = unsafe {
        bpf_sk_storage_get(
            SOCK_ENDPOINT.as_ptr(),
            call.sock as *mut _,
            core::ptr::null_mut(),
            SK_STORAGE_F_CREATE,
        )
    } as *mut SockEndpoint;
    // SAFETY: the kernel returns this socket's value or null.
    let hint = unsafe { hint.as_mut() }?;
    if hint.cgroup_id == call.cgroup_id {
        // `NO_ENDPOINT_SLOT` is past the array's end: the entry is in the hash.
        let slot = ENDPOINT_SLOTS.get_ptr_mut(hint.slot)?;
        if holds(slot, key) {
            return Some((hint.slot, slot));
        }
    }
    find_endpoint_slot(hint, key).map(|slot| (hint.slot, slot))
}

/// Whether a slot on this CPU holds `key`'s counters: its key says whose they are. A slot
/// given back and taken by another endpoint (or a socket connected anew) no longer names the
/// one a thread or socket remembers.
#[inline(always)]
fn holds(slot: *mut EndpointSlot, key: &EndpointKey) -> bool {
    // SAFETY: this CPU's value of `ENDPOINT_SLOTS`; no other writer while we run.
    unsafe { (*slot).key == *key }
}

/// `BPF_SK_STORAGE_GET_F_CREATE`.
const SK_STORAGE_F_CREATE: u64 = 1;

/// Rare path of `endpoint_slot`: the entry's slot, taken now if it has none and one is free;
/// the socket remembers either answer.
#[inline(never)]
fn find_endpoint_slot(hint: &mut SockEndpoint, key: &EndpointKey) -> Option<*mut EndpointSlot> {
    hint.cgroup_id = key.cgroup_id;
    hint.slot = NO_ENDPOINT_SLOT;
    // SAFETY: a plain hash value, read whole.
    let slot = match unsafe { ENDPOINT_SLOT_OF.get(key) } {
        Some(&slot) => slot as u32,
        None => take_endpoint_slot(key)?,
    };
    let counters = ENDPOINT_SLOTS.get_ptr_mut(slot)?;
    hint.slot = slot;
    // SAFETY: this CPU's value; no other writer while we run.
    unsafe {
        if (*counters).key != *key {
            // The slot's first use on this CPU by this endpoint: from zero, whatever a late
            // write of its last owner left after user space zeroed it.
            crate::zero::zero(counters);
            (*counters).key = *key;
        }
    }
    Some(counters)
}

/// Takes a free slot for a new endpoint of a worker within its bound; if another CPU just
/// gave it one, that one. `None` leaves the call to `ENDPOINTS` (which also counts a call
/// past the bound to the worker's `other` entry).
#[inline(always)]
fn take_endpoint_slot(key: &EndpointKey) -> Option<u32> {
    let count = endpoint_count(&ENDPOINT_COUNTS, key.cgroup_id)?;
    // SAFETY: a shared value; racing CPUs may let a worker pass its bound by one or two.
    if unsafe { core::ptr::read_volatile(count) } >= u64::from(ENDPOINTS_PER_WORKER.load()) {
        return None;
    }
    let (slot, taken) = crate::sched::take_free_slot(&FREE_ENDPOINT_SLOTS, &ENDPOINT_SLOT_OF, key)?;
    if taken {
        // SAFETY: as above (not atomic: see `first_use`).
        unsafe { *count += 1 };
    }
    Some(slot)
}

/// The owner's count of endpoints, made (zero) if missing.
#[inline(always)]
fn endpoint_count(counts: &HashMap<u64, u64>, owner_id: u64) -> Option<*mut u64> {
    if counts.get_ptr_mut(owner_id).is_none() {
        let _ = counts.insert(owner_id, 0u64, BPF_NOEXIST);
    }
    counts.get_ptr_mut(owner_id)
}

/// What one socket call adds to an endpoint's entry.
struct EndpointCall {
    bytes: u64,
    sent: bool,
    wait_ns: u64,
    waits: u64,
}

/// The key of the socket's peer in the entries of `owner_id` (a cgroup id, or a pid).
#[inline(always)]
fn peer_key(sock: *const u8, family: u16, owner_id: u64) -> EndpointKey {
    // The address is read a 32-bit word at a time: a volatile read of a byte array compiles
    // to one load per byte, each spilled to the stack (about 40 instructions per call).
    let mut words = [0u32; 4];
    let mut port = 0;
    // SAFETY: BTF-checked loads from the socket pointer at offsets from BTF.
    unsafe {
        if family == AF_INET {
            words[0] = field::<u32>(sock, SOCK_DADDR_OFFSET.load());
        } else if family == AF_INET6 {
            let offset = SOCK_V6_DADDR_OFFSET.load();
            words = [
                field::<u32>(sock, offset),
                field::<u32>(sock, offset + 4),
                field::<u32>(sock, offset + 8),
                field::<u32>(sock, offset + 12),
            ];
        }
        if family == AF_INET || family == AF_INET6 {
            port = u16::from_be(field(sock, SOCK_DPORT_OFFSET.load()));
        }
    }
    EndpointKey {
        cgroup_id: owner_id,
        // The words hold the address's bytes in network order as the kernel keeps them.
        // SAFETY: four u32 are sixteen bytes, any bit pattern valid.
        addr: unsafe { core::mem::transmute::<[u32; 4], [u8; 16]>(words) },
        port,
        family,
        reserved: 0,
    }
}

/// The endpoint map of workers, or with `PROCESS` of processes.
#[inline(always)]
fn endpoints<const PROCESS: bool>() -> &'static PerCpuHashMap<EndpointKey, EndpointStats> {
    if PROCESS {
        &PROCESS_ENDPOINTS
    } else {
        &ENDPOINTS
    }
}

/// Adds a call to the entry of `key` (made on first use, within its owner's bound), in the
/// workers' map or with `PROCESS` the processes'.
#[inline(never)]
fn add_to_endpoint<const PROCESS: bool>(key: &mut EndpointKey, call: &EndpointCall) {
    let stats = match endpoints::<PROCESS>().get_ptr_mut(*key) {
        Some(stats) => stats,
        None => match first_use::<PROCESS>(key) {
            Some(stats) => stats,
            None => {
                count_drop(DROP_ENDPOINTS);
                return;
            }
        },
    };
    // SAFETY: per-CPU value of this CPU; no other writer while we run.
    add_call(unsafe { &mut *stats }, call);
}

/// Adds a call to an endpoint's counters.
#[inline(always)]
fn add_call(stats: &mut EndpointStats, call: &EndpointCall) {
    if call.sent {
        stats.sent_bytes += call.bytes;
        stats.sent_calls += 1;
    } else {
        stats.received_bytes += call.bytes;
        stats.received_calls += 1;
    }
    stats.wait_ns += call.wait_ns;
    stats.waits += call.waits;
}

/// The network sleeps of the system call the current thread is returning from.
#[inline(always)]
fn claim_network_wait(state: &mut task::TaskState, current: task::Task) -> (u64, u64) {
    if state.unclaimed_net_waits == 0 {
        return (0, 0);
    }
    let same_call = task::syscall(current).is_some_and(|(nr, _)| nr == state.unclaimed_syscall);
    let claimed = (state.unclaimed_net_wait_ns, state.unclaimed_net_waits);
    // Two stores: written plainly, LLVM merges them into a call of a `memset` subprogram.
    // SAFETY: fields of the thread's own state.
    unsafe {
        core::ptr::write_volatile(&mut state.unclaimed_net_wait_ns, 0);
        core::ptr::write_volatile(&mut state.unclaimed_net_waits, 0);
    }
    if same_call { claimed } else { (0, 0) }
}

/// Rare path: a worker's (or with `PROCESS` a process's) first call with a peer since load.
/// Counts its endpoints; past its bound the call goes to its `other` entry instead.
#[inline(never)]
fn first_use<const PROCESS: bool>(key: &mut EndpointKey) -> Option<*mut EndpointStats> {
    let owner_id = key.cgroup_id;
    let counts = if PROCESS {
        &PROCESS_ENDPOINT_COUNTS
    } else {
        &ENDPOINT_COUNTS
    };
    let count = endpoint_count(counts, owner_id)?;
    // SAFETY: a shared value; racing CPUs may let a worker pass its bound by one or two.
    if unsafe { core::ptr::read_volatile(count) } >= u64::from(ENDPOINTS_PER_WORKER.load()) {
        // Every call beyond the bound is counted, and charged to the worker's `other` peer.
        count_drop(DROP_ENDPOINT_OVERFLOW);
        const { assert!(core::mem::offset_of!(EndpointKey, addr).is_multiple_of(8)) };
        // SAFETY: a valid `&mut`, 8-byte aligned in an 8-byte aligned key (asserted above).
        unsafe { crate::zero::zero(&mut key.addr) };
        key.port = 0;
        key.family = ENDPOINT_OTHER;
        if let Some(stats) = endpoints::<PROCESS>().get_ptr_mut(*key) {
            return Some(stats);
        }
    } else {
        // SAFETY: as above. Not atomic (the BPF target has no fetch-add in Rust): two CPUs
        // counting a new peer at once may count it once, letting one more in.
        unsafe { *count += 1 };
    }
    // By reference: no copy on the stack.
    #[allow(clippy::needless_borrows_for_generic_args)]
    let _ = endpoints::<PROCESS>().insert(&*key, &ZERO_ENDPOINT, BPF_NOEXIST);
    endpoints::<PROCESS>().get_ptr_mut(*key)
}

/// All-zero socket counters (a new worker's entry, and part of a zeroed slot).
pub(crate) static ZERO_NET: NetStats = NetStats {
    families: [probe_common::net::FamilyCounters {
        sent_bytes: 0,
        sent_calls: 0,
        received_bytes: 0,
        received_calls: 0,
    }; probe_common::net::FAMILY_COUNT],
};

static ZERO_ENDPOINT: EndpointStats = EndpointStats {
    sent_bytes: 0,
    received_bytes: 0,
    sent_calls: 0,
    received_calls: 0,
    wait_ns: 0,
    waits: 0,
};

#[inline(always)]
fn add(stats: &mut NetStats, slot: usize, bytes: u64, sent: bool) {
    // The verifier needs the bound spelled out.
    let Some(family) = stats.families.get_mut(slot) else {
        return;
    };
    if sent {
        family.sent_bytes += bytes;
        family.sent_calls += 1;
    } else {
        family.received_bytes += bytes;
        family.received_calls += 1;
    }
}
