//! The cgroup2 hierarchy: where it is mounted, which path a cgroup id names, and the kernel's
//! own `cpu.stat` accounting.
//!
//! A cgroup v2 id is the inode number of its directory (the root is 1), the same id that
//! `bpf_get_current_cgroup_id` returns in the programs.

use std::{
    fs,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::Arc,
};

use crate::{error::UserError, model::CpuStatUsec};

/// Finds the cgroup2 mount point in `/proc/self/mountinfo`.
pub fn find_cgroup2_mount() -> Result<PathBuf, UserError> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").map_err(|_| UserError::NoCgroup2)?;
    parse_cgroup2_mount(&mountinfo).ok_or(UserError::NoCgroup2)
}

/// Returns the mount point of the cgroup2 entry of a mountinfo text that sees the most of the
/// hierarchy (the first, on a tie).
///
/// A line reads `id parent major:minor root mount-point options [optional…] - fstype source
/// super-options`; the mount point is field 5 and the file system type follows the `-`. The
/// root (field 4) is relative to the reader's cgroup namespace: in a container with its own
/// namespace, the runtime's mount has root `/` and sees the container only, while the host's
/// hierarchy bind-mounted in (as the DaemonSet mounts it) has root `/../..`: above the
/// namespace's root, the whole node. A mount of a subtree (`/kubepods`) sees less than `/`.
pub fn parse_cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    parse_cgroup2_mount_entry(mountinfo).map(|(mount_point, _)| mount_point)
}

/// The chosen cgroup2 entry (see [`parse_cgroup2_mount`]): its mount point and its root, as
/// mountinfo gives it relative to the reader's cgroup namespace (`/`, `/..`, `/kubepods`).
fn parse_cgroup2_mount_entry(mountinfo: &str) -> Option<(PathBuf, String)> {
    // (mount point, file system type, root) of every entry, in mount order.
    let entries: Vec<(PathBuf, &str, &str)> = mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let mut fields = before.split_whitespace().skip(3);
            let root = fields.next()?;
            let mount_point = PathBuf::from(unescape_mountinfo(fields.next()?));
            Some((mount_point, after.split_whitespace().next()?, root))
        })
        .collect();
    let mut best: Option<(i64, &PathBuf, &str)> = None;
    for (index, (mount_point, fstype, root)) in entries.iter().enumerate() {
        // A mount a later one covers (at its place or above it) cannot be reached.
        let covered = entries[index + 1..]
            .iter()
            .any(|(later, _, _)| mount_point.starts_with(later));
        if *fstype != "cgroup2" || covered {
            continue;
        }
        let parts: Vec<&str> = root.split('/').filter(|part| !part.is_empty()).collect();
        let above = parts.iter().take_while(|part| **part == "..").count();
        let width = above as i64 - (parts.len() - above) as i64;
        if best.as_ref().is_none_or(|(widest, _, _)| width > *widest) {
            best = Some((width, mount_point, root));
        }
    }
    best.map(|(_, mount_point, root)| (mount_point.clone(), unescape_mountinfo(root)))
}

/// A path from `/proc/<tid>/cgroup` (relative to this process's cgroup namespace) as a path
/// under a mount whose root is `mount_root` (relative to the same namespace); `None` when it
/// lies outside that mount. In a pod, the host's hierarchy mounted in has root `/..` and a
/// worker outside the pod reads `/../w`: `/w` under the mount.
pub fn path_under_mount(proc_path: &str, mount_root: &str) -> Option<String> {
    let parts = |path: &str| -> Vec<String> {
        path.split('/')
            .filter(|part| !part.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let (path, root) = (parts(proc_path), parts(mount_root));
    let rest = path.strip_prefix(root.as_slice())?;
    Some(format!("/{}", rest.join("/")))
}

/// The root of the cgroup2 mount the agent uses, read once (mounts do not change under it).
fn cgroup2_mount_root() -> &'static str {
    static ROOT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        fs::read_to_string("/proc/self/mountinfo")
            .ok()
            .and_then(|mountinfo| parse_cgroup2_mount_entry(&mountinfo))
            .map_or_else(|| "/".to_owned(), |(_, root)| root)
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo` octal.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 4 <= bytes.len()
            && let Some(code) = std::str::from_utf8(&bytes[i + 1..i + 4])
                .ok()
                .and_then(|octal| u8::from_str_radix(octal, 8).ok())
        {
            out.push(code);
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// How cgroups are mounted on this host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CgroupLayout {
    /// Only cgroup2 (current distributions, systemd's default since v247).
    Unified,
    /// cgroup2 beside v1 controller hierarchies.
    Hybrid,
}

/// The layout of a mountinfo text: hybrid when any v1 hierarchy is mounted.
pub fn parse_cgroup_layout(mountinfo: &str) -> CgroupLayout {
    let v1 = mountinfo.lines().any(|line| {
        line.split_once(" - ")
            .and_then(|(_, after)| after.split_whitespace().next())
            == Some("cgroup")
    });
    if v1 {
        CgroupLayout::Hybrid
    } else {
        CgroupLayout::Unified
    }
}

/// This host's cgroup layout.
pub fn cgroup_layout() -> CgroupLayout {
    parse_cgroup_layout(&fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
}

/// Whether cgroup2 on this host has `controller` (false where v1 holds it, or without a
/// cgroup2 mount).
pub fn cgroup2_has_controller(controller: &str) -> bool {
    find_cgroup2_mount().is_ok_and(|mount| {
        read_controllers(&mount.join("cgroup.controllers"))
            .iter()
            .any(|c| c == controller)
    })
}

/// The controllers named in a cgroup's `cgroup.controllers` or `cgroup.subtree_control`.
pub fn read_controllers(file: &Path) -> Vec<String> {
    fs::read_to_string(file)
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Makes sure the cgroups the agent makes below `dir` get `controller` (e.g. memory): enables
/// it in `cgroup.subtree_control` of `dir` and of each ancestor up to `mount` that lacks it,
/// top down, as systemd does for its slices. `Ok(false)` when cgroup2 does not have the
/// controller at all (on hybrid hosts it is bound to v1); an error when the kernel refused.
pub fn enable_for_children(mount: &Path, dir: &Path, controller: &str) -> std::io::Result<bool> {
    if !read_controllers(&mount.join("cgroup.controllers"))
        .iter()
        .any(|c| c == controller)
    {
        return Ok(false);
    }
    let below = dir.strip_prefix(mount).unwrap_or(Path::new(""));
    let mut level = mount.to_path_buf();
    let mut levels = vec![level.clone()];
    for part in below.components() {
        level.push(part);
        levels.push(level.clone());
    }
    for level in levels {
        let control = level.join("cgroup.subtree_control");
        if read_controllers(&control).iter().any(|c| c == controller) {
            continue;
        }
        fs::write(&control, format!("+{controller}"))?;
    }
    Ok(true)
}

/// The id of a cgroup directory (cgroup2's, or a v1 hierarchy's): its inode number, the
/// kernfs node id the programs read.
pub fn cgroup_id(dir: &Path) -> std::io::Result<u64> {
    Ok(fs::metadata(dir)?.ino())
}

/// Maps cgroup ids to paths relative to the cgroup2 mount (`/` is the root), by walking the
/// hierarchy. Walks again only when asked about an id it has not seen.
#[derive(Debug)]
pub struct CgroupIndex {
    mount: PathBuf,
    /// Shared with every sample that names the cgroup: a clone is a count, not a copy.
    paths: crate::IdMap<Arc<str>>,
    /// Removed cgroups a walk no longer finds, oldest first: their path is still asked for
    /// (a worker removed inside a window is named in its report) until
    /// [`CgroupIndex::forget`], and at most [`MAX_GONE`] are kept for callers that never
    /// forget (`top`).
    gone: crate::IdMap<Arc<str>>,
    /// The ids of `gone`, oldest first (forgotten ones are skipped when evicting).
    gone_order: std::collections::VecDeque<u64>,
    /// When the hierarchy was last walked: walks are rate-limited, since the kernel's
    /// lifecycle events name new cgroups without one.
    last_walk: Option<std::time::Instant>,
}

/// Least time between two walks of the hierarchy for unknown ids.
const WALK_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// How many removed cgroups keep their path after a walk no longer finds them.
const MAX_GONE: usize = 16_384;

impl CgroupIndex {
    /// An index of the hierarchy mounted at `mount`, walked once now.
    pub fn new(mount: PathBuf) -> Self {
        let mut index = Self {
            mount,
            paths: crate::IdMap::default(),
            gone: crate::IdMap::default(),
            gone_order: std::collections::VecDeque::new(),
            last_walk: None,
        };
        index.rescan();
        index
    }

    /// Where the cgroup2 hierarchy is mounted.
    pub fn mount(&self) -> &Path {
        &self.mount
    }

    /// Walks the whole hierarchy again. A removed cgroup keeps its path until forgotten (or
    /// until [`MAX_GONE`] newer ones have gone): a walk cannot find it, but its last counters
    /// are still to be named.
    pub fn rescan(&mut self) {
        self.last_walk = Some(std::time::Instant::now());
        let before = std::mem::take(&mut self.paths);
        let mut stack = vec![self.mount.clone()];
        while let Some(dir) = stack.pop() {
            let Ok(meta) = fs::metadata(&dir) else {
                continue; // removed while we walked
            };
            let relative = dir.strip_prefix(&self.mount).unwrap_or(Path::new(""));
            self.paths.insert(
                meta.ino(),
                format!("/{}", relative.to_string_lossy()).into(),
            );
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
                    stack.push(entry.path());
                }
            }
        }
        for (id, path) in before {
            if !self.paths.contains_key(&id) {
                self.gone.insert(id, path);
                self.gone_order.push_back(id);
            }
        }
        while self.gone.len() > MAX_GONE
            && let Some(oldest) = self.gone_order.pop_front()
        {
            self.gone.remove(&oldest);
        }
        // Forgotten ids linger in the order until evicted: drop them once they are most of it.
        if self.gone_order.len() > 2 * self.gone.len() {
            let gone = &self.gone;
            self.gone_order.retain(|id| gone.contains_key(id));
        }
    }

    /// Learns a cgroup's path (from the kernel's lifecycle event), without a walk.
    pub fn insert(&mut self, id: u64, path: &str) {
        self.paths.insert(id, path.into());
    }

    /// Forgets a removed cgroup.
    pub fn forget(&mut self, id: u64) {
        if self.paths.remove(&id).is_none() {
            self.gone.remove(&id);
        }
    }

    /// The path of an id this index knows, alive or removed.
    fn path_of(&self, id: u64) -> Option<&Arc<str>> {
        self.paths.get(&id).or_else(|| self.gone.get(&id))
    }

    /// Walks again if an id is unknown and the last walk is not too recent.
    fn walk_for_unknown(&mut self, ids: &[u64]) {
        let recent = self.last_walk.is_some_and(|at| at.elapsed() < WALK_EVERY);
        if !recent && ids.iter().any(|&id| self.path_of(id).is_none()) {
            self.rescan();
        }
    }

    /// The path of a cgroup id, walking the hierarchy again if the id is new (at most every
    /// two seconds). `None` when the cgroup is gone or not found yet.
    pub fn resolve(&mut self, id: u64) -> Option<Arc<str>> {
        self.walk_for_unknown(&[id]);
        self.path_of(id).cloned()
    }

    /// Every known cgroup: id and path.
    pub fn known(&self) -> impl Iterator<Item = (u64, &str)> {
        self.paths.iter().map(|(&id, path)| (id, &**path))
    }

    /// The directory of a cgroup path relative to the mount.
    pub fn dir_of(&self, path: &str) -> PathBuf {
        self.mount.join(path.trim_start_matches('/'))
    }
}

/// Parses the text of a `cpu.stat` file.
pub fn parse_cpu_stat(text: &str) -> Option<CpuStatUsec> {
    let mut stat = CpuStatUsec::default();
    let mut seen = 0;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(' ') else {
            continue;
        };
        let slot = match key {
            "usage_usec" => &mut stat.usage_usec,
            "user_usec" => &mut stat.user_usec,
            "system_usec" => &mut stat.system_usec,
            _ => continue,
        };
        *slot = value.trim().parse().ok()?;
        seen += 1;
    }
    (seen == 3).then_some(stat)
}

/// Reads `cpu.stat` of a cgroup directory.
pub fn read_cpu_stat(dir: &Path) -> Option<CpuStatUsec> {
    parse_cpu_stat(&fs::read_to_string(dir.join("cpu.stat")).ok()?)
}

/// A command line as /proc/PID/cmdline and the exec event give it (arguments each ended by a
/// NUL), with spaces between the arguments, as `--process` rules match it.
pub fn command_from_args(args: &[u8]) -> String {
    args.split(|&byte| byte == 0)
        .filter(|arg| !arg.is_empty())
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A running process's command line (`None`: empty, as a kernel thread's, or unreadable).
pub fn command_line(pid: u32) -> Option<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .map(|args| command_from_args(&args))
        .filter(|command| !command.is_empty())
}

/// Every process running now: (pid, parent pid, command line, `None` when empty or
/// unreadable), from /proc. One that ends while it is read, and zombies, are left out.
pub fn running_processes() -> Vec<(u32, u32, Option<String>)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = read_stat(pid)?;
            let mut fields = stat_fields_after_name(&stat)?;
            // A zombie (or one being reaped) has ended already: no thread of it will.
            if matches!(fields.next()?, "Z" | "X" | "x") {
                return None;
            }
            let parent_pid = fields.next()?.parse().ok()?;
            Some((pid, parent_pid, command_line(pid)))
        })
        .collect()
}

/// CPU time of a process's running threads, ns (the first field of each thread's
/// schedstat), leaving out its main thread when `without_main` (ended, waiting to be reaped);
/// 0 for a process gone.
pub fn read_process_threads_runtime_ns(pid: u32, without_main: bool) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| task.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&tid| !(without_main && tid == pid))
        .filter_map(|tid| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).ok()?;
            text.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

/// A thread's CPU time so far (`se.sum_exec_runtime`, including the slice it is running now),
/// from the first field of `/proc/<tid>/schedstat`.
pub fn read_thread_runtime_ns(tid: u32) -> Option<u64> {
    let text = fs::read_to_string(format!("/proc/{tid}/schedstat")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// `/proc/<id>/stat` of a process or thread (`None` when gone). Its command name may not be
/// UTF-8: it is kept lossily, and the fields after it are plain numbers and letters.
fn read_stat(id: u32) -> Option<String> {
    let bytes = fs::read(format!("/proc/{id}/stat")).ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The fields of a `/proc/<id>/stat` text from the state (the 3rd) on: the command name
/// before them may hold spaces and parentheses, so they follow its last `)`.
fn stat_fields_after_name(text: &str) -> Option<std::str::SplitWhitespace<'_>> {
    Some(text.get(text.rfind(')')? + 1..)?.split_whitespace())
}

/// The CPU a thread is running on, from `/proc/<tid>/stat`: `None` when it is not running
/// (not in state R) or is gone. A runnable thread waiting for its CPU reads as running there.
pub fn read_thread_running_cpu(tid: u32) -> Option<usize> {
    parse_stat_running_cpu(&read_stat(tid)?)
}

/// The `processor` field (the 39th) of a `/proc/<tid>/stat` text whose state (the 3rd) is R.
pub fn parse_stat_running_cpu(text: &str) -> Option<usize> {
    let mut fields = stat_fields_after_name(text)?;
    if fields.next()? != "R" {
        return None;
    }
    fields.nth(39 - 4)?.parse().ok()
}

/// A thread's cgroup2 path (relative to the mount) from `/proc/<tid>/cgroup`, translated from
/// this process's cgroup namespace to the mount's root (they differ in a pod).
pub fn read_thread_cgroup2_path(tid: u32) -> Option<String> {
    let path = parse_cgroup2_membership(&fs::read_to_string(format!("/proc/{tid}/cgroup")).ok()?)?;
    path_under_mount(&path, cgroup2_mount_root())
}

/// The path of the `0::<path>` line of a `/proc/<pid>/cgroup` text.
pub fn parse_cgroup2_membership(text: &str) -> Option<String> {
    text.lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(|path| path.trim_end_matches(" (deleted)").to_string())
}

/// Starts `command` inside the cgroup at `dir`: the child moves itself there between fork and
/// exec, so everything it runs, exec included, is the cgroup's.
pub fn spawn_in_cgroup(
    command: &mut std::process::Command,
    dir: &Path,
) -> std::io::Result<std::process::Child> {
    spawn_in_cgroups(command, &[dir])
}

/// Like [`spawn_in_cgroup`], joining every cgroup in `dirs` (e.g. a cgroup2 directory and, on
/// hybrid hosts, a v1 memory cgroup).
pub fn spawn_in_cgroups(
    command: &mut std::process::Command,
    dirs: &[&Path],
) -> std::io::Result<std::process::Child> {
    use std::os::{fd::AsRawFd as _, unix::process::CommandExt as _};

    let procs = dirs
        .iter()
        .map(|dir| {
            fs::OpenOptions::new()
                .write(true)
                .open(dir.join("cgroup.procs"))
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let fds: Vec<i32> = procs.iter().map(|file| file.as_raw_fd()).collect();
    // SAFETY: the closure only calls write(2), which is async-signal-safe, on fds opened
    // before the fork; it allocates nothing.
    unsafe {
        command.pre_exec(move || {
            for &fd in &fds {
                // "0" moves the writing process.
                if libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = command.spawn();
    drop(procs);
    child
}

/// The processes in a cgroup (`cgroup.procs`); none when it cannot be read.
pub fn procs(dir: &Path) -> Vec<u32> {
    parse_procs(&fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default())
}

/// The pids of a `cgroup.procs` text.
pub fn parse_procs(text: &str) -> Vec<u32> {
    text.lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}

/// Removes a cgroup directory, waiting briefly for exiting processes to leave it.
pub fn remove_cgroup(dir: &Path) -> std::io::Result<()> {
    let mut last = Ok(());
    for _ in 0..50 {
        last = fs::remove_dir(dir);
        match &last {
            Ok(()) => return Ok(()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_are_joined_with_spaces() {
        assert_eq!(
            command_from_args(b"python\0-c\0print(1)\0"),
            "python -c print(1)"
        );
        assert_eq!(command_from_args(b""), "");
    }

    #[test]
    fn a_removed_cgroup_keeps_its_path_across_walks_until_forgotten() {
        let mount = std::env::temp_dir().join(format!("wp-index-{}", std::process::id()));
        fs::create_dir_all(mount.join("alive")).expect("makes a directory");
        let mut index = CgroupIndex::new(mount.clone());
        let alive = cgroup_id(&mount.join("alive")).expect("has an inode");
        // An id the kernel named in a lifecycle event, whose directory is already gone.
        let removed = u64::MAX - 1;
        index.insert(removed, "/short-lived");
        index.rescan();
        assert_eq!(index.resolve(alive).as_deref(), Some("/alive"));
        assert_eq!(index.resolve(removed).as_deref(), Some("/short-lived"));
        index.rescan();
        assert_eq!(index.resolve(removed).as_deref(), Some("/short-lived"));
        index.forget(removed);
        assert_eq!(index.path_of(removed), None);
        // Bounded for callers that never forget.
        for id in 0..(MAX_GONE as u64 + 10) {
            index.insert(u64::MAX - 10 - id, "/gone");
        }
        index.rescan();
        assert_eq!(index.gone.len(), MAX_GONE);
        assert!(index.gone_order.len() <= 2 * MAX_GONE);
        fs::remove_dir_all(&mount).expect("cleans up");
    }

    #[test]
    fn finds_hybrid_cgroup2_mount() {
        let mountinfo = "\
35 31 0:31 / /sys/fs/cgroup/cpu rw,relatime shared:14 - cgroup cgroup rw,cpu
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw
";
        assert_eq!(
            parse_cgroup2_mount(mountinfo),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
    }

    #[test]
    fn finds_unified_mount_with_optional_fields_and_escapes() {
        let mountinfo = "29 23 0:26 / /sys/fs/cg\\040root rw,nosuid shared:4 master:1 - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            parse_cgroup2_mount(mountinfo),
            Some(PathBuf::from("/sys/fs/cg root"))
        );
    }

    #[test]
    fn in_a_container_the_hosts_hierarchy_is_chosen_over_the_containers_own() {
        // A pod with its own cgroup namespace: the runtime's mount sees the container, the
        // host's /sys/fs/cgroup mounted at /host/sys/fs/cgroup sees the node.
        let mountinfo = "\
1500 1400 0:26 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw,nsdelegate
1501 1400 0:26 /../../.. /host/sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw,nsdelegate
1502 1400 0:26 /kubepods.slice /mnt/pods ro - cgroup2 cgroup2 rw
";
        assert_eq!(
            parse_cgroup2_mount(mountinfo),
            Some(PathBuf::from("/host/sys/fs/cgroup"))
        );
        // Mounting the pod's own hierarchy over /sys/fs/cgroup hides a hybrid host's
        // /sys/fs/cgroup/unified, which mountinfo still lists (first, and as wide).
        let covered = "\
61 51 0:38 /.. /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
71 46 0:38 /.. /host/sys/fs/cgroup ro,relatime - cgroup2 cgroup2 rw
72 51 0:38 / /sys/fs/cgroup rw,relatime - cgroup2 none rw
";
        assert_eq!(
            parse_cgroup2_mount(covered),
            Some(PathBuf::from("/host/sys/fs/cgroup"))
        );
        assert_eq!(
            parse_cgroup2_mount_entry(covered)
                .map(|(_, root)| root)
                .as_deref(),
            Some("/..")
        );
        // A thread outside the pod, as the pod's /proc shows it, under that mount.
        assert_eq!(path_under_mount("/../w/x", "/..").as_deref(), Some("/w/x"));
        assert_eq!(path_under_mount("/w", "/").as_deref(), Some("/w"));
        assert_eq!(path_under_mount("/", "/").as_deref(), Some("/"));
        assert_eq!(
            path_under_mount("/kubepods/p1", "/kubepods").as_deref(),
            Some("/p1")
        );
        assert_eq!(path_under_mount("/other", "/kubepods"), None);
        let subtree_first = "1502 1400 0:26 /kubepods.slice /mnt/pods ro - cgroup2 cgroup2 rw\n1500 1400 0:26 / /sys/fs/cgroup ro - cgroup2 cgroup rw\n";
        assert_eq!(
            parse_cgroup2_mount(subtree_first),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
    }

    #[test]
    fn tells_hybrid_from_unified() {
        let hybrid = "35 31 0:31 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
        assert_eq!(parse_cgroup_layout(hybrid), CgroupLayout::Hybrid);
        let unified = "29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(parse_cgroup_layout(unified), CgroupLayout::Unified);
    }

    #[test]
    fn no_cgroup2_is_none() {
        assert_eq!(
            parse_cgroup2_mount("1 0 0:1 / / rw - ext4 /dev/vda rw\n"),
            None
        );
    }

    #[test]
    fn reads_cgroup2_membership() {
        let text = "4:memory:/x\n1:cpu:/\n0::/workers/job-1\n";
        assert_eq!(
            parse_cgroup2_membership(text),
            Some("/workers/job-1".into())
        );
        assert_eq!(parse_cgroup2_membership("4:memory:/x\n"), None);
    }

    #[test]
    fn parses_cpu_stat() {
        let text = "usage_usec 100\nuser_usec 60\nsystem_usec 40\nnice_usec 0\n";
        assert_eq!(
            parse_cpu_stat(text),
            Some(CpuStatUsec {
                usage_usec: 100,
                user_usec: 60,
                system_usec: 40
            })
        );
        assert_eq!(parse_cpu_stat("usage_usec x\n"), None);
    }

    #[test]
    fn reads_the_cpu_of_a_running_thread_from_its_stat() {
        // From a real /proc/self/stat, its command renamed to one with spaces and parentheses.
        let tail = "23640 23640 6587 0 -1 4194304 100 0 0 0 0 0 0 0 20 0 1 0 1393557 3133440 388 \
                    18446744073709551615 94738114576384 94738114596265 140721202179712 0 0 0 0 0 0 \
                    0 0 0 17 1 0 0 0 0 0 94738114612272 94738114613888 94738934366208 \
                    140721202182873 140721202182893 140721202182893 140721202184171 0";
        let running = format!("23643 (a (b) c) R {tail}");
        assert_eq!(parse_stat_running_cpu(&running), Some(1));
        let asleep = format!("23643 (a (b) c) S {tail}");
        assert_eq!(parse_stat_running_cpu(&asleep), None);
        assert_eq!(parse_stat_running_cpu("23643 (cat) R 1 2"), None);
        assert_eq!(parse_stat_running_cpu(""), None);
    }

    #[test]
    fn a_running_thread_named_in_bytes_that_are_not_utf8_is_found_on_its_cpu() {
        let found = std::thread::spawn(|| {
            // SAFETY: plain system calls on this thread; the name is a C string.
            unsafe {
                let cpu = libc::sched_getcpu() as usize;
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                // Pinned, it stays on `cpu` while it reads its own stat.
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                libc::prctl(libc::PR_SET_NAME, c"wp\xff\xfe) R".as_ptr());
                (read_thread_running_cpu(libc::gettid() as u32), cpu)
            }
        })
        .join()
        .expect("thread");
        assert_eq!(found.0, Some(found.1));
    }
}
