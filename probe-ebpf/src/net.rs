//! `tp_btf/sock_send_length` and `tp_btf/sock_recv_length`: socket payload per cgroup.
//!
//! Both tracepoints fire in the thread that made the call, after the protocol returned, with
//! `ret` = bytes moved or a negative errno. Payload bytes, so they match what the application
//! wrote and read, whatever the network namespace.

use aya_ebpf::{
    Global,
    helpers::bpf_get_current_task_btf,
    macros::{btf_tracepoint, map},
    maps::PerCpuHashMap,
    programs::BtfTracePointContext,
};
use probe_common::{
    DEFAULT_MAX_WORKERS,
    drops::DROP_NET_STATS,
    net::{MSG_PEEK, NetStats, family_slot},
};

use crate::{
    sched::{BPF_F_NO_PREALLOC, BPF_NOEXIST, count_drop},
    task,
};

/// cgroup id → its socket traffic on this CPU.
#[map]
static NET_STATS: PerCpuHashMap<u64, NetStats> =
    PerCpuHashMap::with_max_entries(DEFAULT_MAX_WORKERS, BPF_F_NO_PREALLOC);

/// `offsetof(struct sock, __sk_common.skc_family)`, set by the loader from the kernel's BTF.
#[unsafe(no_mangle)]
static SOCK_FAMILY_OFFSET: Global<u32> = Global::new(16);

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

#[inline(always)]
fn account(sock: *const u8, bytes: u64, sent: bool) {
    let offset = SOCK_FAMILY_OFFSET.load() as usize;
    // SAFETY: `sock` is the tracepoint's BTF-typed socket pointer; the verifier checks this
    // load against BTF (cheaper than bpf_probe_read_kernel).
    let family: u16 = unsafe { core::ptr::read_volatile(sock.add(offset) as *const u16) };
    let slot = family_slot(family);
    // SAFETY: the helper returns the current task, a BTF pointer.
    let cgroup_id = task::cgroup_id(unsafe { bpf_get_current_task_btf() } as task::Task);
    if let Some(stats) = NET_STATS.get_ptr_mut(cgroup_id) {
        // SAFETY: per-CPU value of this CPU; no other writer while we run.
        unsafe { add(&mut *stats, slot, bytes, sent) };
        return;
    }
    let mut first = NetStats::default();
    add(&mut first, slot, bytes, sent);
    if NET_STATS.insert(cgroup_id, first, BPF_NOEXIST).is_ok() {
        return;
    }
    if let Some(stats) = NET_STATS.get_ptr_mut(cgroup_id) {
        // SAFETY: as above.
        unsafe { add(&mut *stats, slot, bytes, sent) };
    } else {
        count_drop(DROP_NET_STATS);
    }
}

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
