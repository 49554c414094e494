//! Types shared by the eBPF programs (`probe-ebpf`) and the agent (`probe-user`).
//!
//! Every map value is `#[repr(C)]` with no implicit padding, so the kernel and user space agree
//! on its bytes; a `const` assertion keeps each size honest. With the `user` feature the values
//! implement `aya::Pod` so the agent can read them.
#![no_std]

pub mod cpu;
pub mod drops;
pub mod memory;
pub mod net;
pub mod process;
pub mod rstat;
pub mod task;
pub mod wait;

/// Default number of cgroups each per-cgroup map holds (changeable at load time).
pub const DEFAULT_MAX_WORKERS: u32 = 16_384;
pub mod lifecycle;

/// Slots of a per-CPU slot array whose slot takes `slot_bytes` on each of `possible_cpus`:
/// within `memory_bytes` over all CPUs (the array is allocated whole at load, so the slots
/// shrink as CPUs grow), at least 64, at most `most`.
pub fn slots_within(
    memory_bytes: usize,
    slot_bytes: usize,
    possible_cpus: usize,
    most: u32,
) -> u32 {
    let per_slot = slot_bytes * possible_cpus.max(1);
    let slots = (memory_bytes / per_slot).max(64);
    u32::try_from(slots).unwrap_or(u32::MAX).min(most.max(1))
}
