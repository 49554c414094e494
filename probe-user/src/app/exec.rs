//! `workerprobe exec`: run a command in a fresh cgroup and report its exit summary, the
//! zero-code way to get Lithops-like stats for any command.

use std::{
    fs,
    io::Write as _,
    os::unix::process::ExitStatusExt as _,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::Context as _;

use crate::{
    cgroup::{self, CgroupIndex},
    cli::ExecArgs,
    clock::Timestamp,
    collect::{
        KernelCollector,
        memory::{self, MemoryReader},
    },
    error::UserError,
    loader,
    model::{
        identity::identify,
        registry::WorkerRecord,
        summary::{ExecOutcome, ExitSummary},
    },
    sink::summary::report,
};

/// How long after the command is reaped its counters are read: its last thread may still be
/// in its final context switch.
const SETTLE: Duration = Duration::from_millis(30);

/// The cgroups made for one command; removed on drop, whatever happens.
struct ExecCgroups {
    /// The cgroup2 directory: the worker.
    v2: PathBuf,
    /// A v1 memory cgroup of its own on hybrid hosts, for an exact memory peak.
    v1_memory: Option<PathBuf>,
}

impl ExecCgroups {
    fn make(mount: &Path, v1_memory_mount: Option<&Path>, leaf: &str) -> anyhow::Result<Self> {
        let parent = mount.join("workerprobe");
        let v2 = parent.join(leaf);
        if fs::create_dir_all(&parent).is_err() {
            return Err(UserError::NoWritableCgroup2(mount.to_path_buf()).into());
        }
        // The memory controller gives the exact peak (memory.peak). Only memory: cpu.stat is
        // there without the cpu controller, and enabling that would change how the command is
        // scheduled against everything else.
        match cgroup::enable_for_children(mount, &parent, "memory") {
            Ok(_) => {}
            Err(err) => crate::say!(
                "workerprobe: could not enable the memory controller for {} ({err}): the memory peak comes from the command's max RSS instead",
                parent.display()
            ),
        }
        sweep_abandoned(&parent);
        if fs::create_dir(&v2).is_err() {
            return Err(UserError::NoWritableCgroup2(mount.to_path_buf()).into());
        }
        // Best effort: without it the memory figure falls back to sampled RSS.
        let v1_memory = v1_memory_mount.and_then(|v1| {
            let v1_parent = v1.join("workerprobe");
            sweep_abandoned(&v1_parent);
            let dir = v1_parent.join(leaf);
            fs::create_dir_all(&dir).ok().map(|()| dir)
        });
        Ok(Self { v2, v1_memory })
    }

    fn dirs(&self) -> Vec<&Path> {
        std::iter::once(self.v2.as_path())
            .chain(self.v1_memory.as_deref())
            .collect()
    }
}

/// Removes the empty cgroups of exec agents that are gone (killed with SIGKILL, or a host
/// that lost power mid-run): `exec-<agent pid>-<name>` whose agent pid no longer runs.
fn sweep_abandoned(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(agent_pid) = exec_agent_pid(&name.to_string_lossy()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{agent_pid}")).exists() {
            // Fails, and is left alone, while processes still run in it.
            let _ = fs::remove_dir(entry.path());
        }
    }
}

/// The agent pid in an exec cgroup's name, `exec-<pid>-<name>`.
fn exec_agent_pid(leaf: &str) -> Option<u32> {
    let (pid, _) = leaf.strip_prefix("exec-")?.split_once('-')?;
    pid.parse().ok()
}

impl ExecCgroups {
    /// Removes the cgroups, saying so for any the kernel keeps (never left behind silently).
    fn remove(mut self) {
        // Taken out, so that drop (which runs next) has nothing left to do.
        let mut dirs = vec![std::mem::take(&mut self.v2)];
        dirs.extend(self.v1_memory.take());
        for dir in dirs {
            if let Err(err) = cgroup::remove_cgroup(&dir) {
                crate::say!(
                    "workerprobe: could not remove the cgroup {} ({err}): remove it with `rmdir {}` once its processes are gone",
                    dir.display(),
                    dir.display()
                );
            }
        }
    }
}

impl Drop for ExecCgroups {
    /// On an early return: best effort, the processes in them are killed first.
    fn drop(&mut self) {
        if self.v2.as_os_str().is_empty() {
            return;
        }
        kill_all(&self.v2);
        let _ = cgroup::remove_cgroup(&self.v2);
        if let Some(dir) = &self.v1_memory {
            let _ = cgroup::remove_cgroup(dir);
        }
    }
}

/// `workerprobe exec`: returns the exit code to leave with.
pub fn exec(args: &ExecArgs) -> anyhow::Result<u8> {
    if args.probe.pin.is_some() {
        return Err(UserError::BadInput(
            "exec cannot run with --pin: its counters end with the command; pin a long-running agent (top, watch, serve, record) instead"
                .into(),
        )
        .into());
    }
    if args.probe.user.is_some() {
        return Err(UserError::BadInput(
            "exec cannot run with --user: it must remove the command's cgroup at the end, which needs root"
                .into(),
        )
        .into());
    }
    let program = &args.command[0];
    let name = match &args.name {
        Some(name) => name.clone(),
        None => Path::new(program)
            .file_name()
            .map(|name| sanitize(&name.to_string_lossy()))
            .unwrap_or_else(|| "cmd".into()),
    };
    let mount = cgroup::find_cgroup2_mount()?;
    // SIGTERM, SIGINT and SIGHUP are for the command (passed on once it runs): the agent
    // stays to report and to remove its cgroups.
    install_forwarding();
    // Load first: a user without privileges learns it before anything is made.
    // One worker: its two memory files cost less than a walk of every cgroup.
    let probe = loader::load_and_attach(&loader::LoadOptions {
        memory_by_files: true,
        ..args.probe.load_options()
    })?;
    super::tell_notes(&probe);
    let memory_reader = MemoryReader::new();
    let leaf = format!("exec-{}-{name}", std::process::id());
    let cgroups = ExecCgroups::make(&mount, memory_reader.v1_memory_mount(), &leaf)?;
    let cgroup_id = cgroup::cgroup_id(&cgroups.v2).context("reading the new cgroup's id")?;
    let mut collector = KernelCollector::new(probe, CgroupIndex::new(mount.clone()))?;

    let started = Timestamp::now();
    let mut command = Command::new(program);
    command.args(&args.command[1..]);
    let child = match cgroup::spawn_in_cgroups(&mut command, &cgroups.dirs()) {
        Ok(child) => child,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            crate::say!("workerprobe: {program}: command not found");
            return Ok(127);
        }
        Err(err) if err.kind() == std::io::ErrorKind::PermissionDenied => {
            crate::say!("workerprobe: {program}: permission denied (is it executable?)");
            return Ok(126);
        }
        Err(err) => return Err(err).with_context(|| format!("starting {program}")),
    };
    let (status, max_rss_bytes) = wait_with_rusage(child.id())?;
    // The worker ends when its cgroup is empty: what the command left behind is part of it.
    linger(&cgroups.v2, args.linger);
    let ended = Timestamp::now();
    std::thread::sleep(SETTLE);

    let v2_relative = format!("/workerprobe/{leaf}");
    let mut record = WorkerRecord {
        cgroup_id,
        identity: identify(&v2_relative),
        path: v2_relative,
        started_at_monotonic_ns: started.monotonic_ns,
        start_observed: true,
        memory: None,
        memory_peak_bytes: 0,
        cpu_stat: cgroup::read_cpu_stat(&cgroups.v2),
    };
    let reading = match &cgroups.v1_memory {
        Some(dir) if !cgroups.v2.join("memory.peak").exists() => memory::read_v1_dir(dir),
        _ => memory_reader_read(&cgroups.v2),
    };
    if let Some(reading) = reading {
        record.memory_peak_bytes = reading.peak_bytes;
        record.memory = Some(reading);
    }
    let counters = collector.finish(cgroup_id).unwrap_or_default();
    let (exit_code, signal) = match (status.code(), status.signal()) {
        (Some(code), _) => (code, None),
        (None, Some(signal)) => (128 + signal, Some(signal)),
        (None, None) => (1, None),
    };
    let boot_offset_ns = i128::from(started.wall_unix_ns) - i128::from(started.monotonic_ns);
    let summary = ExitSummary::new(
        &record,
        &counters,
        ended.monotonic_ns,
        boot_offset_ns,
        collector.measured(),
        &args.probe.endpoint_namer(),
        Some(ExecOutcome {
            command: args.command.clone(),
            exit_code,
            signal,
            max_rss_bytes,
        }),
    );
    let text = if args.json {
        serde_json::to_string(&summary).context("encoding the summary")? + "\n"
    } else {
        report(&summary)
    };
    match &args.output {
        Some(path) => fs::write(path, text)
            .with_context(|| format!("writing the summary to {}", path.display()))?,
        None => {
            let _ = std::io::stderr().write_all(text.as_bytes());
        }
    }
    // The command's cgroups go; their parent stays as the home of every exec, like a slice.
    cgroups.remove();
    Ok(exit_code.clamp(0, 255) as u8)
}

/// The cgroup2 memory files of the command's own cgroup, when the host has them.
fn memory_reader_read(dir: &Path) -> Option<crate::model::MemoryReading> {
    MemoryReader::new().read(dir)
}

/// A command's file name made safe for a cgroup name.
fn sanitize(text: &str) -> String {
    let cleaned: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if cleaned.is_empty() || cleaned.starts_with('.') {
        format!("cmd{cleaned}")
    } else {
        cleaned
    }
}

/// The last signal to pass on to the command (0: none), set by [`on_signal`].
static PENDING_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// How often the waits below look for the command's end and for signals to pass on.
const POLL: Duration = Duration::from_millis(20);

extern "C" fn on_signal(signal: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // The terminal's Ctrl-C (SI_KERNEL) reaches the whole foreground group, the command
    // too: passing it on would deliver it twice.
    // SAFETY: the kernel hands a valid siginfo to an SA_SIGINFO handler.
    let from_terminal = unsafe { (*info).si_code } == libc::SI_KERNEL;
    if !from_terminal {
        PENDING_SIGNAL.store(signal, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Catches SIGTERM, SIGINT and SIGHUP to pass them on to the command (a CI runner's timeout
/// is a SIGTERM to us); SIGQUIT stays the command's, like a shell's foreground job's.
fn install_forwarding() {
    // SAFETY: a zeroed sigaction with a valid handler and an empty mask; the handler only
    // stores to an atomic, which is async-signal-safe.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut action.sa_mask);
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaction(signal, &action, std::ptr::null_mut());
        }
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
    }
}

/// Sends a signal that arrived to `pids`.
fn forward_pending(pids: &[i32]) {
    let signal = PENDING_SIGNAL.swap(0, std::sync::atomic::Ordering::SeqCst);
    if signal != 0 {
        for &pid in pids {
            // SAFETY: kill(2) has no memory preconditions.
            unsafe { libc::kill(pid, signal) };
        }
    }
}

/// Waits until the cgroup is empty, up to `limit`; then names what is left, kills it, and
/// waits for it to go. Signals that arrive meanwhile go to every process still there.
fn linger(dir: &Path, limit: Duration) {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let pids = cgroup_pids(dir);
        if pids.is_empty() {
            return;
        }
        forward_pending(&pids);
        if std::time::Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(POLL);
    }
    let left: Vec<String> = cgroup_pids(dir)
        .iter()
        .map(|pid| {
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("{pid} ({})", comm.trim())
        })
        .collect();
    if left.is_empty() {
        return;
    }
    crate::say!(
        "workerprobe: {} process{} outlived the command by --linger {}: {}; killing {}",
        left.len(),
        if left.len() == 1 { "" } else { "es" },
        humantime::format_duration(limit),
        left.join(", "),
        if left.len() == 1 { "it" } else { "them" }
    );
    kill_all(dir);
}

/// Kills every process in the cgroup and waits (briefly) for them to leave it.
fn kill_all(dir: &Path) {
    // cgroup.kill (5.14+) kills the whole tree at once, forks in flight included.
    if fs::write(dir.join("cgroup.kill"), "1").is_err() {
        for pid in cgroup_pids(dir) {
            // SAFETY: kill(2) has no memory preconditions.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    for _ in 0..250 {
        if cgroup_pids(dir).is_empty() {
            return;
        }
        std::thread::sleep(POLL);
    }
}

fn cgroup_pids(dir: &Path) -> Vec<i32> {
    cgroup::procs(dir)
        .into_iter()
        .map(|pid| pid as i32)
        .collect()
}

/// Waits for the child, passing on the signals that arrive meanwhile, and returns its
/// status and peak resident set (`ru_maxrss`).
fn wait_with_rusage(pid: u32) -> anyhow::Result<(std::process::ExitStatus, u64)> {
    let mut status = 0;
    // SAFETY: a zeroed rusage is valid for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        forward_pending(&[pid as i32]);
        // SAFETY: pid is our child; status and usage are valid for writing.
        let waited = unsafe { libc::wait4(pid as i32, &mut status, libc::WNOHANG, &mut usage) };
        if waited == pid as i32 {
            break;
        }
        if waited < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(err).context("waiting for the command");
            }
        }
        // Polling rather than blocking: a signal never waits behind a blocked wait4.
        std::thread::sleep(POLL);
    }
    Ok((
        std::process::ExitStatus::from_raw(status),
        usage.ru_maxrss.max(0) as u64 * 1024,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_pid_is_read_from_an_exec_cgroups_name() {
        assert_eq!(exec_agent_pid("exec-4242-fetch"), Some(4242));
        assert_eq!(exec_agent_pid("exec-4242-my-job"), Some(4242));
        assert_eq!(exec_agent_pid("exec-x-fetch"), None);
        assert_eq!(exec_agent_pid("ci-runner"), None);
    }
}
