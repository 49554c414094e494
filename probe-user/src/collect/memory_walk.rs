//! Memory of every cgroup from the memory controller's own counters (what `memory.current`
//! and `memory.peak` show), read by one cgroup iterator walk a sample: at 1,000 workers, two
//! files per worker were a third of the agent's CPU.

use std::{collections::HashMap, os::fd::AsFd as _};

use anyhow::Context as _;
use aya::maps::{IterableMap as _, MapData};
use probe_common::memory::MemoryNow;

use super::batch::PerCpuEntries;

use crate::{
    loader::cgroup_iter::CgroupIter,
    model::{MemoryReading, MemorySource},
};

/// Reads every cgroup's memory counters with the memory walk.
pub struct MemoryWalk {
    iter: CgroupIter,
    /// What each walk found, per cgroup.
    memory_now: aya::maps::HashMap<MapData, u64, MemoryNow>,
    /// The id of the last walk that ended.
    last_walk: aya::maps::Array<MapData, u64>,
    page_bytes: u64,
    /// The last read of `memory_now`, its buffers kept for the next.
    entries: PerCpuEntries<u64, MemoryNow>,
}

impl MemoryWalk {
    /// Takes the iterator and its maps (`MEMORY_NOW`, `LAST_MEMORY_WALK`).
    pub fn new(
        iter: CgroupIter,
        memory_now: aya::maps::Map,
        last_walk: aya::maps::Map,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            iter,
            memory_now: aya::maps::HashMap::try_from(memory_now).context("map MEMORY_NOW")?,
            last_walk: aya::maps::Array::try_from(last_walk).context("map LAST_MEMORY_WALK")?,
            page_bytes: super::memory::page_bytes(),
            entries: PerCpuEntries::new(1),
        })
    }

    /// One walk: the memory of every cgroup with a memory controller of its own, by cgroup
    /// id. Entries no walk rewrote since an earlier one are of cgroups that are gone: freed.
    pub fn read(&mut self) -> anyhow::Result<HashMap<u64, MemoryReading>> {
        self.iter
            .walk()
            .context("walking the cgroups for their memory")?;
        let walk = self
            .last_walk
            .get(&0, 0)
            .context("reading map LAST_MEMORY_WALK")?;
        let fd = self.memory_now.map().fd().as_fd();
        // SAFETY: the map's key and value are these types, valid for any bit pattern (a plain
        // hash map's values are laid out as one per-CPU value).
        unsafe { super::batch::read_first(fd, usize::MAX, &mut self.entries) }
            .context("reading map MEMORY_NOW")?;
        let mut memory = HashMap::new();
        for (cgroup_id, now) in self.entries.iter() {
            let Some(now) = now.first() else { continue };
            if now.walk != walk {
                let _ = self.memory_now.remove(&cgroup_id);
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
