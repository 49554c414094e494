//! Memory read by one iterator walk a sample instead of files per worker:
//!
//! - the memory walk: every cgroup's memory controller counters (what `memory.current` and
//!   `memory.peak` show), where cgroup2 has the controller: at 1,000 workers, two files per
//!   worker were a third of the agent's CPU;
//! - the process walk: every process's resident pages summed by cgroup, where it does not
//!   (hybrid hosts): each worker's process list and each process's statm file were half.

use std::os::fd::AsFd as _;

use anyhow::Context as _;
use aya::maps::{IterableMap as _, MapData};
use probe_common::memory::{MemoryNow, RssNow};

use super::batch::PerCpuEntries;

use crate::{
    loader::iter_walk::IterWalk,
    model::{MemoryReading, MemorySource},
};

/// What a walk writes per cgroup, stamped with the walk that wrote it.
pub trait WalkEntry: aya::Pod + Copy {
    /// What a read keeps of an entry.
    type Found;
    /// The walk (the iterator session's id) that wrote the entry.
    fn walk(&self) -> u64;
    /// What it tells, with pages of `page_bytes`.
    fn found(&self, page_bytes: u64) -> Self::Found;
}

/// A cgroup's processes as the process walk found them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalkedProcesses {
    /// Their resident sets, summed.
    pub reading: MemoryReading,
    /// One of them.
    pub pid: u32,
    /// The cgroup holding `pid`'s memory controller state, where the kernel told it (on
    /// hybrid hosts its v1 memory cgroup: the inode of its directory).
    pub memory_cgroup_id: Option<u64>,
}

impl WalkEntry for MemoryNow {
    type Found = MemoryReading;
    fn walk(&self) -> u64 {
        self.walk
    }
    fn found(&self, page_bytes: u64) -> MemoryReading {
        MemoryReading {
            current_bytes: self.current_pages * page_bytes,
            peak_bytes: self.peak_pages * page_bytes,
            source: MemorySource::Cgroup2,
        }
    }
}

impl WalkEntry for RssNow {
    type Found = WalkedProcesses;
    fn walk(&self) -> u64 {
        self.walk
    }
    fn found(&self, page_bytes: u64) -> WalkedProcesses {
        let rss_bytes = self.rss_pages * page_bytes;
        WalkedProcesses {
            reading: MemoryReading {
                current_bytes: rss_bytes,
                peak_bytes: rss_bytes,
                source: MemorySource::Rss,
            },
            pid: self.pid,
            memory_cgroup_id: (self.memory_cgroup_id != 0).then_some(self.memory_cgroup_id),
        }
    }
}

/// Reads what an iterator's program writes per cgroup at each walk.
pub struct MemoryWalk<V: WalkEntry> {
    iter: IterWalk,
    /// What each walk found, per cgroup.
    now: aya::maps::HashMap<MapData, u64, V>,
    /// The id of the last walk that ended.
    last_walk: aya::maps::Array<MapData, u64>,
    page_bytes: u64,
    /// The last read of `now`, its buffers kept for the next.
    entries: PerCpuEntries<u64, V>,
}

impl<V: WalkEntry> MemoryWalk<V> {
    /// Takes the iterator and its maps (`MEMORY_NOW` and `LAST_MEMORY_WALK`, or
    /// `PROCESS_RSS_NOW` and `LAST_RSS_WALK`).
    pub fn new(
        iter: IterWalk,
        now: aya::maps::Map,
        last_walk: aya::maps::Map,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            iter,
            now: aya::maps::HashMap::try_from(now).context("a memory walk's map")?,
            last_walk: aya::maps::Array::try_from(last_walk)
                .context("a memory walk's last-walk map")?,
            page_bytes: super::memory::page_bytes(),
            entries: PerCpuEntries::new(1),
        })
    }

    /// One walk: what it found of every cgroup it wrote an entry for, by cgroup id. Entries
    /// no walk rewrote since an earlier one are of cgroups that are gone (or, for the process
    /// walk, hold no process now): freed.
    pub fn read(&mut self) -> anyhow::Result<crate::IdMap<V::Found>> {
        self.iter.walk().context("walking for memory")?;
        let walk = self
            .last_walk
            .get(&0, 0)
            .context("reading a memory walk's id")?;
        let fd = self.now.map().fd().as_fd();
        // SAFETY: the map's key and value are these types, valid for any bit pattern (a plain
        // hash map's values are laid out as one per-CPU value).
        unsafe { super::batch::read_first(fd, usize::MAX, &mut self.entries) }
            .context("reading a memory walk's map")?;
        let mut memory =
            crate::IdMap::with_capacity_and_hasher(self.entries.len(), Default::default());
        for (cgroup_id, now) in self.entries.iter() {
            let Some(now) = now.first() else { continue };
            if now.walk() != walk {
                let _ = self.now.remove(&cgroup_id);
                continue;
            }
            memory.insert(cgroup_id, now.found(self.page_bytes));
        }
        Ok(memory)
    }
}
