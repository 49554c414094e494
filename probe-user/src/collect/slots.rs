//! The programs' fast paths: per-CPU arrays with one slot per owner, which the programs index
//! by a slot number kept where they find it at once (an array update per event instead of a
//! hash lookup).
//!
//! - CPU slots: one per worker (its CPU and socket counters), the number kept by each thread.
//!   Workers beyond the slots keep their counters in the `CPU_STATS` and `NET_STATS` hashes.
//! - Endpoint slots: one per (worker, peer), the number kept by each socket. Endpoints beyond
//!   the slots keep their counters in the `ENDPOINTS` hash.
//!
//! An owner's counters are the sum of its slot and its hash entries.

use std::os::fd::AsFd as _;

use aya::maps::IterableMap as _;

use super::batch::PerCpuEntries;

use anyhow::Context as _;
use aya::maps::{HashMap, Map, MapData, PerCpuArray, PerCpuValues, Stack};
use probe_common::{
    cpu::SlotCounters,
    net::{EndpointKey, EndpointSlot},
};

/// A slot's value on one CPU: it names the owner it holds counters for there.
pub trait SlotValue: aya::Pod + Copy + Default {
    /// Who owns a slot: the key of the map from owners to slots.
    type Owner: aya::Pod + Copy + Default + Eq + std::hash::Hash;
    /// The owner of this CPU's value (a default owner: unused on this CPU).
    fn owner(&self) -> Self::Owner;
}

impl SlotValue for SlotCounters {
    type Owner = u64;
    fn owner(&self) -> u64 {
        self.cgroup_id
    }
}

impl SlotValue for EndpointSlot {
    type Owner = EndpointKey;
    fn owner(&self) -> EndpointKey {
        self.key
    }
}

/// The slot maps, as the collector reads and frees them.
pub struct SlotMaps<V: SlotValue> {
    counters: PerCpuArray<MapData, V>,
    slot_of: HashMap<MapData, V::Owner, u64>,
    free: Stack<MapData, u32>,
    /// The last read of `slot_of`, its buffers kept for the next.
    owners: PerCpuEntries<V::Owner, u64>,
    /// The last read of `counters`, likewise.
    slots: PerCpuEntries<u32, V>,
}

impl<V: SlotValue> SlotMaps<V> {
    /// The three maps; `None` from a pin set made before they existed.
    pub fn new(
        counters: Option<Map>,
        slot_of: Option<Map>,
        free: Option<Map>,
        cpus: usize,
    ) -> Option<Self> {
        Some(Self {
            counters: PerCpuArray::try_from(counters?).ok()?,
            slot_of: HashMap::try_from(slot_of?).ok()?,
            free: Stack::try_from(free?).ok()?,
            owners: PerCpuEntries::new(1),
            slots: PerCpuEntries::new(cpus),
        })
    }

    /// Every owner with a slot, and its counters per CPU (zeros on a CPU where the slot is
    /// not yet the owner's). Read into buffers kept for the next read.
    pub fn read(&mut self) -> anyhow::Result<impl Iterator<Item = (V::Owner, &[V])>> {
        let fd = self.slot_of.map().fd().as_fd();
        // SAFETY: a plain hash of Pod owner keys and u64 values: one 8-byte value per key.
        unsafe { super::batch::read_first(fd, usize::MAX, &mut self.owners) }
            .context("reading a slot map's owners")?;
        let highest = self
            .owners
            .iter()
            .filter_map(|(_, slot)| slot.first())
            .max();
        // Read up to the highest slot in use: the stack hands out low slots first and takes
        // given-back ones on top (see the loader's `free_every_slot`), so they stay low.
        let wanted = highest.map_or(0, |highest| *highest as usize + 1);
        let fd = self.counters.map().fd().as_fd();
        // SAFETY: a per-CPU array of V, u32 keys.
        unsafe { super::batch::read_first(fd, wanted, &mut self.slots) }
            .context("reading a slot array")?;
        // A CPU where the slot does not name its owner yet counts nothing for it.
        for (owner, slot) in self.owners.iter() {
            let per_cpu = slot
                .first()
                .and_then(|slot| self.slots.get_mut(*slot as usize));
            for on_cpu in per_cpu.into_iter().flatten() {
                if on_cpu.owner() != owner {
                    *on_cpu = V::default();
                }
            }
        }
        let slots = &self.slots;
        Ok(self.owners.iter().filter_map(move |(owner, slot)| {
            let (_, per_cpu) = slots.get(*slot.first()? as usize)?;
            Some((owner, per_cpu))
        }))
    }

    /// Every owner with a slot and its counters per CPU, copied out.
    pub fn read_all(&mut self) -> anyhow::Result<Vec<(V::Owner, Vec<V>)>> {
        Ok(self
            .read()?
            .map(|(owner, per_cpu)| (owner, per_cpu.to_vec()))
            .collect())
    }

    /// The slot holding the owner's counters, if it has one.
    pub fn slot_of(&self, owner: V::Owner) -> Option<u32> {
        let slot = self.slot_of.get(&owner, 0).ok()?;
        u32::try_from(slot).ok()
    }

    /// An ended owner's counters per CPU, if it has a slot; the slot is zeroed and given back.
    pub fn finish(&mut self, owner: V::Owner, cpus: usize) -> Option<Vec<V>> {
        let slot = self.slot_of(owner)?;
        let per_cpu = self.counters.get(&slot, 0).ok()?;
        let counters = owned_by(owner, &per_cpu);
        // Unnamed, then zeroed, then free: the next owner starts from nothing on every CPU.
        let zeros = PerCpuValues::try_from(vec![V::default(); cpus]).ok();
        // A step that fails leaves the slot out of use (the others keep working).
        let _ = self.slot_of.remove(&owner).is_ok()
            && zeros.is_some_and(|zeros| self.counters.set(slot, zeros, 0).is_ok())
            && self.free.push(slot, 0).is_ok();
        Some(counters)
    }
}

/// The slot's counters on each CPU where `owner` owns it; zeros elsewhere.
fn owned_by<V: SlotValue>(owner: V::Owner, per_cpu: &[V]) -> Vec<V> {
    per_cpu
        .iter()
        .map(|on_cpu| {
            if on_cpu.owner() == owner {
                *on_cpu
            } else {
                V::default()
            }
        })
        .collect()
}
