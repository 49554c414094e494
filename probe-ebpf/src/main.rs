//! workerprobe's kernel side: per-cgroup CPU time and socket bytes.
//!
//! Every program adds to per-CPU counters keyed by the cgroup v2 id of the current task;
//! user space sums the CPUs and takes deltas. Nothing here resets a counter.
//!
//! Built for `bpfel-unknown-none` by probe-user's build.rs. On the host it compiles to an empty
//! binary so `cargo clippy --workspace` checks this code too.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

mod bounds;
mod lifecycle;
mod local_storage;
mod net;
mod process;
mod rstat;
mod sched;
mod task;
mod zero;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: eBPF programs cannot panic; the verifier rejects any path that reaches here.
    unsafe { core::hint::unreachable_unchecked() }
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
