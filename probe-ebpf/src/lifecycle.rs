//! `tp_btf/cgroup_mkdir` and `tp_btf/cgroup_rmdir`: tell user space of every cgroup2
//! directory made or removed, through a ring buffer, with the memory cgroup's peak at the
//! removal; `tp_btf/sched_process_exit` keeps the largest resident set of each worker's
//! exiting processes. Rare events: this is not a hot path.

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel_str_bytes},
    macros::{btf_tracepoint, map},
    maps::{PerCpuHashMap, RingBuf},
    programs::BtfTracePointContext,
};
use probe_common::{
    DEFAULT_MAX_WORKERS,
    drops::{DROP_EVENTS, DROP_PROCESS_PEAKS},
    lifecycle::{CGROUP_MADE, CGROUP_REMOVED, CgroupEvent, EVENTS_BYTES},
};

use crate::{
    sched::{BPF_F_NO_PREALLOC, count_drop},
    task,
};

/// Cgroups made and removed, oldest first.
#[map]
static CGROUP_EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

/// cgroup id → the largest `signal->maxrss` (pages) of its processes that exited on this CPU.
#[map]
static PROCESS_PEAKS: PerCpuHashMap<u64, u64> =
    PerCpuHashMap::with_max_entries(DEFAULT_MAX_WORKERS, BPF_F_NO_PREALLOC);

/// `sched_process_exit(struct task_struct *p, …)`: a thread is exiting. When it is its
/// process's last, the kernel has just put the process's final high-water mark in
/// `signal->maxrss`; an earlier thread's reading is no larger, so taking the largest is right
/// whichever thread ends last.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn process_exit(ctx: BtfTracePointContext) -> u32 {
    let exiting: task::Task = ctx.arg(0);
    let pages = task::max_rss_pages(exiting);
    if pages == 0 {
        return 0;
    }
    let cgroup_id = task::cgroup_id(exiting);
    if let Some(peak) = PROCESS_PEAKS.get_ptr_mut(cgroup_id) {
        // SAFETY: this CPU's value; no other writer while we run.
        unsafe { *peak = (*peak).max(pages) };
    } else if PROCESS_PEAKS.insert(cgroup_id, pages, 0).is_err() {
        count_drop(DROP_PROCESS_PEAKS);
    }
    0
}

/// `cgroup_mkdir(struct cgroup *cgrp, const char *path)`.
#[btf_tracepoint(function = "cgroup_mkdir")]
pub fn cgroup_mkdir(ctx: BtfTracePointContext) -> u32 {
    tell(&ctx, CGROUP_MADE);
    0
}

/// `cgroup_rmdir(struct cgroup *cgrp, const char *path)`.
#[btf_tracepoint(function = "cgroup_rmdir")]
pub fn cgroup_rmdir(ctx: BtfTracePointContext) -> u32 {
    tell(&ctx, CGROUP_REMOVED);
    0
}

#[inline(always)]
fn tell(ctx: &BtfTracePointContext, kind: u32) {
    let cgroup: task::Cgroup = ctx.arg(0);
    // v1 controllers' hierarchies fire these tracepoints too; workers are cgroup2 cgroups.
    if !task::is_cgroup2(cgroup) {
        return;
    }
    let path: *const u8 = ctx.arg(1);
    let Some(mut entry) = CGROUP_EVENTS.reserve::<CgroupEvent>(0) else {
        count_drop(DROP_EVENTS);
        return;
    };
    let event = entry.as_mut_ptr();
    // SAFETY: `event` points to a reserved, writable CgroupEvent in the ring buffer.
    unsafe {
        (*event).cgroup_id = task::id_of_cgroup(cgroup);
        (*event).at_ns = bpf_ktime_get_ns();
        // Read while the cgroup still has its memory controller: the kernel takes it offline
        // after this tracepoint, and `memory.peak` goes with the directory.
        (*event).memory_peak_pages = if kind == CGROUP_REMOVED {
            task::memory_peak_pages(cgroup)
        } else {
            0
        };
        // Its CPU times too, kept before the event is told so user space finds them.
        if kind == CGROUP_REMOVED && crate::rstat::on() {
            crate::rstat::keep_final(cgroup, (*event).cgroup_id);
        }
        (*event).kind = kind;
        let len = match bpf_probe_read_kernel_str_bytes(path, &mut (*event).path) {
            Ok(bytes) => bytes.len() as u32,
            Err(_) => 0,
        };
        (*event).path_len = len;
    }
    entry.submit(0);
}
