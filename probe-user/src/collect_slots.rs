//! The programs' fast path for per-worker counters: a per-CPU array with one slot per worker
//! (its CPU and socket counters), which the programs index by a slot number each thread keeps
//! (an array update per event instead of a hash lookup). Workers beyond the slots keep their
//! counters in the `CPU_STATS` and `NET_STATS` hashes; a worker's counters are the sum of both.

use std::os::fd::AsFd as _;

use aya::maps::IterableMap as _;

use anyhow::Context as _;
use aya::maps::{HashMap, Map, MapData, PerCpuArray, PerCpuValues, Stack};
use probe_common::cpu::{SLOT_OF_MAP, SlotCounters};

/// The slot maps, as the collector reads and frees them.
pub struct SlotMaps {
    counters: PerCpuArray<MapData, SlotCounters>,
    slot_of: HashMap<MapData, u64, u64>,
    free: Stack<MapData, u32>,
}

impl SlotMaps {
    /// The three maps; `None` from a pin set made before they existed.
    pub fn new(counters: Option<Map>, slot_of: Option<Map>, free: Option<Map>) -> Option<Self> {
        Some(Self {
            counters: PerCpuArray::try_from(counters?).ok()?,
            slot_of: HashMap::try_from(slot_of?).ok()?,
            free: Stack::try_from(free?).ok()?,
        })
    }

    /// Every worker with a slot, and its counters per CPU (a CPU where the slot is not yet
    /// the worker's counts nothing for it).
    pub fn read_all(&self, cpus: usize) -> anyhow::Result<Vec<(u64, Vec<SlotCounters>)>> {
        let fd = self.slot_of.map().fd().as_fd();
        // SAFETY: a plain hash of u64 keys and u64 values: one 8-byte value per key.
        let owners = unsafe { crate::collect_batch::lookup_all_percpu::<u64, u64>(fd, 1) }
            .with_context(|| format!("reading map {SLOT_OF_MAP}"))?;
        let Some(highest) = owners.iter().filter_map(|(_, slot)| slot.first()).max() else {
            return Ok(Vec::new());
        };
        let fd = self.counters.map().fd().as_fd();
        // Read up to the highest slot in use: the stack hands out low slots first and takes
        // given-back ones on top (see the loader's `free_every_slot`), so they stay low.
        // SAFETY: a per-CPU array of SlotCounters, u32 keys.
        let slots = unsafe {
            crate::collect_batch::lookup_first_percpu::<u32, SlotCounters>(
                fd,
                cpus,
                *highest as usize + 1,
            )
        }
        .context("reading the CPU slots")?;
        Ok(owners
            .into_iter()
            .filter_map(|(cgroup_id, slot)| {
                let (_, per_cpu) = slots.get(*slot.first()? as usize)?;
                Some((cgroup_id, owned_by(cgroup_id, per_cpu)))
            })
            .collect())
    }

    /// The slot holding the worker's counters, if it has one.
    pub fn slot_of(&self, cgroup_id: u64) -> Option<u32> {
        let slot = self.slot_of.get(&cgroup_id, 0).ok()?;
        u32::try_from(slot).ok()
    }

    /// A removed worker's counters per CPU, if it has a slot; the slot is zeroed and given back.
    pub fn finish(&mut self, cgroup_id: u64, cpus: usize) -> Option<Vec<SlotCounters>> {
        let slot = self.slot_of.get(&cgroup_id, 0).ok()?;
        let slot = u32::try_from(slot).ok()?;
        let per_cpu = self.counters.get(&slot, 0).ok()?;
        let counters = owned_by(cgroup_id, &per_cpu);
        // Unnamed, then zeroed, then free: the next worker starts from nothing on every CPU.
        let zeros = PerCpuValues::try_from(vec![SlotCounters::default(); cpus]).ok();
        // A step that fails leaves the slot out of use (the others keep working).
        let _ = self.slot_of.remove(&cgroup_id).is_ok()
            && zeros.is_some_and(|zeros| self.counters.set(slot, zeros, 0).is_ok())
            && self.free.push(slot, 0).is_ok();
        Some(counters)
    }
}

/// The slot's counters on each CPU where `cgroup_id` owns it; zeros elsewhere.
fn owned_by(cgroup_id: u64, per_cpu: &[SlotCounters]) -> Vec<SlotCounters> {
    per_cpu
        .iter()
        .map(|on_cpu| {
            if on_cpu.cgroup_id == cgroup_id {
                *on_cpu
            } else {
                SlotCounters::default()
            }
        })
        .collect()
}
