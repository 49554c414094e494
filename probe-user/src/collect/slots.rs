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
    type Owner: aya::Pod + Copy + Default + Ord + std::hash::Hash;
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
    /// One past the highest slot in use at the last read: the next read goes this far and
    /// [`LOOKAHEAD`] beyond.
    in_use_end: usize,
    /// The last read of `counters`, its buffers kept for the next.
    slots: PerCpuEntries<u32, V>,
    /// Each slot in use at the last read, and its owner.
    owners: Vec<(V::Owner, u32)>,
}

/// How many unused slots in a row past the last one in use end a read. Fresh slots are
/// handed out lowest first (see the loader's `free_every_slot`), so the slots in use beyond
/// the last read's end are a run from it, but for a slot popped and pushed back by a CPU that
/// lost a race to name an owner: gaps of a few slots, one per racing CPU at most.
const LOOKAHEAD: usize = 64;

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
            in_use_end: 0,
            slots: PerCpuEntries::new(cpus),
            owners: Vec::new(),
        })
    }

    /// Every owner with a slot, and its counters per CPU, in owner order (as a sample keeps
    /// them, so the counters need no sort). Read into buffers kept for the next read.
    ///
    /// The slots name their owners: a program names the owner in a slot's value on a CPU
    /// at its first use there, and user space zeroes every CPU's value when it gives the slot
    /// back. So the array alone says whose each slot is, and the owners' hash (a thousand
    /// entries at a thousand workers) need not be read each sample.
    pub fn read(&mut self) -> anyhow::Result<impl Iterator<Item = (V::Owner, &[V])>> {
        self.refresh()?;
        let slots = &self.slots;
        Ok(self.owners.iter().filter_map(move |&(owner, slot)| {
            let (_, per_cpu) = slots.get(slot as usize)?;
            Some((owner, per_cpu))
        }))
    }

    /// Every owner with a slot, and its slot.
    pub fn slots_in_use(&mut self) -> anyhow::Result<&[(V::Owner, u32)]> {
        self.refresh()?;
        Ok(&self.owners)
    }

    /// Reads the array up to past the last slot in use, and lists whose each slot is.
    fn refresh(&mut self) -> anyhow::Result<()> {
        let capacity = self.counters.len() as usize;
        let lookahead = LOOKAHEAD.max(2 * self.slots.cpus());
        let mut wanted = (self.in_use_end + lookahead).min(capacity);
        loop {
            let fd = self.counters.map().fd().as_fd();
            // SAFETY: a per-CPU array of V, u32 keys.
            unsafe { super::batch::read_first(fd, wanted, &mut self.slots) }
                .context("reading a slot array")?;
            let slot_of = &self.slot_of;
            self.in_use_end = name_owners(&mut self.slots, &mut self.owners, |owner| {
                slot_of.get(owner, 0).ok()
            });
            // Slots in use up to the lookahead's end may go on past it: read further, twice
            // as far at least, so a burst of new workers costs a few reads, not one per
            // lookahead.
            if wanted >= capacity || self.in_use_end + lookahead <= wanted {
                break;
            }
            wanted = (self.in_use_end + lookahead).max(2 * wanted).min(capacity);
        }
        Ok(())
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

/// Lists in `owners`, in owner order, each slot of `slots` that names an owner, zeroes its
/// values on any CPU naming another, and returns one past the highest slot listed. Where
/// CPUs name different owners (rare: a program named the slot's last owner on a CPU as user
/// space gave it back), the owner is the one `slot_of` (the owners' hash) places there.
fn name_owners<V: SlotValue>(
    slots: &mut PerCpuEntries<u32, V>,
    owners: &mut Vec<(V::Owner, u32)>,
    slot_of: impl Fn(&V::Owner) -> Option<u64>,
) -> usize {
    owners.clear();
    let unused = V::Owner::default();
    let mut end = 0;
    for slot in 0..slots.len() {
        let Some(per_cpu) = slots.get_mut(slot) else {
            break;
        };
        let mut named = per_cpu
            .iter()
            .map(SlotValue::owner)
            .filter(|owner| *owner != unused);
        let Some(first) = named.next() else {
            continue;
        };
        let owner = if named.all(|owner| owner == first) {
            first
        } else {
            per_cpu
                .iter()
                .map(SlotValue::owner)
                .find(|owner| *owner != unused && slot_of(owner) == Some(slot as u64))
                .unwrap_or(first)
        };
        keep_owned(owner, per_cpu);
        owners.push((owner, slot as u32));
        end = slot + 1;
    }
    owners.sort_unstable();
    end
}

/// The slot's counters on each CPU where `owner` owns it; zeros elsewhere.
fn owned_by<V: SlotValue>(owner: V::Owner, per_cpu: &[V]) -> Vec<V> {
    let mut owned = per_cpu.to_vec();
    keep_owned(owner, &mut owned);
    owned
}

/// Zeroes the slot's values on each CPU where it does not name `owner`.
fn keep_owned<V: SlotValue>(owner: V::Owner, per_cpu: &mut [V]) {
    for on_cpu in per_cpu.iter_mut() {
        if on_cpu.owner() != owner {
            *on_cpu = V::default();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(cgroup_id: u64, on_cpu_ns: u64) -> SlotCounters {
        let mut slot = SlotCounters {
            cgroup_id,
            ..SlotCounters::default()
        };
        slot.stats.on_cpu_ns = on_cpu_ns;
        slot
    }

    fn read(values: &[[SlotCounters; 2]]) -> PerCpuEntries<u32, SlotCounters> {
        let mut slots = PerCpuEntries::new(2);
        for (slot, per_cpu) in values.iter().enumerate() {
            slots.push(slot as u32, per_cpu);
        }
        slots
    }

    #[test]
    fn each_slot_is_the_owner_its_values_name_and_unused_ones_are_skipped() {
        let unused = SlotCounters::default();
        // Slot 1 is a gap (a slot popped and pushed back by a CPU that lost a race); slot 3
        // is past the last one in use.
        let mut slots = read(&[
            [named(7, 10), unused],
            [unused, unused],
            [unused, named(9, 30)],
            [unused, unused],
        ]);
        let mut owners = Vec::new();
        let end = name_owners(&mut slots, &mut owners, |_| None);
        assert_eq!(owners, vec![(7, 0), (9, 2)]);
        assert_eq!(end, 3);
        assert_eq!(slots.get(2).unwrap().1[1].stats.on_cpu_ns, 30);
    }

    #[test]
    fn a_late_write_of_the_last_owner_goes_to_whoever_the_hash_says() {
        // Slot 0 names 5 (given back) on CPU 0 and 6 (its owner now) on CPU 1.
        let mut slots = read(&[[named(5, 100), named(6, 20)]]);
        let mut owners = Vec::new();
        let end = name_owners(&mut slots, &mut owners, |owner| (*owner == 6).then_some(0));
        assert_eq!(owners, vec![(6, 0)]);
        assert_eq!(end, 1);
        let per_cpu = slots.get(0).unwrap().1;
        assert_eq!(
            per_cpu[0].stats.on_cpu_ns, 0,
            "the last owner's write is dropped"
        );
        assert_eq!(per_cpu[1].stats.on_cpu_ns, 20);
    }

    #[test]
    fn nothing_in_use_ends_at_zero() {
        let mut slots = read(&[[SlotCounters::default(); 2]]);
        let mut owners = vec![(1, 1)];
        assert_eq!(name_owners(&mut slots, &mut owners, |_| None), 0);
        assert!(owners.is_empty());
    }
}
