//! CPU time from the kernel's own per-cgroup accounting: the cgroup iterator's walk at each
//! sample, and the removal program's final read of a removed cgroup.

use std::{collections::BTreeMap, os::fd::AsFd as _};

use anyhow::Context as _;
use aya::maps::{IterableMap as _, MapData};
use probe_common::rstat::{RstatCpu, RstatKey, RstatNow};

use super::batch::PerCpuEntries;
use crate::{loader::iter_walk::IterWalk, model::WorkerCounters};

/// CPU time per CPU of each cgroup.
type TimesByCgroup = BTreeMap<u64, Vec<RstatCpu>>;

/// Reads each cgroup's CPU time per CPU, counted from the agent's start.
pub struct RstatReader {
    iter: IterWalk,
    /// What each walk found, per cgroup and CPU.
    cpu_now: aya::maps::HashMap<MapData, RstatKey, RstatNow>,
    /// The id of the last walk that ended.
    last_walk: aya::maps::Array<MapData, u64>,
    /// Removed cgroups' times at their removal, per CPU.
    final_cpu: aya::maps::HashMap<MapData, RstatKey, RstatCpu>,
    /// What the cgroups that existed at the start had run before it: the kernel counts from a
    /// cgroup's birth, the agent from its own start, as with every other counter.
    baseline: crate::IdMap<Vec<RstatCpu>>,
    cpus: usize,
    /// The last read of `cpu_now`, its buffers kept for the next.
    entries: PerCpuEntries<RstatKey, RstatNow>,
}

/// The maps the iterator and the removal program fill.
pub struct RstatMaps {
    /// `CPU_NOW`.
    pub cpu_now: aya::maps::Map,
    /// `LAST_WALK`.
    pub last_walk: aya::maps::Map,
    /// `FINAL_CPU`.
    pub final_cpu: aya::maps::Map,
}

impl RstatReader {
    /// Takes the iterator and its maps; walks once for the baseline.
    pub fn new(iter: IterWalk, maps: RstatMaps, cpus: usize) -> anyhow::Result<Self> {
        let mut reader = Self {
            iter,
            cpu_now: aya::maps::HashMap::try_from(maps.cpu_now).context("map CPU_NOW")?,
            last_walk: aya::maps::Array::try_from(maps.last_walk).context("map LAST_WALK")?,
            final_cpu: aya::maps::HashMap::try_from(maps.final_cpu).context("map FINAL_CPU")?,
            baseline: crate::IdMap::default(),
            cpus,
            entries: PerCpuEntries::new(1),
        };
        reader.baseline = reader.walk_raw()?.into_iter().collect();
        Ok(reader)
    }

    /// Every cgroup's CPU time per CPU since the agent started (cgroups with none left out,
    /// as the programs leave out cgroups that did nothing since they were attached).
    pub fn read(&mut self) -> anyhow::Result<TimesByCgroup> {
        let mut times = self.walk_raw()?;
        for (cgroup_id, per_cpu) in times.iter_mut() {
            if let Some(before) = self.baseline.get(cgroup_id) {
                subtract(per_cpu, before);
            }
        }
        times.retain(|_, per_cpu| per_cpu.iter().any(|cpu| cpu.runtime_ns > 0));
        Ok(times)
    }

    /// A worker's final CPU time per CPU since the agent started: what the removal program
    /// kept of a removed cgroup, or a walk's reading of one that is still there (a caller
    /// that ends its worker before removing it). `None`: it never ran.
    pub fn take_final(&mut self, cgroup_id: u64) -> Option<Vec<RstatCpu>> {
        let mut per_cpu = vec![RstatCpu::default(); self.cpus];
        let mut found = false;
        for (cpu, times) in per_cpu.iter_mut().enumerate() {
            let key = key(cgroup_id, cpu);
            // A walk may have written it again before the cgroup went.
            let _ = self.cpu_now.remove(&key);
            if let Ok(kept) = self.final_cpu.get(&key, 0) {
                *times = kept;
                found = true;
                let _ = self.final_cpu.remove(&key);
            }
        }
        if !found {
            per_cpu = self.walk_raw().ok()?.remove(&cgroup_id)?;
            for cpu in 0..self.cpus {
                let _ = self.cpu_now.remove(&key(cgroup_id, cpu));
            }
        }
        let before = self.baseline.remove(&cgroup_id);
        if let Some(before) = before {
            subtract(&mut per_cpu, &before);
        }
        Some(per_cpu)
    }

    /// Frees what is kept for a removed cgroup no one reports on.
    pub fn forget(&mut self, cgroup_id: u64) {
        for cpu in 0..self.cpus {
            let key = key(cgroup_id, cpu);
            let _ = self.cpu_now.remove(&key);
            let _ = self.final_cpu.remove(&key);
        }
        self.baseline.remove(&cgroup_id);
    }

    /// One walk, then its entries: the kernel's counts since each cgroup's birth. Entries no
    /// walk rewrote since an earlier one are of cgroups that are gone: freed.
    fn walk_raw(&mut self) -> anyhow::Result<TimesByCgroup> {
        self.iter
            .walk()
            .context("walking the cgroups for their CPU time")?;
        let walk = self.last_walk.get(&0, 0).context("reading map LAST_WALK")?;
        let fd = self.cpu_now.map().fd().as_fd();
        // SAFETY: the map's key and value are these `#[repr(C)]` types (a plain hash map's
        // values are laid out as one per-CPU value).
        unsafe { super::batch::read_first(fd, usize::MAX, &mut self.entries) }
            .context("reading map CPU_NOW")?;
        let mut times: TimesByCgroup = BTreeMap::new();
        let mut gone = Vec::new();
        for (key, now) in self.entries.iter() {
            let Some(now) = now.first() else { continue };
            if now.walk != walk {
                gone.push(key);
                continue;
            }
            let cpu = key.cpu as usize;
            if cpu >= self.cpus {
                continue;
            }
            times
                .entry(key.cgroup_id)
                .or_insert_with(|| vec![RstatCpu::default(); self.cpus])[cpu] = now.cpu;
        }
        for key in gone {
            let _ = self.cpu_now.remove(&key);
        }
        Ok(times)
    }
}

/// Puts a cgroup's times per CPU into its counters (the programs leave on-CPU time and the
/// tick-sampled split to the iterator).
pub fn apply(worker: &mut WorkerCounters, times: &[RstatCpu]) {
    if worker.on_cpu_ns_per_cpu.len() < times.len() {
        worker.on_cpu_ns_per_cpu.resize(times.len(), 0);
    }
    for (on_cpu_ns, times) in worker.on_cpu_ns_per_cpu.iter_mut().zip(times) {
        *on_cpu_ns = times.runtime_ns;
    }
    worker.sched.user_tick_ns = times.iter().map(|t| t.user_tick_ns).sum();
    worker.sched.system_tick_ns = times.iter().map(|t| t.system_tick_ns).sum();
}

fn key(cgroup_id: u64, cpu: usize) -> RstatKey {
    RstatKey {
        cgroup_id,
        cpu: cpu as u32,
        reserved: 0,
    }
}

fn subtract(per_cpu: &mut [RstatCpu], before: &[RstatCpu]) {
    for (now, before) in per_cpu.iter_mut().zip(before) {
        now.runtime_ns = now.runtime_ns.saturating_sub(before.runtime_ns);
        now.user_tick_ns = now.user_tick_ns.saturating_sub(before.user_tick_ns);
        now.system_tick_ns = now.system_tick_ns.saturating_sub(before.system_tick_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_before_the_start_are_not_counted() {
        let mut now = vec![
            RstatCpu {
                runtime_ns: 10,
                user_tick_ns: 4,
                system_tick_ns: 6,
            };
            2
        ];
        let before = vec![
            RstatCpu {
                runtime_ns: 3,
                user_tick_ns: 4,
                system_tick_ns: 9,
            };
            2
        ];
        subtract(&mut now, &before);
        assert_eq!(now[1].runtime_ns, 7);
        assert_eq!(now[1].user_tick_ns, 0);
        assert_eq!(now[1].system_tick_ns, 0, "never below zero");
    }
}
