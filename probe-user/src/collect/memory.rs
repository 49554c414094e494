//! Memory of a worker, from the best source the host has: cgroup v2 `memory.current` /
//! `memory.peak` (before 5.19, `memory.current` sampled); on hybrid hosts the v1 memory
//! cgroup of the worker's processes, when it holds only them; failing both, the summed RSS
//! of its processes (the process walk's sum where it runs, else /proc/PID/statm).
//!
//! Read every interval for every active worker, so each source costs as little as it can:
//! no lookups of files a host cannot have, memberships and shared lists reused for a while,
//! and the files read every interval kept open ([`KeptFiles`]). At 1,000 workers on a hybrid
//! host, six opens per worker per second were most of the agent's CPU.

use std::{
    collections::HashMap,
    fs,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use super::{kept_files::KeptFiles, memory_walk::WalkedProcesses};
use crate::model::{Interval, MemoryReading, MemorySource};

/// Reads workers' memory.
pub struct MemoryReader {
    /// The v1 memory controller's mount, on hybrid hosts.
    v1_memory_mount: Option<PathBuf>,
    /// Whether the cgroup2 hierarchy can have the memory controller (false where v1 holds
    /// it): without it no `memory.current` is looked for.
    v2_memory: bool,
    /// The id (its directory's inode) of the v1 memory controller's root cgroup.
    v1_root_id: Option<u64>,
    /// Each process's v1 memory cgroup as `/proc/PID/cgroup` said it, reused for
    /// [`MEMBERSHIP_FRESH`] (a process rarely moves).
    v1_membership: HashMap<u32, (Instant, Option<V1Cgroup>)>,
    /// v1 memory cgroups' process lists, each read at most once per [`V1_PROCS_FRESH`]: many
    /// workers' processes often share one (a session's), and listing it per worker per tick
    /// cost the agent most of a core at 1,000 workers.
    v1_procs: HashMap<PathBuf, (Instant, Arc<Vec<u32>>)>,
    /// v1 memory cgroups (by id) found holding processes of more than one worker (or of
    /// none), when: not listed again for [`V1_SHARED_FRESH`]. Workers' process lists are
    /// disjoint, so such a cgroup is no worker's alone; the session's cgroup that holds every
    /// process a shell started was listed twice a second for nothing.
    v1_shared: crate::IdMap<Instant>,
    /// The files read every interval, kept open.
    files: KeptFiles,
    /// Workers (by cgroup id) whose memory was found to be their processes' resident sets,
    /// and when: for [`V1_SHARED_FRESH`] the process walk's sum is taken without a look for a
    /// v1 memory cgroup of their own.
    rss_chosen: crate::IdMap<Instant>,
    /// When stale entries of `rss_chosen` were last dropped.
    rss_chosen_pruned_at: Instant,
}

/// A v1 memory cgroup: its path under the controller's mount and its id (its directory's
/// inode, the id the process walk names it by).
#[derive(Clone, Debug)]
struct V1Cgroup {
    path: String,
    id: u64,
}

/// What a sample's walks found, by cgroup id (see the collector's `take_walked_memory`).
#[derive(Debug, Default)]
pub struct WalkedMemory {
    /// The memory walk's counters of every cgroup with a memory controller of its own.
    pub cgroups: Option<crate::IdMap<MemoryReading>>,
    /// The process walk's resident sets, summed for every cgroup that holds a process.
    pub processes: Option<crate::IdMap<WalkedProcesses>>,
}

/// How long a v1 memory cgroup's process list is reused: a cgroup a worker owns is dropped
/// this soon after another process joins it.
const V1_PROCS_FRESH: Duration = Duration::from_millis(500);
/// How long a v1 memory cgroup found shared stays so without a look: one that a worker comes
/// to own alone is read as the worker's memory this late (its RSS is shown meanwhile). A
/// session's cgroup holding a thousand workers' processes took a sixtieth of the agent's CPU
/// to list every 10 s.
const V1_SHARED_FRESH: Duration = Duration::from_secs(30);
/// How long a process's v1 memory cgroup is reused. A stale one is safe: the cgroup's own
/// process list is checked against the worker's every [`V1_PROCS_FRESH`].
const MEMBERSHIP_FRESH: Duration = Duration::from_secs(30);
/// Processes whose v1 memory cgroup is remembered before stale ones are dropped.
const MEMBERSHIPS_KEPT: usize = 1 << 16;

impl MemoryReader {
    /// A reader for this host.
    pub fn new() -> Self {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let v1_memory_mount = parse_cgroup1_memory_mount(&mountinfo);
        // A controller bound to v1 cannot be in v2: no cgroup2 directory has memory files.
        let v2_memory = v1_memory_mount.is_none()
            || crate::cgroup::parse_cgroup2_mount(&mountinfo).is_some_and(|mount| {
                fs::read_to_string(mount.join("cgroup.controllers"))
                    .is_ok_and(|controllers| controllers.split_whitespace().any(|c| c == "memory"))
            });
        let v1_root_id = v1_memory_mount
            .as_deref()
            .and_then(|mount| crate::cgroup::cgroup_id(mount).ok());
        Self {
            v1_memory_mount,
            v2_memory,
            v1_root_id,
            v1_membership: HashMap::new(),
            v1_procs: HashMap::new(),
            v1_shared: crate::IdMap::default(),
            files: KeptFiles::new(),
            rss_chosen: crate::IdMap::default(),
            rss_chosen_pruned_at: Instant::now(),
        }
    }

    /// Where the v1 memory controller is mounted, if it is.
    pub fn v1_memory_mount(&self) -> Option<&Path> {
        self.v1_memory_mount.as_deref()
    }

    /// Memory of the worker whose cgroup2 directory is `dir`; `None` when it has no
    /// processes and no cgroup2 memory files.
    pub fn read(&mut self, dir: &Path) -> Option<MemoryReading> {
        self.read_files(|| dir, None)
    }

    /// As [`MemoryReader::read`], with the process walk's resident sets (`rss`: the readings
    /// of every cgroup holding a process, and the worker's cgroup id) where it ran. The
    /// directory is made only if a file is read: the walk's sum needs none.
    fn read_files<D: AsRef<Path>>(
        &mut self,
        dir: impl FnOnce() -> D,
        rss: Option<(&crate::IdMap<WalkedProcesses>, u64)>,
    ) -> Option<MemoryReading> {
        let dir = std::cell::LazyCell::new(dir);
        if self.v2_memory
            && let Some(current_bytes) = self.read_u64(&dir.as_ref().join("memory.current"))
        {
            return Some(match self.read_u64(&dir.as_ref().join("memory.peak")) {
                Some(peak_bytes) => MemoryReading {
                    current_bytes,
                    peak_bytes,
                    source: MemorySource::Cgroup2,
                },
                // memory.peak arrived in 5.19: the model keeps the highest sample instead.
                None => MemoryReading {
                    current_bytes,
                    peak_bytes: current_bytes,
                    source: MemorySource::Cgroup2Current,
                },
            });
        }
        if let Some(reading) = self.walked_rss(rss) {
            return Some(reading);
        }
        let now = Instant::now();
        let pids = self
            .files
            .read(&dir.as_ref().join("cgroup.procs"))
            .map(crate::cgroup::parse_procs)
            .unwrap_or_default();
        if pids.is_empty() {
            return None;
        }
        if let Some(reading) = self.read_v1(&pids) {
            return Some(reading);
        }
        if let Some((walked, cgroup_id)) = rss {
            self.choose_rss(cgroup_id, now);
            if let Some(found) = walked.get(&cgroup_id) {
                return Some(found.reading);
            }
        }
        let rss = self.rss_bytes(&pids);
        Some(MemoryReading {
            current_bytes: rss,
            peak_bytes: rss,
            source: MemorySource::Rss,
        })
    }

    /// The process walk's sum for the worker, where it is known to be its memory: found to be
    /// its processes' a moment ago, or one of its processes is in a v1 memory cgroup known
    /// not to be its own (then without its process list). One the walk lacks (no process,
    /// or the walk failed) is left to the files.
    fn walked_rss(
        &mut self,
        rss: Option<(&crate::IdMap<WalkedProcesses>, u64)>,
    ) -> Option<MemoryReading> {
        let (walked, cgroup_id) = rss?;
        let found = walked.get(&cgroup_id)?;
        let now = Instant::now();
        let chosen = self
            .rss_chosen
            .get(&cgroup_id)
            .is_some_and(|at| now.duration_since(*at) < V1_SHARED_FRESH);
        if !chosen && !self.v1_known_not_own(found, now) {
            return None;
        }
        if !chosen {
            self.choose_rss(cgroup_id, now);
        }
        Some(found.reading)
    }

    /// Reads the memory of the workers active in `interval` (the ones a table shows) into
    /// them: from `walked` (the collector's walks) where it has the worker, else from its
    /// files; `dir_of` maps a worker's path to its cgroup2 directory. Idle workers are not
    /// read, so a node of many idle cgroups costs nothing here.
    pub fn read_active(
        &mut self,
        interval: &mut Interval,
        walked: &WalkedMemory,
        mut dir_of: impl FnMut(&str) -> PathBuf,
    ) {
        for worker in interval.workers.iter_mut().filter(|w| w.is_active()) {
            if let Some(path) = &worker.path {
                worker.memory = self.read_worker(worker.cgroup_id, path, walked, &mut dir_of);
            }
        }
        self.files.end_pass();
    }

    /// Memory of the worker `cgroup_id` at `path`: the memory walk's reading where `walked`
    /// has it, else from its files, with the process walk's resident sets where it ran
    /// (`dir_of` maps the path to its cgroup2 directory). The root is always read from its
    /// processes: it has no memory files.
    pub fn read_worker(
        &mut self,
        cgroup_id: u64,
        path: &str,
        walked: &WalkedMemory,
        dir_of: &mut impl FnMut(&str) -> PathBuf,
    ) -> Option<MemoryReading> {
        let from_walk = walked
            .cgroups
            .as_ref()
            .filter(|_| path != "/")
            .and_then(|walked| walked.get(&cgroup_id));
        match from_walk {
            Some(reading) => Some(*reading),
            None => {
                let rss = walked.processes.as_ref().map(|walked| (walked, cgroup_id));
                self.read_files(|| dir_of(path), rss)
            }
        }
    }

    /// Notes that the worker's memory is its processes' resident sets (dropping, at most once
    /// per [`V1_SHARED_FRESH`], the notes of workers not read since).
    fn choose_rss(&mut self, cgroup_id: u64, now: Instant) {
        if now.duration_since(self.rss_chosen_pruned_at) >= V1_SHARED_FRESH {
            self.rss_chosen
                .retain(|_, at| now.duration_since(*at) < V1_SHARED_FRESH);
            self.rss_chosen_pruned_at = now;
        }
        self.rss_chosen.insert(cgroup_id, now);
    }

    /// Whether the v1 memory cgroup of the walk's process is known to be no worker's own (the
    /// root, or found shared less than [`V1_SHARED_FRESH`] ago), or there is no v1 memory
    /// controller: then the files would give its worker's resident sets too. The walk names
    /// the cgroup where the kernel has the fields; else /proc/PID/cgroup does (a read per
    /// worker per [`MEMBERSHIP_FRESH`], most of this reader's cost at 1,000 workers).
    fn v1_known_not_own(&mut self, found: &WalkedProcesses, now: Instant) -> bool {
        if self.v1_memory_mount.is_none() {
            return true;
        }
        let id = match found.memory_cgroup_id {
            Some(id) => id,
            None => match self.v1_membership_of(found.pid) {
                Some(v1_cgroup) => v1_cgroup.id,
                None => return false,
            },
        };
        Some(id) == self.v1_root_id || self.v1_shared_now(id, now)
    }

    /// Whether v1 memory cgroup `id` was found shared less than [`V1_SHARED_FRESH`] ago.
    fn v1_shared_now(&self, id: u64, now: Instant) -> bool {
        self.v1_shared
            .get(&id)
            .is_some_and(|found_at| now.duration_since(*found_at) < V1_SHARED_FRESH)
    }

    /// The v1 memory cgroup of the worker's processes, if it holds nothing else.
    fn read_v1(&mut self, pids: &[u32]) -> Option<MemoryReading> {
        let mount = self.v1_memory_mount.clone()?;
        let v1_cgroup = self.v1_membership_of(pids[0])?;
        // The root memory cgroup holds every process placed nowhere else: never one worker's
        // alone, and listing it would cost a read of every pid on the host per worker.
        if Some(v1_cgroup.id) == self.v1_root_id {
            return None;
        }
        let now = Instant::now();
        if self.v1_shared_now(v1_cgroup.id, now) {
            return None;
        }
        let v1_dir = mount.join(v1_cgroup.path.trim_start_matches('/'));
        let v1_pids = self.v1_procs_of(&v1_dir);
        if v1_pids.is_empty() {
            return None;
        }
        // A memory cgroup shared with other processes would not be this worker's memory.
        if v1_pids.len() > pids.len() || !v1_pids.iter().all(|pid| pids.contains(pid)) {
            if self.v1_shared.len() > 4096 {
                self.v1_shared
                    .retain(|_, found_at| now.duration_since(*found_at) < V1_SHARED_FRESH);
            }
            self.v1_shared.insert(v1_cgroup.id, now);
            return None;
        }
        v1_reading(&v1_dir, |path| self.read_u64(path))
    }

    /// A file holding one number, through the kept files.
    fn read_u64(&mut self, path: &Path) -> Option<u64> {
        self.files.read(path)?.trim().parse().ok()
    }

    /// The v1 memory cgroup of process `pid`, as read at most [`MEMBERSHIP_FRESH`] ago.
    fn v1_membership_of(&mut self, pid: u32) -> Option<V1Cgroup> {
        let now = Instant::now();
        if let Some((read_at, path)) = self.v1_membership.get(&pid)
            && now.duration_since(*read_at) < MEMBERSHIP_FRESH
        {
            return path.clone();
        }
        if self.v1_membership.len() >= MEMBERSHIPS_KEPT {
            self.v1_membership
                .retain(|_, (read_at, _)| now.duration_since(*read_at) < MEMBERSHIP_FRESH);
        }
        let v1_cgroup = fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .ok()
            .and_then(|membership| parse_v1_memory_membership(&membership))
            .and_then(|path| {
                let mount = self.v1_memory_mount.as_deref()?;
                let id = crate::cgroup::cgroup_id(&mount.join(path.trim_start_matches('/')));
                Some(V1Cgroup { id: id.ok()?, path })
            });
        self.v1_membership.insert(pid, (now, v1_cgroup.clone()));
        v1_cgroup
    }

    /// The processes of a v1 memory cgroup, as read at most [`V1_PROCS_FRESH`] ago.
    fn v1_procs_of(&mut self, dir: &Path) -> Arc<Vec<u32>> {
        let now = Instant::now();
        if let Some((read_at, pids)) = self.v1_procs.get(dir)
            && now.duration_since(*read_at) < V1_PROCS_FRESH
        {
            return Arc::clone(pids);
        }
        // Bounded: stale entries go whenever the map grows large.
        if self.v1_procs.len() > 4096 {
            self.v1_procs
                .retain(|_, (read_at, _)| now.duration_since(*read_at) < V1_PROCS_FRESH);
        }
        let pids = Arc::new(crate::cgroup::procs(dir));
        self.v1_procs
            .insert(dir.to_path_buf(), (now, Arc::clone(&pids)));
        pids
    }

    /// The processes' summed resident sets: /proc/PID/statm's second field, the counters
    /// VmRSS adds (one small read per process).
    fn rss_bytes(&mut self, pids: &[u32]) -> u64 {
        pids.iter()
            .filter_map(|pid| {
                let statm = self.files.read(Path::new(&format!("/proc/{pid}/statm")))?;
                statm.split_whitespace().nth(1)?.parse::<u64>().ok()
            })
            .map(|pages| pages * page_bytes())
            .sum()
    }
}

impl Default for MemoryReader {
    fn default() -> Self {
        Self::new()
    }
}

/// Reads a v1 memory cgroup directory's usage and peak.
pub fn read_v1_dir(dir: &Path) -> Option<MemoryReading> {
    v1_reading(dir, read_u64)
}

/// A v1 memory cgroup directory's usage and peak, each file read by `read_u64`.
fn v1_reading(dir: &Path, mut read_u64: impl FnMut(&Path) -> Option<u64>) -> Option<MemoryReading> {
    Some(MemoryReading {
        current_bytes: read_u64(&dir.join("memory.usage_in_bytes"))?,
        peak_bytes: read_u64(&dir.join("memory.max_usage_in_bytes"))?,
        source: MemorySource::Cgroup1,
    })
}

/// Bytes in a page of this system, for the kernel's page counts.
pub fn page_bytes() -> u64 {
    // SAFETY: sysconf reads a constant of the running system.
    let bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(bytes).ok().filter(|&b| b > 0).unwrap_or(4096)
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The mount point of the v1 `memory` controller in a mountinfo text.
pub fn parse_cgroup1_memory_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let mut fields = after.split_whitespace();
        if fields.next()? != "cgroup" {
            return None;
        }
        let super_options = fields.nth(1)?;
        if !super_options.split(',').any(|option| option == "memory") {
            return None;
        }
        Some(PathBuf::from(before.split_whitespace().nth(4)?))
    })
}

/// The v1 memory cgroup path in a `/proc/<pid>/cgroup` text (`N:memory:/path`).
pub fn parse_v1_memory_membership(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let _id = parts.next()?;
        let controllers = parts.next()?;
        let path = parts.next()?;
        controllers
            .split(',')
            .any(|controller| controller == "memory")
            .then(|| path.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_v1_memory_mount() {
        let mountinfo = "\
35 31 0:31 / /sys/fs/cgroup/cpu rw,relatime shared:14 - cgroup cgroup rw,cpu
38 31 0:34 / /sys/fs/cgroup/memory rw,relatime shared:17 - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw
";
        assert_eq!(
            parse_cgroup1_memory_mount(mountinfo),
            Some(PathBuf::from("/sys/fs/cgroup/memory"))
        );
        assert_eq!(
            parse_cgroup1_memory_mount("41 31 0:38 / /x rw - cgroup2 cgroup2 rw\n"),
            None
        );
    }

    #[test]
    fn finds_the_v1_memory_membership() {
        let text = "9:name=systemd:/\n4:memory:/jobs/a\n0::/w\n";
        assert_eq!(parse_v1_memory_membership(text), Some("/jobs/a".into()));
        assert_eq!(parse_v1_memory_membership("0::/w\n"), None);
    }
}
