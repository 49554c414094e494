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
    collect::KernelCollector,
    error::UserError,
    loader,
    memory::{self, MemoryReader},
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
        if fs::create_dir(&v2).is_err() {
            return Err(UserError::NoWritableCgroup2(mount.to_path_buf()).into());
        }
        // Best effort: without it the memory figure falls back to sampled RSS.
        let v1_memory = v1_memory_mount.and_then(|v1| {
            let dir = v1.join("workerprobe").join(leaf);
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

impl Drop for ExecCgroups {
    fn drop(&mut self) {
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
    // Load first: a user without privileges learns it before anything is made.
    let probe = loader::load_and_attach(&args.probe.load_options())?;
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
    // Like a shell waiting for a foreground job: Ctrl-C and Ctrl-\ are for the command; we
    // stay to report how it ended.
    ignore_terminal_signals();
    let (status, max_rss_bytes) = wait_with_rusage(child.id())?;
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
    drop(cgroups);
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

fn ignore_terminal_signals() {
    // SAFETY: setting a signal's disposition to SIG_IGN has no preconditions.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
    }
}

/// Waits for the child and returns its status and peak resident set (`ru_maxrss`).
fn wait_with_rusage(pid: u32) -> anyhow::Result<(std::process::ExitStatus, u64)> {
    let mut status = 0;
    // SAFETY: a zeroed rusage is valid for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: pid is our child; status and usage are valid for writing.
        let waited = unsafe { libc::wait4(pid as i32, &mut status, 0, &mut usage) };
        if waited == pid as i32 {
            break;
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err).context("waiting for the command");
        }
    }
    Ok((
        std::process::ExitStatus::from_raw(status),
        usage.ru_maxrss.max(0) as u64 * 1024,
    ))
}
