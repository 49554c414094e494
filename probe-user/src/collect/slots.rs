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
}

impl<V: SlotValue> SlotMaps<V> {
    /// The three maps; `None` from a pin set made before they existed.
    pub fn new(counters: Option<Map>, slot_of: Option<Map>, free: Option<Map>) -> Option<Self> {
        Some(Self {
            counters: PerCpuArray::try_from(counters?).ok()?,
            slot_of: HashMap::try_from(slot_of?).ok()?,
            free: Stack::try_from(free?).ok()?,
        })
    }

    /// Every owner with a slot, and its counters per CPU (a CPU where the slot is not yet the
    /// owner's counts nothing for it).
    pub fn read_all(&self, cpus: usize) -> anyhow::Result<Vec<(V::Owner, Vec<V>)>> {
        let fd = self.slot_of.map().fd().as_fd();
        // SAFETY: a plain hash of Pod owner keys and u64 values: one 8-byte value per key.
        let owners = unsafe { super::batch::lookup_all_percpu::<V::Owner, u64>(fd, 1) }
            .context("reading a slot map's owners")?;
        let Some(highest) = owners.iter().filter_map(|(_, slot)| slot.first()).max() else {
            return Ok(Vec::new());
        };
        let fd = self.counters.map().fd().as_fd();
        // Read up to the highest slot in use: the stack hands out low slots first and takes
        // given-back ones on top (see the loader's `free_every_slot`), so they stay low.
        // SAFETY: a per-CPU array of V, u32 keys.
        let slots =
            unsafe { super::batch::lookup_first_percpu::<u32, V>(fd, cpus, *highest as usize + 1) }
                .context("reading a slot array")?;
        Ok(owners
            .into_iter()
            .filter_map(|(owner, slot)| {
                let (_, per_cpu) = slots.get(*slot.first()? as usize)?;
                Some((owner, owned_by(owner, per_cpu)))
            })
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
