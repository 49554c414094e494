//! Memory read by one iterator walk a sample instead of files per worker:
//!
//! - the memory walk: every cgroup's memory controller counters (what `memory.current` and
//!   `memory.peak` show), where cgroup2 has the controller: at 1,000 workers, two files per
//!   worker were a third of the agent's CPU;
//! - the process walk: every process's resident pages, summed by cgroup here, where it does
//!   not (hybrid hosts): each worker's process list and each process's statm file were half.

use std::os::fd::AsFd as _;

use anyhow::Context as _;
use aya::maps::{IterableMap as _, MapData};
use probe_common::memory::{MemoryNow, ProcessRss};

use super::batch::PerCpuEntries;

use crate::{
    loader::iter_walk::IterWalk,
    model::{MemoryReading, MemorySource},
};

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

/// Reads what the memory walk's program writes per cgroup at each walk.
pub struct MemoryWalk {
    iter: IterWalk,
    /// What each walk found, per cgroup.
    now: aya::maps::HashMap<MapData, u64, MemoryNow>,
    /// The id of the last walk that ended.
    last_walk: aya::maps::Array<MapData, u64>,
    page_bytes: u64,
    /// The last read of `now`, its buffers kept for the next.
    entries: PerCpuEntries<u64, MemoryNow>,
}

impl MemoryWalk {
    /// Takes the iterator and its maps (`MEMORY_NOW` and `LAST_MEMORY_WALK`).
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

    /// One walk: what it found of every cgroup with a memory controller of its own, by cgroup
    /// id. Entries no walk rewrote since an earlier one are of cgroups that are gone: freed.
    pub fn read(&mut self) -> anyhow::Result<crate::IdMap<MemoryReading>> {
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
            if now.walk != walk {
                let _ = self.now.remove(&cgroup_id);
                continue;
            }
            memory.insert(
                cgroup_id,
                MemoryReading {
                    current_bytes: now.current_pages * self.page_bytes,
                    peak_bytes: now.peak_pages * self.page_bytes,
                    source: MemorySource::Cgroup2,
                },
            );
        }
        Ok(memory)
    }
}

/// Reads the process walk's output: a [`ProcessRss`] per process, summed here by cgroup.
pub struct ProcessWalk {
    iter: IterWalk,
    page_bytes: u64,
    /// The last walk's output, its buffer kept for the next.
    output: Vec<u8>,
}

impl ProcessWalk {
    /// Takes the attached process walk.
    pub fn new(iter: IterWalk) -> Self {
        Self {
            iter,
            page_bytes: super::memory::page_bytes(),
            output: Vec::new(),
        }
    }

    /// One walk: every cgroup2 cgroup holding a process, by cgroup id, with its processes'
    /// resident sets summed, and the first process the walk met in it.
    pub fn read(&mut self) -> anyhow::Result<crate::IdMap<WalkedProcesses>> {
        self.output.clear();
        self.iter
            .walk_into(&mut self.output)
            .context("walking the processes for memory")?;
        Ok(sum_by_cgroup(&self.output, self.page_bytes))
    }
}

/// The process walk's output summed by cgroup: the first process met in a cgroup names it.
fn sum_by_cgroup(output: &[u8], page_bytes: u64) -> crate::IdMap<WalkedProcesses> {
    let records = output.chunks_exact(size_of::<ProcessRss>());
    let mut by_cgroup = crate::IdMap::with_capacity_and_hasher(records.len(), Default::default());
    for process in records.filter_map(super::events::record::<ProcessRss>) {
        let rss_bytes = process.rss_pages * page_bytes;
        by_cgroup
            .entry(process.cgroup_id)
            .and_modify(|walked: &mut WalkedProcesses| {
                walked.reading.current_bytes += rss_bytes;
                walked.reading.peak_bytes += rss_bytes;
            })
            .or_insert(WalkedProcesses {
                reading: MemoryReading {
                    current_bytes: rss_bytes,
                    peak_bytes: rss_bytes,
                    source: MemorySource::Rss,
                },
                pid: process.pid,
                memory_cgroup_id: (process.memory_cgroup_id != 0)
                    .then_some(process.memory_cgroup_id),
            });
    }
    by_cgroup
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as the program lays it out (`ProcessRss`, no padding).
    fn record(cgroup_id: u64, rss_pages: u64, memory_cgroup_id: u64, pid: u32) -> Vec<u8> {
        [
            &cgroup_id.to_ne_bytes()[..],
            &rss_pages.to_ne_bytes(),
            &memory_cgroup_id.to_ne_bytes(),
            &pid.to_ne_bytes(),
            &0u32.to_ne_bytes(),
        ]
        .concat()
    }

    #[test]
    fn processes_are_summed_by_cgroup_and_named_by_the_first() {
        let output = [
            record(7, 10, 0, 100),
            record(8, 1, 55, 200),
            record(7, 5, 66, 101),
        ]
        .concat();
        let walked = sum_by_cgroup(&output, 4096);
        assert_eq!(walked.len(), 2);
        let seven = walked[&7];
        assert_eq!(seven.reading.current_bytes, 15 * 4096);
        assert_eq!(seven.reading.peak_bytes, 15 * 4096);
        assert_eq!(seven.reading.source, MemorySource::Rss);
        assert_eq!((seven.pid, seven.memory_cgroup_id), (100, None));
        assert_eq!(walked[&8].memory_cgroup_id, Some(55));
        assert!(sum_by_cgroup(&[], 4096).is_empty());
    }
}
