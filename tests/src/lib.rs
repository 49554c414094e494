//! Helpers for the integration tests: real cgroups under the cgroup2 mount, known workloads in
//! child processes placed in them, and the kernel's own accounting to compare against.
//!
//! The tests need root. They never skip: without root they fail, saying so.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use workerprobe::{
    cgroup::{self, CgroupIndex},
    collect::KernelCollector,
    loader::{self, LoadOptions},
    model::{CpuStatUsec, Sample, WorkerCounters},
};

/// Panics with a clear message unless the tests run as root.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the integration tests load eBPF programs and make cgroups: run them as root (`sudo -E cargo xtask test`)"
    );
}

/// Loads and attaches the programs and returns a collector over their maps.
///
/// `WP_TEST_NET_ATTACH=fexit` (or `tracepoint`) forces the socket variant, so the VM matrix
/// checks both on a kernel that has both.
pub fn collector() -> KernelCollector {
    collector_with(LoadOptions::default())
}

/// As [`collector`], with these options (the socket variant still from the environment).
pub fn collector_with(options: LoadOptions) -> KernelCollector {
    require_root();
    let mount = cgroup::find_cgroup2_mount().expect("find cgroup2 mount");
    let net_attach = match std::env::var("WP_TEST_NET_ATTACH").as_deref() {
        Ok("fexit") => Some(loader::NetAttach::Fexit),
        Ok("tracepoint") => Some(loader::NetAttach::Tracepoint),
        _ => None,
    };
    let options = LoadOptions {
        net_attach,
        ..options
    };
    let probe = loader::load_and_attach(&options).expect("load and attach probe");
    if net_attach.is_some() {
        assert!(
            probe.measured().net,
            "the forced socket variant cannot run here"
        );
    }
    KernelCollector::new(probe, CgroupIndex::new(mount)).expect("collector")
}

/// A cgroup made for one test, removed (after its processes are gone) on drop.
pub struct TestCgroup {
    /// Directory under the cgroup2 mount.
    pub dir: PathBuf,
    /// cgroup v2 id.
    pub id: u64,
}

impl TestCgroup {
    /// Makes `<cgroup2>/workerprobe-test-<pid>-<name>`.
    pub fn new(name: &str) -> Self {
        require_root();
        let mount = cgroup::find_cgroup2_mount().expect("find cgroup2 mount");
        let dir = mount.join(format!("workerprobe-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|err| panic!("mkdir {}: {err}", dir.display()));
        let id = cgroup::cgroup_id(&dir).expect("cgroup id");
        Self { dir, id }
    }

    /// A cgroup `name` below this one, removed (once empty) on drop: drop it first.
    pub fn child(&self, name: &str) -> Self {
        let dir = self.dir.join(name);
        std::fs::create_dir(&dir).unwrap_or_else(|err| panic!("mkdir {}: {err}", dir.display()));
        let id = cgroup::cgroup_id(&dir).expect("cgroup id");
        Self { dir, id }
    }

    /// Runs `wp-workload spin MS 1` in this cgroup to its end.
    pub fn spin(&self, ms: &str) {
        let spinner = self.spawn_workload(&["spin", ms, "1"]);
        assert!(spinner.wait_with_output().expect("wait").status.success());
    }

    /// CPU seconds the kernel charged this cgroup (`cpu.stat` usage).
    pub fn cpu_seconds(&self) -> f64 {
        self.cpu_stat().usage_usec as f64 / 1e6
    }

    /// The directory's name (`workerprobe-test-<pid>-<name>`), as `--workers` matches it.
    pub fn name(&self) -> String {
        self.dir
            .file_name()
            .and_then(|name| name.to_str())
            .expect("a UTF-8 cgroup name")
            .to_string()
    }

    /// The kernel's own CPU accounting of this cgroup.
    pub fn cpu_stat(&self) -> CpuStatUsec {
        cgroup::read_cpu_stat(&self.dir)
            .unwrap_or_else(|| panic!("read {}/cpu.stat", self.dir.display()))
    }

    /// Starts the workload with `args` in this cgroup, stdout piped.
    pub fn spawn_workload(&self, args: &[&str]) -> Child {
        let mut command = Command::new(workload_path());
        command.args(args).stdout(Stdio::piped());
        cgroup::spawn_in_cgroup(&mut command, &self.dir).unwrap_or_else(|err| {
            panic!(
                "spawn wp-workload {args:?} in {}: {err}",
                self.dir.display()
            )
        })
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Processes may take a moment to leave after exit.
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Starts `watch --json` with `extra` arguments, runs `work`, then stops the agent (SIGINT)
/// once the last summaries are out, and returns its JSON lines.
pub fn watch_json_while(extra: &[&str], work: impl FnOnce()) -> Vec<serde_json::Value> {
    let mut args = vec!["watch", "--json"];
    args.extend_from_slice(extra);
    let mut agent = KillOnDrop(start_agent(&args, "attached"));
    let mut stdout = agent.0.stdout.take().expect("stdout");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stdout, &mut text);
        text
    });
    work();
    // A thread's end is told at its last switch-out; then the agent lets each process and
    // each removed cgroup settle.
    std::thread::sleep(Duration::from_millis(600));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGINT) };
    let status = agent.0.wait().expect("wait for the agent");
    assert!(status.success(), "the agent failed: {status:?}");
    json_lines(&reader.join().expect("stdout reader"))
}

/// A `/proc/<pid>/status` field's value (`"Uid:"`, `"VmRSS:"`), trimmed.
pub fn status_field(pid: u32, name: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("read /proc/PID/status")
        .lines()
        .find_map(|line| line.strip_prefix(name))
        .map(|value| value.trim().to_owned())
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
}

/// The JSON lines of `text`, other lines (a framework's blank ones) left out.
pub fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter(|line| line.starts_with('{'))
        .map(|line| serde_json::from_str(line).unwrap_or_else(|err| panic!("{line:?}: {err}")))
        .collect()
}

/// A child process killed and reaped when dropped, so an agent a failed test started does not
/// outlive it (a passing test ends its agents itself, through the inner `Child`).
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Path of the workload binary; cargo builds it for this crate's integration tests.
pub fn workload_path() -> PathBuf {
    built_binary("wp-workload")
}

/// Path of the `workerprobe` binary; cargo builds it as a dependency's binary next to the
/// test executables.
pub fn workerprobe_path() -> PathBuf {
    built_binary("workerprobe")
}

/// `target/<profile>/<name>`, found from the running test executable in `target/<profile>/deps`.
fn built_binary(name: &str) -> PathBuf {
    let test_exe = std::env::current_exe().expect("current exe");
    let dir = test_exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir");
    let binary = dir.join(name);
    assert!(
        binary.exists(),
        "{} is missing: build the workspace first (`cargo xtask test` does)",
        binary.display()
    );
    binary
}

/// Waits for a workload and parses the JSON line it printed last.
pub fn wait_json(child: Child) -> serde_json::Value {
    let output = child.wait_with_output().expect("wait for workload");
    assert!(
        output.status.success(),
        "workload failed: {:?}",
        output.status
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let last = text.lines().last().expect("workload printed nothing");
    serde_json::from_str(last).unwrap_or_else(|err| panic!("workload printed {last:?}: {err}"))
}

/// Reads the first line a workload printed (e.g. its bound address).
pub fn read_first_json_line(child: &mut Child) -> serde_json::Value {
    use std::io::BufRead as _;
    let stdout = child.stdout.as_mut().expect("piped stdout");
    let mut line = String::new();
    // One byte at a time so nothing after the line is taken from the pipe.
    let mut reader = std::io::BufReader::with_capacity(1, stdout);
    reader.read_line(&mut line).expect("read workload line");
    serde_json::from_str(line.trim())
        .unwrap_or_else(|err| panic!("workload printed {line:?}: {err}"))
}

/// A worker's counters in a sample, or all zeros if it never appeared.
pub fn counters(sample: &Sample, id: u64) -> WorkerCounters {
    sample.workers.get(&id).cloned().unwrap_or_default()
}

/// A sample taken once the worker's counters have stopped moving, for a window that ends
/// when its last process was reaped: the reaped thread may still wait for a CPU for its last
/// switch, which charges its last slice (and any sleep whose wakeup the kernel hid from
/// tracing). Polls every 20 ms, for 3 s at most.
pub fn settled_sample(collector: &mut KernelCollector, cgroup_id: u64) -> Sample {
    use workerprobe::collect::Source as _;
    let moving = |sample: &Sample| {
        let worker = counters(sample, cgroup_id);
        (worker.on_cpu_ns_per_cpu, worker.sched, worker.net)
    };
    let mut last = collector.sample().expect("sample");
    for _ in 0..150 {
        std::thread::sleep(Duration::from_millis(20));
        let next = collector.sample().expect("sample");
        if moving(&next) == moving(&last) {
            return next;
        }
        last = next;
    }
    panic!("worker {cgroup_id}'s counters still moved 3 s after it ended")
}

/// A JSON number as u64.
pub fn field(value: &serde_json::Value, name: &str) -> u64 {
    value[name]
        .as_u64()
        .unwrap_or_else(|| panic!("{name} missing in {value}"))
}

/// Starts `workerprobe ARGS…` (stdout piped, stdout of the agent is the caller's to read) and
/// returns once a line it writes on stderr contains `ready` — its "attached", "recording to"
/// or "serving" line, after only the kernel's notes — so the test's work starts inside its
/// window.
pub fn start_agent<S: AsRef<std::ffi::OsStr>>(args: &[S], ready: &str) -> Child {
    let mut agent = Command::new(workerprobe_path())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start workerprobe");
    let mut stderr = std::io::BufReader::new(agent.stderr.take().expect("stderr"));
    wait_until_ready(&mut stderr, ready);
    // Keep reading: an agent whose stderr is closed would fail its next warning.
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut rest);
    });
    agent
}

/// Reads an agent's stderr up to the line that contains `ready`. What this kernel cannot
/// measure is said first, once (e.g. splice reads where fexit is refused), and a map that
/// filled or was busy may be told from the first sample on (on 6.1 the kernel's task storage
/// is now and then busy: its per-CPU busy mark is held across preemption); anything else
/// before `ready` fails the test.
pub fn wait_until_ready(stderr: &mut impl std::io::BufRead, ready: &str) {
    loop {
        let mut line = String::new();
        stderr.read_line(&mut line).expect("read agent stderr");
        if line.contains(ready) {
            return;
        }
        let kernel_note =
            line.contains(" on Linux ") && line.contains("the other measurements run");
        let drop_warning =
            line.starts_with("workerprobe: warning: ") && line.contains(" is full or busy: ");
        assert!(
            kernel_note || drop_warning,
            "agent said {line:?}, not {ready:?}"
        );
        eprintln!("agent: {}", line.trim_end());
    }
}

/// A directory on a real disk for file I/O: `$WP_SCRATCH` (the VM tests point it at a
/// host directory, their /var/tmp being memory), else /var/tmp.
pub fn scratch_dir() -> String {
    std::env::var("WP_SCRATCH").unwrap_or_else(|_| "/var/tmp".into())
}

/// Waits until the cgroup's threads have run `at_least_ns` more CPU time than `from_usec`
/// (its cpu.stat usage then), polling cpu.stat: a window measured in work done, not in wall
/// time, so a loaded or emulated machine only makes it longer. Panics after `limit`.
pub fn wait_for_cpu(cgroup: &TestCgroup, from_usec: u64, at_least_ns: u64, limit: Duration) {
    let started = std::time::Instant::now();
    while (cgroup.cpu_stat().usage_usec.saturating_sub(from_usec)) * 1_000 < at_least_ns {
        assert!(
            started.elapsed() < limit,
            "{} ran less than {at_least_ns} ns of CPU in {limit:?}",
            cgroup.dir.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the kernel holds the wall clock synchronised (adjtimex: not `TIME_ERROR`, and
/// `STA_UNSYNC` clear), read here so the agent's report can be checked against it.
pub fn kernel_clock_synchronized() -> bool {
    // SAFETY: a zeroed timex with modes 0 only reads.
    let mut timex: libc::timex = unsafe { std::mem::zeroed() };
    // SAFETY: `timex` is valid and writable.
    let state = unsafe { libc::adjtimex(&mut timex) };
    state != libc::TIME_ERROR && timex.status & libc::STA_UNSYNC == 0
}

/// A fresh path in the temp directory, unique to this test process.
pub fn temp_path(test: &str, name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("wp-{test}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// The waits the `reasons` workload times of itself: (wait reason, its JSON field).
pub const TIMED_REASONS: [(&str, &str); 5] = [
    ("timer", "timer_ns"),
    ("network", "network_ns"),
    ("lock", "lock_ns"),
    ("child", "child_ns"),
    ("pipe", "pipe_ns"),
];

/// Within 5% or 20 ms of what the workload timed. 20 ms: once in four runs in a 6.1 VM under
/// emulation, a 274 ms pipe wait the workload timed came out 14.6 ms longer (its run-queue
/// waits there are tens of ms). A wait put under the wrong reason would be off by its whole
/// length (300 ms and more).
pub fn close_to_timed(ours_ns: u64, timed_ns: u64) -> bool {
    let tolerance = (timed_ns as f64 * 0.05).max(20e6);
    (ours_ns as f64 - timed_ns as f64).abs() <= tolerance
}

/// Runs the `reasons` workload in `cgroup` to its end, this test being the peer that answers
/// its ping after half a second; `before_go` runs once it is ready, before it starts timing.
/// Returns its pid and what it timed of its own waits.
pub fn run_reasons(cgroup: &TestCgroup, before_go: impl FnOnce()) -> (u32, serde_json::Value) {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let mut child = cgroup.spawn_workload(&["reasons", &scratch_dir(), &addr]);
    let pid = child.id();
    let (mut peer, _) = listener.accept().expect("accept");
    read_first_json_line(&mut child);
    before_go();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(pid as i32, libc::SIGUSR1) };
    // Two pings (the workload reads one answer with read(2), one with recv(2)).
    for _ in 0..2 {
        let mut ping = [0u8; 5];
        peer.read_exact(&mut ping).expect("ping");
        std::thread::sleep(Duration::from_millis(250));
        peer.write_all(b"!").expect("answer");
    }
    (pid, wait_json(child))
}

/// Whether the kernel's sched_process_exit passes `group_dead`, as its own tracefs format
/// says (mounting tracefs if it is not): the kernels that call it before the process's memory
/// is released.
pub fn exit_tracepoint_passes_group_dead() -> bool {
    let format = |root: &str| {
        std::fs::read_to_string(format!("{root}/events/sched/sched_process_exit/format")).ok()
    };
    if let Some(text) =
        format("/sys/kernel/tracing").or_else(|| format("/sys/kernel/debug/tracing"))
    {
        return text.contains("group_dead");
    }
    let mount = std::env::temp_dir().join(format!("wp-tracefs-{}", std::process::id()));
    std::fs::create_dir_all(&mount).expect("tracefs mount point");
    let status = std::process::Command::new("mount")
        .args(["-t", "tracefs", "tracefs"])
        .arg(&mount)
        .status()
        .expect("mount tracefs");
    assert!(status.success(), "mounting tracefs failed");
    let text = format(&mount.to_string_lossy()).expect("sched_process_exit's format");
    let _ = std::process::Command::new("umount").arg(&mount).status();
    let _ = std::fs::remove_dir(&mount);
    text.contains("group_dead")
}
