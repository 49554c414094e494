//! On-CPU time per cgroup against the kernel's own `cpu.stat`.

use workerprobe::collect::Source as _;
use workerprobe_tests::{
    TestCgroup, collector, collector_with, counters, read_first_json_line, settled_sample,
    wait_for_cpu,
};

/// Longest a test waits for a workload's CPU time (emulated VMs are slow).
const LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Relative difference of `ours` from `kernel`.
fn error(ours: u64, kernel: u64) -> f64 {
    (ours as f64 - kernel as f64).abs() / kernel as f64
}

#[test]
fn cpu_time_matches_cpu_stat_per_cgroup() {
    let mut collector = collector();
    let a = TestCgroup::new("cpu-a");
    let b = TestCgroup::new("cpu-b");
    let before = collector.sample().expect("sample");
    let (a_before, b_before) = (a.cpu_stat(), b.cpu_stat());

    let one_thread = a.spawn_workload(&["spin", "1000", "1"]);
    let two_threads = b.spawn_workload(&["spin", "1000", "2"]);
    assert!(
        one_thread
            .wait_with_output()
            .expect("wait")
            .status
            .success()
    );
    assert!(
        two_threads
            .wait_with_output()
            .expect("wait")
            .status
            .success()
    );

    let after = collector.sample().expect("sample");
    let a_kernel_ns = (a.cpu_stat().usage_usec - a_before.usage_usec) * 1_000;
    let b_kernel_ns = (b.cpu_stat().usage_usec - b_before.usage_usec) * 1_000;
    let a_ours = counters(&after, a.id).on_cpu_ns() - counters(&before, a.id).on_cpu_ns();
    let b_ours = counters(&after, b.id).on_cpu_ns() - counters(&before, b.id).on_cpu_ns();
    eprintln!(
        "A: ours {a_ours} ns, cpu.stat {a_kernel_ns} ns; B: ours {b_ours} ns, cpu.stat {b_kernel_ns} ns"
    );

    // The work is real: each thread spins one second of its own CPU time.
    assert!(a_kernel_ns >= 990_000_000, "A barely ran: {a_kernel_ns} ns");
    assert!(
        b_kernel_ns > a_kernel_ns,
        "B's two threads ran less than A's one"
    );
    assert!(error(a_ours, a_kernel_ns) < 0.01, "A off by more than 1%");
    assert!(error(b_ours, b_kernel_ns) < 0.01, "B off by more than 1%");
}

#[test]
fn per_cpu_values_sum_to_total_and_workers_do_not_mix() {
    let mut collector = collector();
    let busy = TestCgroup::new("mix-busy");
    let idle = TestCgroup::new("mix-idle");
    let before = collector.sample().expect("sample");
    let spinner = busy.spawn_workload(&["spin", "300", "2"]);
    let napper = idle.spawn_workload(&["nap", "3", "100"]);
    assert!(spinner.wait_with_output().expect("wait").status.success());
    assert!(napper.wait_with_output().expect("wait").status.success());
    // Each reaped process's last slice is charged at its last switch, which may come after the
    // reap (6.1 in a TCG VM was 3.4 ms short of the napper's cpu.stat without waiting for it).
    settled_sample(&mut collector, busy.id);
    let after = settled_sample(&mut collector, idle.id);

    let interval = workerprobe::model::diff(Some(&before), &after);
    let busy_stats = interval
        .workers
        .iter()
        .find(|w| w.cgroup_id == busy.id)
        .expect("busy worker seen");
    let per_cpu_sum: u64 = busy_stats.cpu_ns_per_cpu.iter().sum();
    assert_eq!(per_cpu_sum, busy_stats.cpu_ns());
    assert_eq!(busy_stats.cpu_ns_per_cpu.len(), aya_cpus());

    let idle_stats = interval
        .workers
        .iter()
        .find(|w| w.cgroup_id == idle.id)
        .expect("idle worker seen");
    // Nothing of the spinner's time leaks into the napper: each matches its own cpu.stat.
    let idle_kernel_ns = idle.cpu_stat().usage_usec * 1_000;
    let busy_kernel_ns = busy.cpu_stat().usage_usec * 1_000;
    assert!(
        (idle_stats.cpu_ns() as f64 - idle_kernel_ns as f64).abs() < 2_000_000.0,
        "napper charged {} ns, its cpu.stat {idle_kernel_ns} ns",
        idle_stats.cpu_ns()
    );
    assert!(
        error(busy_stats.cpu_ns(), busy_kernel_ns) < 0.01,
        "spinner charged {} ns, its cpu.stat {busy_kernel_ns} ns",
        busy_stats.cpu_ns()
    );
    // Three naps of 100 ms: 3 voluntary switches at least, and little CPU beside 2 × 300 ms.
    assert!(idle_stats.voluntary_switches >= 3);
    assert!(
        idle_stats.cpu_ns() * 4 < busy_stats.cpu_ns(),
        "napper charged {} ns",
        idle_stats.cpu_ns()
    );
}

fn aya_cpus() -> usize {
    let possible =
        std::fs::read_to_string("/sys/devices/system/cpu/possible").expect("possible cpus");
    let last = possible
        .trim()
        .rsplit(['-', ','])
        .next()
        .expect("cpu range");
    last.parse::<usize>().expect("cpu number") + 1
}

#[test]
fn a_thread_that_never_leaves_its_cpu_is_counted_while_it_runs() {
    let spinner = TestCgroup::new("cpu-live");
    // Spins until killed.
    let mut child = spinner.spawn_workload(&["spin", "3600000", "1"]);
    // Attach while the spinner already runs: its slice began before the programs existed.
    let start = spinner.cpu_stat().usage_usec;
    wait_for_cpu(&spinner, start, 100_000_000, LIMIT);
    let mut collector = collector();
    // The spinner runs while we read: each sample is bracketed by two cpu.stat reads, and
    // the kernel's figure at the sample is their mean, within half their gap (wide on a slow
    // or emulated machine).
    let bracket = |collector: &mut workerprobe::collect::KernelCollector| {
        let first = spinner.cpu_stat().usage_usec * 1_000;
        let sample = collector.sample().expect("sample");
        let last = spinner.cpu_stat().usage_usec * 1_000;
        (sample, (first + last) / 2, (last - first) / 2)
    };
    let (before, kernel_before, slack_before) = bracket(&mut collector);
    // A window of 1 s of the spinner's CPU time, read five times on the way: each read is a
    // chance to meet a CPU whose last switch the kernel did not report (this host's 6.18
    // hides some of its own threads' switches), which the spinner's slice must survive.
    let mut readings = Vec::new();
    for step in 1..=5u64 {
        wait_for_cpu(&spinner, kernel_before / 1_000, step * 200_000_000, LIMIT);
        let (after, kernel_after, slack_after) = bracket(&mut collector);
        let ours =
            counters(&after, spinner.id).on_cpu_ns() - counters(&before, spinner.id).on_cpu_ns();
        readings.push((
            ours,
            kernel_after - kernel_before,
            slack_before + slack_after,
            counters(&after, spinner.id).on_cpu_ns_per_cpu,
            after.drops.by_map,
        ));
    }
    let _ = child.kill();
    let _ = child.wait();
    for (ours, kernel, slack, per_cpu, drops) in &readings {
        eprintln!(
            "live spinner: ours {ours} ns, cpu.stat {kernel} ns (± {slack} ns from the reads' \
             gaps); ours per CPU {per_cpu:?} (before {:?}); drops {drops:?}",
            counters(&before, spinner.id).on_cpu_ns_per_cpu,
        );
    }
    let (_, last_kernel, ..) = readings.last().expect("five readings");
    assert!(
        *last_kernel >= 1_000_000_000,
        "the spinner barely ran: {last_kernel} ns"
    );
    for (ours, kernel, slack, ..) in readings {
        // cpu.stat also lags a running thread by up to a scheduler tick (4 ms at HZ=250, as
        // Debian builds) at each end.
        let tolerance = kernel / 100 + slack + 8_000_000;
        assert!(
            ours.abs_diff(kernel) <= tolerance,
            "live spinner off by more than 1% + the reads' gaps: ours {ours}, kernel {kernel}"
        );
    }
}

/// User and system time: the kernel's tick-sampled split of the same slices, scaled to
/// their total, so user + system = CPU; against the process's own rusage and its cgroup's
/// cpu.stat (both the kernel's adjusted split too).
#[test]
fn user_and_system_add_up_and_match_rusage_and_cpu_stat() {
    let mut collector = collector();
    let worker = TestCgroup::new("cpu-mix");
    let before = collector.sample().expect("sample");
    let rusage = workerprobe_tests::wait_json(worker.spawn_workload(&["cpu-mix", "1200"]));
    let after = collector.sample().expect("sample");
    let kernel = worker.cpu_stat();
    let stats = workerprobe::model::diff(Some(&before), &after)
        .workers
        .into_iter()
        .find(|w| w.cgroup_id == worker.id)
        .expect("worker seen");
    let (user, system) = (
        stats.cpu_user_ns.expect("user"),
        stats.cpu_system_ns.expect("system"),
    );
    let (utime, stime) = (
        workerprobe_tests::field(&rusage, "utime_ns"),
        workerprobe_tests::field(&rusage, "stime_ns"),
    );
    eprintln!(
        "ours user {user} system {system} (cpu {}); rusage user {utime} system {stime}; cpu.stat user {} system {} usage {}",
        stats.cpu_ns(),
        kernel.user_usec * 1_000,
        kernel.system_usec * 1_000,
        kernel.usage_usec * 1_000
    );
    assert_eq!(
        user + system,
        stats.cpu_ns(),
        "user + system is the CPU time"
    );
    // Both halves are real: the workload spent about half of its time in each mode.
    assert!(user > stats.cpu_ns() / 5 && system > stats.cpu_ns() / 5);
    // The same split as the kernel's own, within a few ticks (the process's rusage is taken
    // just before it exits; cpu.stat also holds exec's start-up).
    let tolerance = stats.cpu_ns() / 50 + 20_000_000;
    for (what, ours, theirs) in [
        ("rusage user", user, utime),
        ("rusage system", system, stime),
        ("cpu.stat user", user, kernel.user_usec * 1_000),
        ("cpu.stat system", system, kernel.system_usec * 1_000),
    ] {
        assert!(
            ours.abs_diff(theirs) <= tolerance,
            "{what}: ours {ours} ns, the kernel's {theirs} ns"
        );
    }
}

/// Moves a process (all its threads) into `to`, as a container runtime or systemd does.
fn move_process(pid: u32, to: &TestCgroup) {
    std::fs::write(to.dir.join("cgroup.procs"), pid.to_string())
        .unwrap_or_else(|err| panic!("move {pid} into {}: {err}", to.dir.display()));
}

#[test]
fn a_thread_moved_while_it_runs_is_charged_to_each_cgroup_as_its_cpu_stat_says() {
    let mut collector = collector();
    let a = TestCgroup::new("moved-from");
    let b = TestCgroup::new("moved-to");
    // The spinning thread is not the process's leader, the one thread the kernel names at a
    // move: the others learn of it from their process's move.
    let mut spinner = a.spawn_workload(&["spin", "1000", "1", "asleep"]);
    // Counted from when it sleeps in `a`: its move there at its start (between fork and exec)
    // is charged as the one below, the kernel's part from its last update before the move, a
    // span emulation can stretch past a tick (COW faults after a fork run 10 ms and more).
    read_first_json_line(&mut spinner);
    wait_until_asleep(spinner.id());
    let before = collector.sample().expect("sample");
    let (a_before, b_before) = (a.cpu_stat(), b.cpu_stat());
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(spinner.id() as i32, libc::SIGUSR1) };
    // Moved mid-slice: a spinner beside an idle test keeps its CPU for long stretches, so
    // without accounting at the move, the stretch before it went to the cgroup it ran in at
    // its next switch (307 ms of 423 in a 6.1 VM).
    wait_for_cpu(&a, a_before.usage_usec, 400_000_000, LIMIT);
    move_process(spinner.id(), &b);
    assert!(spinner.wait().expect("wait").success());
    let after = workerprobe_tests::settled_sample(&mut collector, b.id);

    let a_kernel_ns = (a.cpu_stat().usage_usec - a_before.usage_usec) * 1_000;
    let b_kernel_ns = (b.cpu_stat().usage_usec - b_before.usage_usec) * 1_000;
    let a_ours = counters(&after, a.id).on_cpu_ns() - counters(&before, a.id).on_cpu_ns();
    let b_ours = counters(&after, b.id).on_cpu_ns() - counters(&before, b.id).on_cpu_ns();
    eprintln!(
        "moved spinner: before the move ours {a_ours} ns, cpu.stat {a_kernel_ns} ns; after ours {b_ours} ns, cpu.stat {b_kernel_ns} ns; drops {:?}",
        after.drops.by_map,
    );
    assert!(a_kernel_ns >= 400_000_000, "it barely ran before the move");
    assert!(b_kernel_ns >= 200_000_000, "it barely ran after the move");
    // The kernel charges a cgroup what the scheduler accounted while the thread was in it,
    // so the two split the slice at the scheduler's last update before the move (a tick
    // apart at most) and at the move itself.
    let close = |ours: u64, kernel: u64| ours.abs_diff(kernel) <= 10_000_000 + kernel / 100;
    assert!(
        close(a_ours, a_kernel_ns),
        "before the move: ours {a_ours} ns, cpu.stat {a_kernel_ns} ns"
    );
    assert!(
        close(b_ours, b_kernel_ns),
        "after the move: ours {b_ours} ns, cpu.stat {b_kernel_ns} ns"
    );
}

/// Two spinning threads of one process share one CPU, and the process goes from `a` to `b`
/// while they run, twenty times (it is brought back while stopped). Where the cpu controller
/// is on, the kernel reschedules a moved thread that is running, so the other thread often
/// takes the CPU before the move's tracepoint has fired (it fires once the whole move is
/// done): that switch-out sees the new cgroup with no move noted yet. The slice it ends ran in
/// the cgroup it left (`cpu.stat` charges the new one from the scheduler's last update before
/// the move, a tick earlier at most), and moves in one direction only show which way any part
/// of it went.
#[test]
fn threads_sharing_a_cpu_moved_while_they_run_are_charged_as_cpu_stat_says() {
    let mut collector = collector();
    let a = TestCgroup::new("bounced-a");
    let b = TestCgroup::new("bounced-b");
    let before = collector.sample().expect("sample");
    let (a_before, b_before) = (a.cpu_stat(), b.cpu_stat());
    let cpu = (aya_cpus() - 1).to_string();
    let mut spinners = a.spawn_workload(&["pinned-spin", "1500", "2", &cpu]);
    let pid = spinners.id();
    const MOVES: usize = 20;
    for _ in 0..MOVES {
        // Each stay is long enough for several of the scheduler's slices.
        wait_for_cpu(&a, a.cpu_stat().usage_usec, 20_000_000, LIMIT);
        move_process(pid, &b);
        wait_for_cpu(&b, b.cpu_stat().usage_usec, 20_000_000, LIMIT);
        // Back while stopped: no thread is on a CPU at that move.
        signal(pid, libc::SIGSTOP);
        while !all_threads_stopped(pid) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        move_process(pid, &a);
        signal(pid, libc::SIGCONT);
    }
    assert!(spinners.wait().expect("wait").success());
    settled_sample(&mut collector, a.id);
    let after = settled_sample(&mut collector, b.id);

    let a_kernel_ns = (a.cpu_stat().usage_usec - a_before.usage_usec) * 1_000;
    let b_kernel_ns = (b.cpu_stat().usage_usec - b_before.usage_usec) * 1_000;
    let a_ours = counters(&after, a.id).on_cpu_ns() - counters(&before, a.id).on_cpu_ns();
    let b_ours = counters(&after, b.id).on_cpu_ns() - counters(&before, b.id).on_cpu_ns();
    eprintln!(
        "spinners moved {MOVES} times while running: a ours {a_ours} ns, cpu.stat {a_kernel_ns} ns; b ours {b_ours} ns, cpu.stat {b_kernel_ns} ns"
    );
    assert!(
        b_kernel_ns >= MOVES as u64 * 20_000_000,
        "the spinners barely ran after the moves"
    );
    // The kernel charges the cgroup entered from its last update of the running thread
    // before the move (the last tick at most: 10 ms where HZ is 100, Linux's longest tick),
    // we from the move. So per move `a` may be ours by up to a tick more, never less, and `b`
    // less, never more; nothing is lost between them. Charging a slice that ended while its
    // move was under way to `b` made `b` 70 ms more than cpu.stat in a 6.1 VM.
    const TICK_NS_AT_MOST: u64 = 10_000_000;
    let margin = |kernel: u64| 10_000_000 + kernel / 100;
    let ticks = MOVES as u64 * TICK_NS_AT_MOST;
    assert!(
        a_ours + margin(a_kernel_ns) >= a_kernel_ns
            && a_ours <= a_kernel_ns + ticks + margin(a_kernel_ns),
        "a: ours {a_ours} ns, cpu.stat {a_kernel_ns} ns"
    );
    assert!(
        b_ours <= b_kernel_ns + margin(b_kernel_ns)
            && b_ours + ticks + margin(b_kernel_ns) >= b_kernel_ns,
        "b: ours {b_ours} ns, cpu.stat {b_kernel_ns} ns"
    );
    let (ours, kernel) = (a_ours + b_ours, a_kernel_ns + b_kernel_ns);
    assert!(
        ours.abs_diff(kernel) <= margin(kernel),
        "a and b: ours {ours} ns, cpu.stat {kernel} ns"
    );
}

/// Sends `signal` to process `pid`.
fn signal(pid: u32, signal: i32) {
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0, "kill {pid}");
}

/// Whether every thread of `pid` is stopped (state `T` in its stat).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(threads) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    threads.flatten().all(|thread| {
        std::fs::read_to_string(thread.path().join("stat")).is_ok_and(|stat| {
            // The state follows the command's closing parenthesis.
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T'))
        })
    })
}

/// Waits until the one thread of `pid` is off the CPU and asleep: its wait channel is named
/// only once it has left the run queue, the switch-out that accounts its last slice.
fn wait_until_asleep(pid: u32) {
    let started = std::time::Instant::now();
    loop {
        let wchan = std::fs::read_to_string(format!("/proc/{pid}/wchan")).unwrap_or_default();
        if !wchan.is_empty() && wchan != "0" {
            return;
        }
        assert!(started.elapsed() < LIMIT, "{pid} never went to sleep");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The programs keep most workers' counters in a fixed array of slots, taken on a worker's
/// first event and given back when its summary is taken, and the rest in hash maps. Short
/// workers that end one after another (a long one running beside them) each take the slot
/// the one before gave back, and each is still what `cpu.stat` says: a reused slot carries
/// nothing over. With no slots at all, every worker goes through the hashes, as exactly.
#[test]
fn workers_in_reused_slots_and_beyond_the_slots_are_counted_like_cpu_stat() {
    // Each worker's process moves itself in between fork and exec: the kernel charges the
    // slice it moves in from its last update (a tick apart, 4 ms at 250 Hz; 1 ms less here
    // in a 6.12 VM), where we split it at the move itself: the moved-thread test's margin. A
    // slot carried over from its last owner, or lost, would be off by 60 ms or more.
    let close = |ours: u64, kernel_usec: u64| {
        let kernel = kernel_usec * 1_000;
        ours.abs_diff(kernel) <= kernel / 100 + 10_000_000
    };
    // Runs a 60 ms worker to its end and returns the slot it had (before its summary gave
    // it back).
    let short_worker = |collector: &mut workerprobe::collect::KernelCollector, name: &str| {
        let short = TestCgroup::new(name);
        short.spin("60");
        // Reaped is not yet off the CPU: the exiting thread's last slice is charged a moment
        // later, at its last switch (the agent, too, settles before it summarises).
        std::thread::sleep(std::time::Duration::from_millis(20));
        let kernel_usec = short.cpu_stat().usage_usec;
        let id = short.id;
        let slot = collector.slot_of(id);
        drop(short); // removed, so its summary may be taken
        let ours = collector
            .finish(id)
            .expect("the short worker was counted")
            .on_cpu_ns();
        eprintln!("{name} (slot {slot:?}): ours {ours} ns, cpu.stat {kernel_usec} µs");
        assert!(kernel_usec >= 59_000, "{name} barely ran");
        assert!(
            close(ours, kernel_usec),
            "{name}: ours {ours} ns, cpu.stat {kernel_usec} µs"
        );
        slot
    };

    let mut collector = collector_with(workerprobe::loader::LoadOptions {
        cpu_slots: Some(64),
        ..Default::default()
    });
    let long = TestCgroup::new("slots-long");
    let spinner = long.spawn_workload(&["spin", "400", "1"]);
    let slots: Vec<Option<u32>> = (0..6)
        .map(|i| short_worker(&mut collector, &format!("slots-short-{i}")))
        .collect();
    assert!(slots.iter().all(Option::is_some), "slots {slots:?}");
    // Given back on top of the free ones, a slot is the next one taken (a cgroup of the node
    // may take one in between, once).
    let reused = slots.windows(2).filter(|pair| pair[0] == pair[1]).count();
    assert!(
        reused >= 4,
        "the slots given back were not reused: {slots:?}"
    );
    assert!(spinner.wait_with_output().expect("wait").status.success());
    std::thread::sleep(std::time::Duration::from_millis(20));
    let kernel_usec = long.cpu_stat().usage_usec;
    let (id, slot) = (long.id, collector.slot_of(long.id));
    drop(long);
    let ours = collector
        .finish(id)
        .expect("the long worker was counted")
        .on_cpu_ns();
    eprintln!("long worker (slot {slot:?}): ours {ours} ns, cpu.stat {kernel_usec} µs");
    assert!(
        slot.is_some() && !slots.contains(&slot),
        "its own slot: {slot:?}, {slots:?}"
    );
    assert!(kernel_usec >= 399_000, "the long worker barely ran");
    assert!(
        close(ours, kernel_usec),
        "long: ours {ours} ns, cpu.stat {kernel_usec} µs"
    );
    drop(collector);

    let mut collector = collector_with(workerprobe::loader::LoadOptions {
        cpu_slots: Some(0),
        ..Default::default()
    });
    for i in 0..2 {
        let slot = short_worker(&mut collector, &format!("hashed-{i}"));
        assert_eq!(slot, None, "no slots were asked for");
    }
    // A live worker beyond the slots is in every sample too, read from the hash.
    let live = TestCgroup::new("hashed-live");
    live.spin("60");
    std::thread::sleep(std::time::Duration::from_millis(20));
    let kernel_usec = live.cpu_stat().usage_usec;
    let sample = collector.sample().expect("sample");
    let ours = sample.workers.get(&live.id).map_or(0, |w| w.on_cpu_ns());
    eprintln!("hashed-live: ours {ours} ns in a sample, cpu.stat {kernel_usec} µs");
    assert!(kernel_usec >= 59_000, "hashed-live barely ran");
    assert!(
        close(ours, kernel_usec),
        "hashed-live: ours {ours} ns in a sample, cpu.stat {kernel_usec} µs"
    );
}

/// With CPU time asked for without delays, the agent reads the kernel's own per-cgroup CPU time
/// with a cgroup iterator (6.1+) and attaches nothing to sched_switch: a worker's CPU time is
/// cpu.stat's to the microsecond, while it lives and after its removal (kept by the removal
/// program), and its context switches are marked as not measured.
#[test]
fn cpu_alone_is_the_kernels_own_accounting_to_the_microsecond() {
    use workerprobe::loader::{LoadOptions, ProgramGroup};
    let mut collector = collector_with(LoadOptions {
        groups: vec![ProgramGroup::Cpu, ProgramGroup::Lifecycle],
        ..Default::default()
    });
    let measured = collector.measured();
    assert!(measured.cpu, "CPU time is measured");
    assert!(
        !measured.switches,
        "no switch program, so no context switches"
    );
    let worker = TestCgroup::new("rstat");
    let spinner = worker.spawn_workload(&["spin", "300", "2"]);
    assert!(spinner.wait_with_output().expect("wait").status.success());
    // The spinner's last switch charges its last slice after wait returns.
    std::thread::sleep(std::time::Duration::from_millis(20));
    let live_ns = counters(&collector.sample().expect("sample"), worker.id).on_cpu_ns();
    let kernel_usec = worker.cpu_stat().usage_usec;
    eprintln!("live: ours {live_ns} ns, cpu.stat {kernel_usec} µs");
    assert!(
        kernel_usec >= 100_000,
        "the spinner barely ran: {kernel_usec} µs"
    );
    assert!(
        (live_ns / 1_000).abs_diff(kernel_usec) <= 1,
        "live: ours {live_ns} ns, cpu.stat {kernel_usec} µs"
    );
    let id = worker.id;
    drop(worker); // removed: its final times are the removal program's
    let final_ns = collector
        .finish(id)
        .expect("the worker was counted")
        .on_cpu_ns();
    eprintln!("removed: ours {final_ns} ns");
    assert!(
        (final_ns / 1_000).abs_diff(kernel_usec) <= 1,
        "removed: ours {final_ns} ns, cpu.stat {kernel_usec} µs"
    );
}
