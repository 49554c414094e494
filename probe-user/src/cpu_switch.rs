//! Makes CPUs switch tasks, so the programs on `sched_switch` see where each CPU's running
//! slice began.
//!
//! The programs learn a CPU's running slice only at a switch; the loader makes every CPU
//! switch once at attach, and the collector makes a CPU switch when its last switch record
//! names a thread that is no longer running there (a switch the kernel hid from tracing).

/// Makes every online CPU switch once.
pub fn switch_every_online_cpu() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let online = aya::util::online_cpus().unwrap_or_else(|_| (0..cpus as u32).collect());
    switch_cpus(online.into_iter().map(|cpu| cpu as usize));
}

/// Makes each of `cpus` switch once: a short thread pinned to each forces it, and the
/// thread running there before comes back after it. A thread that cannot be made (a limit
/// on threads) leaves its CPU as it was: the next read tries again.
pub fn switch_cpus(cpus: impl IntoIterator<Item = usize>) {
    let threads: Vec<_> = cpus
        .into_iter()
        .filter_map(|cpu| {
            std::thread::Builder::new()
                .name("wp-switch".into())
                .spawn(move || visit(cpu))
                .ok()
        })
        .collect();
    for thread in threads {
        let _ = thread.join();
    }
}

/// Moves the calling thread to `cpu` (which switches that CPU to it), then yields it back.
fn visit(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays within its bounds for any CPU number
    // the kernel reports.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        libc::sched_yield();
    }
}
