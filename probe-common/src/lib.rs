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
pub mod task;
pub mod wait;

/// Default number of cgroups each per-cgroup map holds (changeable at load time).
pub const DEFAULT_MAX_WORKERS: u32 = 16_384;
pub mod lifecycle;
