//! The machine side of the bench: cgroups, sysctls, /proc readings, child processes and
//! bpftool's per-program statistics.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead as _, BufReader};
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::cmd;

/// The cgroup2 mount point, from /proc/self/mountinfo (never assumed).
pub fn cgroup2_mount() -> Result<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo")
        .context("could not read /proc/self/mountinfo")?;
    // "36 25 0:31 / /sys/fs/cgroup/unified rw,... shared:9 - cgroup2 cgroup2 rw"
    mountinfo
        .lines()
        .find_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            if right.split_whitespace().next()? != "cgroup2" {
                return None;
            }
            Some(PathBuf::from(left.split_whitespace().nth(4)?))
        })
        .context("no cgroup2 mount in /proc/self/mountinfo: mount one (mount -t cgroup2 none /sys/fs/cgroup)")
}

/// A cgroup the bench made; removed (after its processes are gone) when dropped.
pub struct Cgroup {
    /// Its directory.
    pub dir: PathBuf,
}

impl Cgroup {
    /// Makes `<parent>/<name>` (a stale one from an interrupted run is reused).
    pub fn create(parent: &Path, name: &str) -> Result<Cgroup> {
        let dir = parent.join(name);
        if !dir.is_dir() {
            fs::create_dir(&dir)
                .with_context(|| format!("could not create cgroup {}", dir.display()))?;
        }
        Ok(Cgroup { dir })
    }

    /// The cgroup id: the inode of its directory, as `bpf_get_current_cgroup_id` returns.
    pub fn id(&self) -> Result<u64> {
        Ok(fs::metadata(&self.dir)
            .with_context(|| format!("could not stat {}", self.dir.display()))?
            .ino())
    }

    /// `usage_usec` from its cpu.stat: the kernel's own CPU total, the accuracy reference.
    pub fn usage_usec(&self) -> Result<u64> {
        let path = self.dir.join("cpu.stat");
        let text = fs::read_to_string(&path)
            .with_context(|| format!("could not read {}", path.display()))?;
        text.lines()
            .find_map(|l| l.strip_prefix("usage_usec ")?.trim().parse().ok())
            .with_context(|| format!("no usage_usec in {}", path.display()))
    }

    /// Makes `command` join this cgroup before it execs, so all its work is counted here.
    pub fn join_on_spawn(&self, command: &mut Command) {
        let procs = self.dir.join("cgroup.procs");
        // SAFETY: the closure runs between fork and exec; it only writes a file.
        unsafe {
            command.pre_exec(move || fs::write(&procs, b"0"));
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Children first (the tick workers' leaves), deepest first; errors are ignored as
        // there is nothing better to do in a destructor than leave the directory behind.
        if let Ok(entries) = fs::read_dir(&self.dir) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    drop(Cgroup { dir: entry.path() });
                }
            }
        }
        for _ in 0..50 {
            // rmdir fails with EBUSY for a moment after the last process exits.
            if fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("bench: could not remove cgroup {}", self.dir.display());
    }
}

/// Sets a sysctl for the bench and puts the old value back when dropped.
pub struct Sysctl {
    path: PathBuf,
    old: String,
}

impl Sysctl {
    /// Writes `value` to /proc/sys/`name` (dots become slashes), remembering the old value.
    pub fn set(name: &str, value: &str) -> Result<Sysctl> {
        let path = Path::new("/proc/sys").join(name.replace('.', "/"));
        let old = fs::read_to_string(&path)
            .with_context(|| format!("could not read sysctl {name}"))?
            .trim()
            .to_owned();
        let guard = Sysctl { path, old };
        guard.write(value)?;
        Ok(guard)
    }

    /// Writes another value, keeping the original for the restore.
    pub fn write(&self, value: &str) -> Result<()> {
        fs::write(&self.path, value)
            .with_context(|| format!("could not write {value} to {}", self.path.display()))
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        if let Err(e) = fs::write(&self.path, &self.old) {
            eprintln!("bench: could not restore {}: {e}", self.path.display());
        }
    }
}

/// A child process killed (and reaped) when dropped, so an error never leaves an agent
/// or a peer attached.
pub struct Guarded {
    /// The child.
    pub child: Child,
    /// What it is, for messages.
    pub name: String,
}

impl Guarded {
    /// Spawns `command`, which also dies if the bench is killed (PR_SET_PDEATHSIG).
    pub fn spawn(name: &str, mut command: Command) -> Result<Guarded> {
        // SAFETY: prctl is async-signal-safe; it runs between fork and exec.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = command
            .spawn()
            .with_context(|| format!("could not start `{}`", cmd::describe(&command)))?;
        Ok(Guarded {
            child,
            name: name.to_owned(),
        })
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal`, then waits up to `grace` for the exit before killing it.
    pub fn stop(mut self, signal: i32, grace: Duration) -> Result<()> {
        let pid = self.pid() as libc::pid_t;
        // SAFETY: kill(2) on our own, not yet reaped, child.
        unsafe { libc::kill(pid, signal) };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        bail!(
            "{} did not exit within {grace:?} of signal {signal}",
            self.name
        )
    }

    /// Waits for the child to exit by itself, at most `limit`.
    pub fn wait(&mut self, limit: Duration) -> Result<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("{} still running after {limit:?}", self.name);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Spawns a `workerprobe` command with stderr piped and waits for its "attached" line.
///
/// Returns the child and the time from spawn to that line (load and attach time).
pub fn spawn_attached(name: &str, mut command: Command) -> Result<(Guarded, Duration)> {
    command.stdin(Stdio::null()).stderr(Stdio::piped());
    let start = Instant::now();
    let mut agent = Guarded::spawn(name, command)?;
    let stderr = agent
        .child
        .stderr
        .take()
        .context("agent stderr not piped")?;
    let mut lines = BufReader::new(stderr).lines();
    loop {
        match lines.next() {
            Some(Ok(line)) if line.contains("attached") => break,
            Some(Ok(_)) => {}
            _ => bail!("{name} exited before attaching (see its stderr above)"),
        }
    }
    let elapsed = start.elapsed();
    // Keep draining stderr so the agent never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Ok((agent, elapsed))
}

/// Waits until `path` has a line containing `needle`, at most `limit`.
pub fn wait_for_line(path: &Path, needle: &str, limit: Duration, what: &str) -> Result<()> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if fs::read_to_string(path).is_ok_and(|t| t.lines().any(|l| l.contains(needle))) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!(
        "{what} did not start within {limit:?} (no `{needle}` in {})",
        path.display()
    )
}

/// CPU seconds a process has used so far, all its threads (ended ones too): the kernel's own
/// runtime in nanoseconds, read through the process's CPU-time clock. /proc/<pid>/stat's
/// utime and stime count 10 ms ticks: over a 20 s window at 0.5% of a core that is ten of
/// them, the unit itself a tenth of the figure.
pub fn process_cpu_seconds(pid: u32) -> Result<f64> {
    // The process's CPU-time clock, as glibc's clock_getcpuclockid makes it (the kernel's
    // MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED): the libc crate has no binding for Linux).
    let clock = (!(pid as libc::clockid_t) << 3) | 2;
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes the clock's time into `now`.
    if unsafe { libc::clock_gettime(clock, &mut now) } != 0 {
        bail!(
            "could not read the CPU time of process {pid}: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(now.tv_sec as f64 + now.tv_nsec as f64 * 1e-9)
}

/// Peak resident set (VmHWM) of a process, in bytes.
pub fn process_peak_rss(pid: u32) -> Result<u64> {
    process_status_kb(pid, "VmHWM:")
}

/// Resident set now (VmRSS) of a process, in bytes.
pub fn process_rss(pid: u32) -> Result<u64> {
    process_status_kb(pid, "VmRSS:")
}

/// A `kB` field of /proc/<pid>/status, in bytes.
fn process_status_kb(pid: u32, field: &str) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = fs::read_to_string(&path).with_context(|| format!("could not read {path}"))?;
    status
        .lines()
        .find_map(|l| {
            let kb: u64 = l
                .strip_prefix(field)?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()?;
            Some(kb * 1024)
        })
        .with_context(|| format!("no {field} in {path}"))
}

/// CLOCK_MONOTONIC now, in seconds: the clock the Python peers timestamp their samples with.
pub fn monotonic_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

/// Cumulative statistics of one loaded BPF program, from `bpftool -j prog show`.
#[derive(Clone, Debug)]
pub struct ProgStats {
    /// The kernel's (16-byte truncated) program name.
    pub name: String,
    /// Total ns spent running it since bpf_stats were enabled.
    pub run_time_ns: u64,
    /// How many times it ran.
    pub run_cnt: u64,
}

/// Every loaded program by id.
pub fn prog_stats() -> Result<BTreeMap<u64, ProgStats>> {
    let out = Command::new("bpftool")
        .args(["-j", "prog", "show"])
        .output()
        .context("could not run `bpftool -j prog show`")?;
    if !out.status.success() {
        bail!("`bpftool -j prog show` failed ({})", out.status);
    }
    let progs: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("`bpftool -j prog show` printed no JSON")?;
    let mut map = BTreeMap::new();
    for p in progs.as_array().context("bpftool JSON is not a list")? {
        let Some(id) = p["id"].as_u64() else { continue };
        map.insert(
            id,
            ProgStats {
                name: p["name"].as_str().unwrap_or("?").to_owned(),
                // bpftool leaves the counters out while they are zero.
                run_time_ns: p["run_time_ns"].as_u64().unwrap_or(0),
                run_cnt: p["run_cnt"].as_u64().unwrap_or(0),
            },
        );
    }
    Ok(map)
}

/// A short description of the machine for the report header.
pub fn machine_description() -> Vec<(String, String)> {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|x| x.1.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let kb: f64 = m.lines().find_map(|l| {
                l.strip_prefix("MemTotal:")?
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .ok()
            })?;
            Some(format!("{:.1} GiB", kb / 1024.0 / 1024.0))
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned());
    vec![
        ("CPU".to_owned(), model),
        ("nproc".to_owned(), nproc.to_string()),
        ("memory".to_owned(), mem),
        ("kernel (uname -r)".to_owned(), kernel),
    ]
}

/// Mounts tracefs if it is not there: bpftrace reads tracepoint formats from it.
pub fn ensure_tracefs() -> Result<()> {
    if Path::new("/sys/kernel/tracing/events").is_dir() {
        return Ok(());
    }
    cmd::run(Command::new("mount").args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"]))
        .context("bpftrace needs tracefs and mounting it failed")
}

#[cfg(test)]
mod tests {
    use super::process_cpu_seconds;

    /// The process's user plus system time as getrusage gives it (the kernel's runtime, split).
    fn rusage_seconds() -> f64 {
        // SAFETY: an all-zero rusage is valid; getrusage fills it.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: writes into `usage`.
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) }, 0);
        let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        seconds(usage.ru_utime) + seconds(usage.ru_stime)
    }

    #[test]
    fn process_cpu_time_is_the_kernels_to_the_millisecond() {
        let pid = std::process::id();
        let (clock_before, rusage_before) = (process_cpu_seconds(pid).unwrap(), rusage_seconds());
        // 50 ms of CPU time, however long that takes on a busy machine.
        let mut spins = 0u64;
        while process_cpu_seconds(pid).unwrap() - clock_before < 0.05 {
            spins = std::hint::black_box(spins + 1);
        }
        let (clock_after, rusage_after) = (process_cpu_seconds(pid).unwrap(), rusage_seconds());
        let (clock, rusage) = (clock_after - clock_before, rusage_after - rusage_before);
        assert!(
            clock >= 0.05,
            "the clock read {clock} s after 50 ms of spinning"
        );
        assert!(
            (clock - rusage).abs() < 0.002,
            "the clock read {clock} s, getrusage {rusage} s"
        );
        // PID_MAX_LIMIT: every pid is below it.
        assert!(process_cpu_seconds(4_194_304).is_err(), "no such process");
    }
}
