//! `tp_btf/cgroup_mkdir` and `tp_btf/cgroup_rmdir`: tell user space of every cgroup2
//! directory made or removed, through a ring buffer. Rare events: this is not a hot path.

use aya_ebpf::{
    helpers::{bpf_ktime_get_ns, bpf_probe_read_kernel_str_bytes},
    macros::{btf_tracepoint, map},
    maps::RingBuf,
    programs::BtfTracePointContext,
};
use probe_common::{
    drops::DROP_EVENTS,
    lifecycle::{CGROUP_MADE, CGROUP_REMOVED, CgroupEvent, EVENTS_BYTES},
};

use crate::{sched::count_drop, task};

/// Cgroups made and removed, oldest first.
#[map]
static CGROUP_EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

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
        (*event).kind = kind;
        let len = match bpf_probe_read_kernel_str_bytes(path, &mut (*event).path) {
            Ok(bytes) => bytes.len() as u32,
            Err(_) => 0,
        };
        (*event).path_len = len;
    }
    entry.submit(0);
}
