//! Collection: reads the programs' maps into a [`Sample`]. Knows nothing of sinks.

use anyhow::Context as _;
use aya::maps::{MapData, PerCpuArray, PerCpuHashMap, RingBuf};

mod batch;
mod events;
mod heap;
pub mod kept_files;
pub mod memory;
mod memory_walk;
pub mod own_cost;
mod rstat;
mod slots;

use events::{RingEvent, RingReader, decode_cgroup_event, decode_process_event};
use heap::HeapReturn;
use memory::WalkedMemory;
pub use memory_walk::WalkedProcesses;
use memory_walk::{MemoryWalk, ProcessWalk};
use probe_common::{
    cpu::{
        CPU_SLOTS_MAP, CPU_STATS_MAP, CpuStats, FREE_SLOTS_MAP, HASHED_CPU, HASHED_NET,
        HASHES_USED_MAP, LAST_SWITCH_MAP, LastSwitch, SLOT_OF_MAP, SlotCounters,
    },
    drops::{DROP_NAMES, DROPS_MAP},
    lifecycle::EVENTS_MAP,
    memory::PROCESS_PEAKS_MAP,
    net::{
        ENDPOINT_COUNTS_MAP, ENDPOINT_SLOT_OF_MAP, ENDPOINT_SLOTS_MAP, ENDPOINTS_MAP, EndpointKey,
        EndpointSlot, EndpointStats, FREE_ENDPOINT_SLOTS_MAP, NET_STATS_MAP, NetStats,
        PROCESS_ENDPOINT_COUNTS_MAP, PROCESS_ENDPOINTS_MAP,
    },
    process::{PROCESS_CPU_MAP, PROCESS_EVENTS_MAP, PROCESS_NET_MAP, ProcessBytes},
};
use rstat::RstatReader;
use slots::SlotMaps;

use crate::{
    cgroup::{self, CgroupIndex},
    clock::Timestamp,
    loader::Probe,
    model::{
        Drops, ExitMemoryPeaks, LifecycleEvent, Measured, Sample, WorkerCounters,
        endpoints::EndpointDelta,
        process::{ProcessEvent, ProcessKept},
    },
    runtimes::{Runtimes, WorkerNames},
};

/// Something that yields cumulative samples: the kernel now, a recording later.
pub trait Source {
    /// Reads every worker's counters as of now.
    fn sample(&mut self) -> anyhow::Result<Sample>;

    /// Takes back a sample the caller is done with, to reuse its buffers for the next.
    fn recycle(&mut self, spent: Sample) {
        drop(spent);
    }
}

/// Lifecycle events kept for a caller that has not asked for them.
const MAX_PENDING_EVENTS: usize = 65_536;
/// Process events given at one `drain_process_events` call: every process on the node makes
/// three or more, and watch calls every 50 ms.
const PROCESS_EVENTS_PER_PULL: usize = 16_384;
/// Lifecycle events given at one `drain_events` call (watch and serve call every 50 ms;
/// record, once a tick, calls until none wait).
const EVENTS_PER_PULL: usize = 1_024;
/// Summarised workers remembered for `free_late_counters`.
const MAX_FINISHED: usize = 1_024;
/// Memory cgroup peaks of removed cgroups kept for a caller that never finishes them (top).
const MAX_REMOVED_PEAKS: usize = 16_384;

/// A sample's workers by cgroup id, as [`Sample::workers`] holds them.
type Workers = std::collections::BTreeMap<u64, WorkerCounters>;

/// CPU counters per cgroup id: sorted by cgroup id, one entry each.
type CpuPerWorker = Vec<(u64, WorkerCounters)>;

/// A spent worker's vector of on-CPU time per CPU and box of summed counters, reused for the
/// next read's workers.
#[derive(Default)]
struct SparePerCpu(Vec<(Vec<u64>, Box<CpuStats>)>);

impl SparePerCpu {
    /// A worker's scheduler counters from its counters on each CPU (on-CPU time kept per
    /// CPU, the rest summed), in spare buffers if there are.
    fn counters<'a>(&mut self, per_cpu: impl Iterator<Item = &'a CpuStats>) -> WorkerCounters {
        let (on_cpu_ns_per_cpu, sched) = self.0.pop().unwrap_or_default();
        // Field by field: `..Default::default()` would allocate a box only to drop it.
        let mut worker = WorkerCounters {
            path: None,
            identity: None,
            on_cpu_ns_per_cpu,
            sched,
            net: Default::default(),
            cpu_stat: None,
            endpoints: Vec::new(),
            exit_memory: None,
        };
        for (cpu, counters) in per_cpu.enumerate() {
            worker.add_cpu(cpu, counters);
        }
        worker
    }

    /// Keeps the buffers of `worker`, emptied, for a later [`SparePerCpu::counters`].
    fn give(&mut self, worker: WorkerCounters) {
        let WorkerCounters {
            mut on_cpu_ns_per_cpu,
            mut sched,
            ..
        } = worker;
        on_cpu_ns_per_cpu.clear();
        *sched = CpuStats::default();
        self.0.push((on_cpu_ns_per_cpu, sched));
    }
}

/// A slice still running on a CPU when the maps were read.
struct RunningSlice {
    cpu: usize,
    slice_ns: u64,
    /// cgroup2 path of the running thread.
    path: String,
}

/// Process workers' endpoint map and the map counting each process's endpoints.
type ProcessEndpointMaps = (
    PerCpuHashMap<MapData, EndpointKey, EndpointStats>,
    aya::maps::HashMap<MapData, u64, u64>,
);

/// Reads the maps of the loaded programs.
pub struct KernelCollector {
    cpu_stats: PerCpuHashMap<MapData, u64, CpuStats>,
    /// The last read of `cpu_stats`, its buffers kept for the next.
    cpu_entries: batch::PerCpuEntries<u64, CpuStats>,
    /// Whether the programs ever made an entry in `cpu_stats` or `net_stats` (absent from an
    /// older pin set: then both are read each sample).
    hashes_used: Option<aya::maps::Array<MapData, u64>>,
    /// The fast path's slots (absent from an older pin set).
    cpu_slots: Option<SlotMaps<SlotCounters>>,
    /// Socket counters of the workers with slots, summed over CPUs, from the last read of the
    /// slots.
    slot_net: Vec<(u64, NetStats)>,
    net_stats: PerCpuHashMap<MapData, u64, NetStats>,
    /// The last read of `net_stats`, its buffers kept for the next (a fresh one each
    /// sample was an allocation the size of the whole batch, mapped and unmapped).
    net_entries: batch::PerCpuEntries<u64, NetStats>,
    endpoints: PerCpuHashMap<MapData, EndpointKey, EndpointStats>,
    endpoint_counts: aya::maps::HashMap<MapData, u64, u64>,
    /// The endpoints' fast path (absent from an older pin set).
    endpoint_slots: Option<SlotMaps<EndpointSlot>>,
    /// Each worker's socket calls at the last read of `endpoints`, and what that read gave:
    /// every endpoint update comes with a socket call, so while the calls stand still the
    /// endpoints do too, and the read (a scan of the map's every bucket) is skipped.
    endpoints_read_at_calls: crate::IdMap<u64>,
    /// The calls of this sample, its buffer kept for the next.
    calls_now: crate::IdMap<u64>,
    last_endpoints: Vec<EndpointDelta>,
    /// Process workers' endpoints and their counts (absent from a pinned set).
    process_endpoint_maps: Option<ProcessEndpointMaps>,
    /// Processes' endpoints by pid, from the read since the last `begin_process_takes`.
    process_endpoints: Option<std::collections::HashMap<u32, Vec<EndpointDelta>>>,
    drops: PerCpuArray<MapData, u64>,
    last_switch: PerCpuArray<MapData, LastSwitch>,
    /// The lifecycle ring, emptied by its own thread.
    events: RingReader<RingEvent>,
    /// The process ring, until `drain_process_events` first asks for it.
    process_ring: Option<RingBuf<MapData>>,
    /// The process ring, emptied by its own thread once asked for.
    process_events: Option<RingReader<ProcessEvent>>,
    /// Each process's CPU time per CPU, for process workers (absent from a pinned set).
    process_cpu: Option<PerCpuHashMap<MapData, u32, u64>>,
    /// Each running process's socket bytes per CPU, for live trees (absent from a pinned set).
    process_net: Option<PerCpuHashMap<MapData, u32, ProcessBytes>>,
    /// Largest resident set of each worker's exited processes, per CPU (pages).
    process_peaks: PerCpuHashMap<MapData, u64, u64>,
    /// Removed cgroups' memory cgroup peaks (bytes), as their removal events told, until
    /// `finish` takes them.
    removed_memory_peaks: std::collections::BTreeMap<u64, u64>,
    /// Bytes in a page, for the kernel's page counts.
    page_bytes: u64,
    /// Lifecycle events read but not yet taken by `drain_events`.
    pending_events: std::collections::VecDeque<LifecycleEvent>,
    /// Whether the caller takes events (`drain_events`), so none may be dropped for room.
    events_taken: bool,
    /// Workers whose summaries were taken, most recent last (at most [`MAX_FINISHED`]): what
    /// the programs still add for one (a thread's last slice after the summary) is freed
    /// unreported, so no slot or entry stays taken by a worker that is gone.
    finished: std::collections::VecDeque<u64>,
    /// The ids of `finished`, to look up.
    finished_ids: std::collections::HashSet<u64>,
    /// Gives a burst's freed memory back to the kernel.
    heap: HeapReturn,
    /// CPU time from the kernel's per-cgroup accounting, when the plan chose it (the
    /// programs then count no CPU time).
    rstat: Option<RstatReader>,
    /// Every cgroup's memory by one walk a sample, when the plan chose it.
    memory_walk: Option<MemoryWalk>,
    /// Every cgroup's processes' resident sets by one walk a sample, when the plan chose it.
    rss_walk: Option<ProcessWalk>,
    /// What the last sample's walks found, until taken.
    walked_memory: WalkedMemory,
    /// On-CPU ns per CPU last reported for each worker (see `never_go_backwards`).
    reported_on_cpu_ns: crate::IdMap<Vec<u64>>,
    /// Per-CPU vectors of spent samples' workers, emptied, for the next sample's (at most
    /// one per worker of the last sample): a thousand workers made and freed a thousand
    /// vectors a second.
    spare_per_cpu: SparePerCpu,
    /// The last read's CPU counters per worker, kept for its buffer.
    gathered: CpuPerWorker,
    /// Workers in the last sample: how many spare vectors are kept.
    last_sample_workers: usize,
    cgroups: CgroupIndex,
    /// Each cgroup's identity, with its container runtime's names.
    names: WorkerNames,
    /// Possible CPUs: every worker gets one per-CPU entry for each.
    cpus: usize,
    /// What the attached programs measure; every sample says so.
    measured: Measured,
    /// Keeps the programs attached as long as the collector lives.
    _probe: Probe,
}

impl KernelCollector {
    /// Takes the maps out of `probe`.
    pub fn new(mut probe: Probe, cgroups: CgroupIndex) -> anyhow::Result<Self> {
        let cpu_iter = probe.take_cpu_iter();
        let memory_iter = probe.take_memory_iter();
        let rss_iter = probe.take_rss_iter();
        let cpus = aya::util::nr_cpus().map_err(|(what, err)| anyhow::anyhow!("{what}: {err}"))?;
        let mut take = |name: &str| {
            probe
                .take_map(name)
                .with_context(|| format!("map {name} missing from the eBPF object"))
        };
        let cpu_stats = PerCpuHashMap::try_from(take(CPU_STATS_MAP)?)
            .with_context(|| format!("map {CPU_STATS_MAP}"))?;
        let cpu_slots = SlotMaps::new(
            take(CPU_SLOTS_MAP).ok(),
            take(SLOT_OF_MAP).ok(),
            take(FREE_SLOTS_MAP).ok(),
            cpus,
        );
        let net_stats = PerCpuHashMap::try_from(take(NET_STATS_MAP)?)
            .with_context(|| format!("map {NET_STATS_MAP}"))?;
        let hashes_used = take(HASHES_USED_MAP)
            .ok()
            .and_then(|map| aya::maps::Array::try_from(map).ok());
        let drops =
            PerCpuArray::try_from(take(DROPS_MAP)?).with_context(|| format!("map {DROPS_MAP}"))?;
        let endpoints = PerCpuHashMap::try_from(take(ENDPOINTS_MAP)?)
            .with_context(|| format!("map {ENDPOINTS_MAP}"))?;
        let endpoint_counts = aya::maps::HashMap::try_from(take(ENDPOINT_COUNTS_MAP)?)
            .with_context(|| format!("map {ENDPOINT_COUNTS_MAP}"))?;
        let endpoint_slots = SlotMaps::new(
            take(ENDPOINT_SLOTS_MAP).ok(),
            take(ENDPOINT_SLOT_OF_MAP).ok(),
            take(FREE_ENDPOINT_SLOTS_MAP).ok(),
            cpus,
        );
        let last_switch = PerCpuArray::try_from(take(LAST_SWITCH_MAP)?)
            .with_context(|| format!("map {LAST_SWITCH_MAP}"))?;
        let events = RingReader::start(
            RingBuf::try_from(take(EVENTS_MAP)?).with_context(|| format!("map {EVENTS_MAP}"))?,
            "cgroup-events",
            decode_cgroup_event,
        )?;
        // Absent from a pinned set: process workers are not pinned.
        let process_ring = take(PROCESS_EVENTS_MAP)
            .ok()
            .and_then(|map| RingBuf::try_from(map).ok());
        let process_cpu = take(PROCESS_CPU_MAP)
            .ok()
            .and_then(|map| PerCpuHashMap::try_from(map).ok());
        let process_net = take(PROCESS_NET_MAP)
            .ok()
            .and_then(|map| PerCpuHashMap::try_from(map).ok());
        let process_endpoint_maps = take(PROCESS_ENDPOINTS_MAP)
            .ok()
            .and_then(|map| PerCpuHashMap::try_from(map).ok())
            .zip(
                take(PROCESS_ENDPOINT_COUNTS_MAP)
                    .ok()
                    .and_then(|map| aya::maps::HashMap::try_from(map).ok()),
            );
        let process_peaks = PerCpuHashMap::try_from(take(PROCESS_PEAKS_MAP)?)
            .with_context(|| format!("map {PROCESS_PEAKS_MAP}"))?;
        let rstat = match cpu_iter {
            Some(iter) => {
                let maps = rstat::RstatMaps {
                    cpu_now: take(probe_common::rstat::CPU_NOW_MAP)?,
                    last_walk: take(probe_common::rstat::LAST_WALK_MAP)?,
                    final_cpu: take(probe_common::rstat::FINAL_CPU_MAP)?,
                };
                Some(RstatReader::new(iter, maps, cpus)?)
            }
            None => None,
        };
        let memory_walk = match memory_iter {
            Some(iter) => Some(MemoryWalk::new(
                iter,
                take(probe_common::memory::MEMORY_NOW_MAP)?,
                take(probe_common::memory::LAST_MEMORY_WALK_MAP)?,
            )?),
            None => None,
        };
        let rss_walk = rss_iter.map(ProcessWalk::new);
        let measured = probe.measured();
        Ok(Self {
            rstat,
            memory_walk,
            rss_walk,
            walked_memory: WalkedMemory::default(),
            measured,
            events,
            process_ring,
            process_events: None,
            process_cpu,
            process_net,
            process_peaks,
            removed_memory_peaks: std::collections::BTreeMap::new(),
            page_bytes: memory::page_bytes(),
            pending_events: std::collections::VecDeque::new(),
            events_taken: false,
            last_switch,
            reported_on_cpu_ns: crate::IdMap::default(),
            spare_per_cpu: SparePerCpu::default(),
            gathered: Vec::new(),
            last_sample_workers: 0,
            finished: std::collections::VecDeque::new(),
            finished_ids: std::collections::HashSet::new(),
            heap: HeapReturn::new(),
            cpu_stats,
            cpu_entries: batch::PerCpuEntries::new(cpus),
            hashes_used,
            cpu_slots,
            slot_net: Vec::new(),
            net_stats,
            net_entries: batch::PerCpuEntries::new(cpus),
            endpoints,
            endpoint_counts,
            endpoint_slots,
            endpoints_read_at_calls: crate::IdMap::default(),
            calls_now: crate::IdMap::default(),
            last_endpoints: Vec::new(),
            process_endpoint_maps,
            process_endpoints: None,
            drops,
            cgroups,
            names: WorkerNames::new(Runtimes::none()),
            cpus,
            _probe: probe,
        })
    }

    /// Names containers with what `runtimes` say of them, not only their ids.
    pub fn with_runtimes(mut self, runtimes: Runtimes) -> Self {
        self.names = WorkerNames::new(runtimes);
        self
    }
}

impl Source for KernelCollector {
    fn sample(&mut self) -> anyhow::Result<Sample> {
        // By now the caller has dropped the last sample and written what it made of it.
        self.heap.maybe_trim();
        // The files tell the same numbers: a walk that fails is left for them from now on.
        if let Some(walk) = self.memory_walk.as_mut() {
            self.walked_memory.cgroups = walk.read().ok();
            if self.walked_memory.cgroups.is_none() {
                self.memory_walk = None;
            }
        }
        if let Some(walk) = self.rss_walk.as_mut() {
            self.walked_memory.processes = walk.read().ok();
            if self.walked_memory.processes.is_none() {
                self.rss_walk = None;
            }
        }
        let taken_at = Some(Timestamp::now());
        let mut sample = Sample {
            taken_at,
            measured: self.measured,
            ..Sample::default()
        };
        // For a caller that takes events, only the room left in the pending list: the rest
        // wait in the reader's queue, nothing dropped. One that never does (top) only needs
        // the paths, and keeps the recent events.
        let room = if self.events_taken {
            MAX_PENDING_EVENTS.saturating_sub(self.pending_events.len())
        } else {
            usize::MAX
        };
        self.pull_events(room);
        let running = self.read_cpu_consistently()?;
        // The sample's first workers, sorted and unique: built in one pass (a thousand
        // inserts one by one were a twentieth of the agent's CPU at a thousand workers).
        sample.workers = self.gathered.drain(..).collect();
        if let Some(rstat) = self.rstat.as_mut() {
            for (cgroup_id, times) in rstat.read()? {
                rstat::apply(sample.workers.entry(cgroup_id).or_default(), &times);
            }
        }
        self.free_late_counters(&mut sample.workers);
        // Buffers kept from one sample to the next.
        let mut calls = std::mem::take(&mut self.calls_now);
        calls.clear();
        let slot_net = std::mem::take(&mut self.slot_net);
        if self.hash_used(HASHED_NET) {
            read_all_into(&self.net_stats, &mut self.net_entries)?;
        } else {
            self.net_entries.clear();
        }
        let slot_net_per_cpu = slot_net
            .iter()
            .map(|(cgroup_id, net)| (*cgroup_id, std::slice::from_ref(net)));
        for (cgroup_id, per_cpu) in self.net_entries.iter().chain(slot_net_per_cpu) {
            if self.finished_ids.contains(&cgroup_id) {
                // Bytes of a worker already summarised: freed, not shown as a new worker.
                let _ = self.net_stats.remove(&cgroup_id);
                continue;
            }
            let net = &mut sample.workers.entry(cgroup_id).or_default().net;
            for on_cpu in per_cpu.iter() {
                net.add(on_cpu);
            }
            if self.measured.endpoints {
                let worker_calls: u64 = net
                    .families
                    .iter()
                    .map(|f| f.sent_calls + f.received_calls)
                    .sum();
                calls.insert(cgroup_id, worker_calls);
            }
        }
        self.slot_net = slot_net;
        if self.measured.endpoints {
            // Read after the calls: a call in between is in both by the next read.
            if calls != self.endpoints_read_at_calls {
                self.last_endpoints = self.read_endpoints()?;
                std::mem::swap(&mut self.endpoints_read_at_calls, &mut calls);
            }
            for endpoint in &self.last_endpoints {
                let worker = sample.workers.entry(endpoint.key.cgroup_id).or_default();
                worker.endpoints.push(endpoint.clone());
            }
        }
        self.calls_now = calls;
        for (cgroup_id, worker) in sample.workers.iter_mut() {
            // An unknown id walks the hierarchy: at most once every two seconds, for all of them.
            worker.path = self.cgroups.resolve(*cgroup_id);
            worker.identity = worker
                .path
                .as_deref()
                .map(|path| self.names.identity(*cgroup_id, path));
            // Workers seen only in the network map still get one entry per CPU.
            worker.on_cpu_ns_per_cpu.resize(self.cpus, 0);
        }
        self.add_running_slices(&mut sample, running);
        self.never_go_backwards(&mut sample);
        sample.drops = self.read_drops()?;
        self.last_sample_workers = sample.workers.len();
        Ok(sample)
    }

    fn recycle(&mut self, spent: Sample) {
        for (_, worker) in spent.workers {
            if self.spare_per_cpu.0.len() >= self.last_sample_workers {
                break;
            }
            self.spare_per_cpu.give(worker);
        }
    }
}

impl KernelCollector {
    /// Cgroups made and removed since the last call, oldest first, at most [`EVENTS_PER_PULL`]
    /// (the rest wait for the next call): a backlog waits compact in the reader's queue, so
    /// catching up does not swell the agent.
    pub fn drain_events(&mut self) -> Vec<LifecycleEvent> {
        self.events_taken = true;
        self.pull_events(EVENTS_PER_PULL);
        let taken = self.pending_events.len().min(EVENTS_PER_PULL);
        self.pending_events.drain(..taken).collect()
    }

    /// Process events since the last call, oldest first, at most [`PROCESS_EVENTS_PER_PULL`]; the
    /// first call starts their reader. Empty unless the programs were loaded for processes.
    pub fn drain_process_events(&mut self) -> anyhow::Result<Vec<ProcessEvent>> {
        if self.process_events.is_none()
            && let Some(ring) = self.process_ring.take()
        {
            self.process_events = Some(RingReader::start(
                ring,
                "process-events",
                decode_process_event,
            )?);
        }
        let Some(reader) = &self.process_events else {
            return Ok(Vec::new());
        };
        Ok(std::iter::from_fn(|| reader.try_next())
            .take(PROCESS_EVENTS_PER_PULL)
            .collect())
    }

    /// True when process events wait to be taken.
    pub fn process_events_waiting(&self) -> bool {
        self.process_events
            .as_ref()
            .is_some_and(RingReader::waiting)
    }

    /// True when events wait that `drain_events` has not yet given.
    pub fn events_waiting(&self) -> bool {
        !self.pending_events.is_empty() || self.events.waiting()
    }

    /// Takes the events the ring's reader has queued, and learns new cgroups' paths from them.
    /// At most `limit` at a time.
    fn pull_events(&mut self, limit: usize) {
        for _ in 0..limit {
            let Some(event) = self.events.try_next() else {
                break;
            };
            let memory_peak_pages = event.memory_peak_pages;
            let event = LifecycleEvent {
                cgroup_id: event.cgroup_id,
                at_monotonic_ns: event.at_ns,
                made: event.made,
                identity: self.names.identity(event.cgroup_id, &event.path),
                path: if event.path.is_empty() {
                    "/".into()
                } else {
                    event.path
                },
            };
            if event.made {
                self.cgroups.insert(event.cgroup_id, &event.path);
            }
            if !event.made && memory_peak_pages > 0 {
                // Ids grow: when full, the oldest removal goes.
                if self.removed_memory_peaks.len() >= MAX_REMOVED_PEAKS {
                    self.removed_memory_peaks.pop_first();
                }
                self.removed_memory_peaks
                    .insert(event.cgroup_id, memory_peak_pages * self.page_bytes);
            }
            // Bounded: a caller that never takes events (top) keeps only the recent ones.
            if self.pending_events.len() >= MAX_PENDING_EVENTS {
                self.pending_events.pop_front();
            }
            self.pending_events.push_back(event);
        }
    }

    /// The final counters of a removed worker, then its map entries are freed. `None` if it
    /// never did anything since the programs were loaded.
    pub fn finish(&mut self, cgroup_id: u64) -> Option<WorkerCounters> {
        let exit_memory = self.take_exit_memory(cgroup_id);
        let hashed = self.cpu_stats.get(&cgroup_id, 0).ok().map(|c| c.to_vec());
        let slotted = self
            .cpu_slots
            .as_mut()
            .and_then(|slots| slots.finish(cgroup_id, self.cpus));
        let net = self.net_stats.get(&cgroup_id, 0).ok().map(|n| n.to_vec());
        let final_cpu = self
            .rstat
            .as_mut()
            .and_then(|rstat| rstat.take_final(cgroup_id));
        if hashed.is_none() && slotted.is_none() && net.is_none() && final_cpu.is_none() {
            return None;
        }
        let mut worker = WorkerCounters {
            on_cpu_ns_per_cpu: vec![0; self.cpus],
            exit_memory,
            ..WorkerCounters::default()
        };
        for (cpu, counters) in hashed.iter().flatten().enumerate() {
            worker.add_cpu(cpu, counters);
        }
        for (cpu, slot) in slotted.iter().flatten().enumerate() {
            worker.add_cpu(cpu, &slot.stats);
        }
        if let Some(times) = final_cpu {
            rstat::apply(&mut worker, &times);
        }
        let slotted_net = slotted.map(|per_cpu| per_cpu.iter().map(|slot| slot.net).collect());
        for per_cpu in [net, slotted_net].into_iter().flatten() {
            for on_cpu in &per_cpu {
                worker.net.add(on_cpu);
            }
        }
        if self.measured.endpoints {
            worker.endpoints = self.take_endpoints(cgroup_id);
        }
        // Free the entries: the cgroup is gone and its id will not come back.
        let _ = self.cpu_stats.remove(&cgroup_id);
        self.mark_finished(cgroup_id);
        let _ = self.net_stats.remove(&cgroup_id);
        self.reported_on_cpu_ns.remove(&cgroup_id);
        self.cgroups.forget(cgroup_id);
        self.names.forget(cgroup_id);
        Some(worker)
    }

    /// The slot of the programs' fast path that holds the worker's counters, if it has one
    /// (`None`: they are in the hash maps).
    pub fn slot_of(&self, cgroup_id: u64) -> Option<u32> {
        self.cpu_slots.as_ref()?.slot_of(cgroup_id)
    }

    /// The slots of the endpoints' fast path that hold the worker's endpoints (none: they
    /// are in the endpoint hash, or endpoints are not measured).
    pub fn endpoint_slots_of(&mut self, cgroup_id: u64) -> Vec<u32> {
        let Some(slots) = self.endpoint_slots.as_mut() else {
            return Vec::new();
        };
        let Ok(in_use) = slots.slots_in_use() else {
            return Vec::new();
        };
        in_use
            .iter()
            .filter(|(key, _)| key.cgroup_id == cgroup_id)
            .map(|&(_, slot)| slot)
            .collect()
    }

    /// Frees what the programs keep for a removed cgroup no one reports on (its slot, its
    /// hash entries), as [`KernelCollector::finish`] does for a worker.
    pub fn discard(&mut self, cgroup_id: u64) {
        let _ = self.cpu_stats.remove(&cgroup_id);
        if let Some(rstat) = self.rstat.as_mut() {
            rstat.forget(cgroup_id);
        }
        let _ = self.net_stats.remove(&cgroup_id);
        if self.measured.endpoints {
            let _ = self.take_endpoints(cgroup_id);
        }
        let _ = self.process_peaks.remove(&cgroup_id);
        if let Some(slots) = self.cpu_slots.as_mut() {
            let _ = slots.finish(cgroup_id, self.cpus);
        }
        self.removed_memory_peaks.remove(&cgroup_id);
        self.reported_on_cpu_ns.remove(&cgroup_id);
        self.mark_finished(cgroup_id);
        self.cgroups.forget(cgroup_id);
        self.names.forget(cgroup_id);
    }

    /// Every worker's endpoints: their slots' and their hash entries' (an endpoint may have
    /// both, e.g. a slot taken after the hash took its first calls), summed by endpoint.
    /// Entries of workers already summarised are freed unreported, as `free_late_counters`
    /// does for their CPU counters.
    fn read_endpoints(&mut self) -> anyhow::Result<Vec<EndpointDelta>> {
        let slotted = match &mut self.endpoint_slots {
            Some(slots) => slots.read_all()?,
            None => Vec::new(),
        };
        let (late, live): (Vec<_>, Vec<_>) = read_all(&self.endpoints, self.cpus)?
            .into_iter()
            .chain(slotted.into_iter().map(slot_stats))
            .partition(|(key, _)| self.finished_ids.contains(&key.cgroup_id));
        let mut late: Vec<u64> = late.iter().map(|(key, _)| key.cgroup_id).collect();
        late.sort_unstable();
        late.dedup();
        for cgroup_id in late {
            let _ = self.take_endpoints(cgroup_id);
        }
        Ok(sum_by_endpoint(live))
    }

    /// A removed worker's endpoints, from one read of the whole hash and of the slots (exits
    /// are rare beside ticks); its entries and slots are freed.
    fn take_endpoints(&mut self, cgroup_id: u64) -> Vec<EndpointDelta> {
        let mut entries = Vec::new();
        for (key, per_cpu) in read_all(&self.endpoints, self.cpus).unwrap_or_default() {
            if key.cgroup_id == cgroup_id {
                let _ = self.endpoints.remove(&key);
                entries.push((key, per_cpu));
            }
        }
        if let Some(slots) = self.endpoint_slots.as_mut() {
            for (key, _) in slots.read_all().unwrap_or_default() {
                if key.cgroup_id == cgroup_id
                    && let Some(per_cpu) = slots.finish(key, self.cpus)
                {
                    entries.push(slot_stats((key, per_cpu)));
                }
            }
        }
        let _ = self.endpoint_counts.remove(&cgroup_id);
        self.last_endpoints.retain(|e| e.key.cgroup_id != cgroup_id);
        self.endpoints_read_at_calls.remove(&cgroup_id);
        sum_by_endpoint(entries)
    }

    /// Remembers a cgroup whose counters were taken or freed (see `finished`).
    fn mark_finished(&mut self, cgroup_id: u64) {
        if self.finished.len() == MAX_FINISHED
            && let Some(oldest) = self.finished.pop_front()
        {
            self.finished_ids.remove(&oldest);
        }
        if self.finished_ids.insert(cgroup_id) {
            self.finished.push_back(cgroup_id);
        }
    }

    /// What the programs kept of an ended process beside its threads' ends (its CPU time on
    /// each CPU, and its endpoints where it moved bytes and endpoints are measured), then its
    /// entries are freed. Its endpoints come from one read of the whole endpoint map per
    /// [`Self::begin_process_takes`], shared by the processes taken after it.
    pub fn take_process(&mut self, pid: u32, moved_bytes: bool) -> ProcessKept {
        if let Some(net) = self.process_net.as_mut() {
            let _ = net.remove(&pid);
        }
        // A process that moved no bytes (as its threads told) triggers no read, but takes what
        // a read made for another found of it (a thread without state has untold bytes).
        let endpoints =
            if self.measured.endpoints && (moved_bytes || self.process_endpoints.is_some()) {
                self.take_process_endpoints(pid)
            } else {
                Vec::new()
            };
        let Some(map) = self.process_cpu.as_mut() else {
            return ProcessKept {
                endpoints,
                ..ProcessKept::default()
            };
        };
        let cpu_ns_per_cpu = map
            .get(&pid, 0)
            .map(|values| values.iter().copied().collect())
            .unwrap_or_default();
        let _ = map.remove(&pid);
        ProcessKept {
            cpu_ns_per_cpu,
            endpoints,
        }
    }

    /// Processes are about to be taken: their endpoints are read afresh (once, if any of them
    /// moved bytes), as each thread's end comes after its last socket call.
    pub fn begin_process_takes(&mut self) {
        self.process_endpoints = None;
    }

    fn take_process_endpoints(&mut self, pid: u32) -> Vec<EndpointDelta> {
        let Some((map, counts)) = self.process_endpoint_maps.as_mut() else {
            return Vec::new();
        };
        let cpus = self.cpus;
        let by_pid = self.process_endpoints.get_or_insert_with(|| {
            let mut by_pid: std::collections::HashMap<u32, Vec<EndpointDelta>> =
                std::collections::HashMap::new();
            for (key, per_cpu) in read_all(map, cpus).unwrap_or_default() {
                by_pid
                    .entry(key.cgroup_id as u32)
                    .or_default()
                    .push(sum_endpoint(key, &per_cpu));
            }
            by_pid
        });
        let endpoints = by_pid.remove(&pid).unwrap_or_default();
        for endpoint in &endpoints {
            let _ = map.remove(&endpoint.key);
        }
        let _ = counts.remove(&u64::from(pid));
        endpoints
    }

    /// A running process's socket bytes so far, sent and received, all its threads; `None`
    /// when it has made no socket call (or process workers are off).
    pub fn live_process_bytes(&self, pid: u32) -> Option<(u64, u64)> {
        let per_cpu = self.process_net.as_ref()?.get(&pid, 0).ok()?;
        Some(per_cpu.iter().fold((0, 0), |(sent, received), on_cpu| {
            (sent + on_cpu.sent_bytes, received + on_cpu.received_bytes)
        }))
    }

    /// The memory peaks the kernel kept for a removed worker, then their entries are freed.
    pub fn take_exit_memory(&mut self, cgroup_id: u64) -> Option<ExitMemoryPeaks> {
        let cgroup_peak_bytes = self.removed_memory_peaks.remove(&cgroup_id);
        let largest_process_peak_bytes = self
            .process_peaks
            .get(&cgroup_id, 0)
            .ok()
            .and_then(|per_cpu| per_cpu.iter().copied().max())
            .map(|pages| pages * self.page_bytes);
        let _ = self.process_peaks.remove(&cgroup_id);
        (cgroup_peak_bytes.is_some() || largest_process_peak_bytes.is_some()).then_some(
            ExitMemoryPeaks {
                cgroup_peak_bytes,
                largest_process_peak_bytes,
            },
        )
    }

    /// What the attached programs measure.
    pub fn measured(&self) -> Measured {
        self.measured
    }

    /// The cgroup at `path` as a worker: its id (if it exists) and who it is, with its
    /// runtime's names (a pod that `--depth` made a worker though no thread of its own ran).
    pub fn holder(
        &mut self,
        path: &str,
    ) -> (u64, std::sync::Arc<crate::model::identity::Identity>) {
        match crate::cgroup::cgroup_id(&self.cgroups.dir_of(path)) {
            Ok(cgroup_id) => (cgroup_id, self.names.identity(cgroup_id, path)),
            // Gone: named by its path alone (the names are kept by id).
            Err(_) => (
                0,
                std::sync::Arc::new(crate::model::identity::identify(path)),
            ),
        }
    }

    /// What the last sample's walks found (nothing without walks: memory is then read from
    /// each worker's files).
    pub fn take_walked_memory(&mut self) -> WalkedMemory {
        std::mem::take(&mut self.walked_memory)
    }

    /// Where the cgroup2 hierarchy is, and which path each id names.
    pub fn cgroups(&mut self) -> &mut CgroupIndex {
        &mut self.cgroups
    }

    fn read_last_switches(&self) -> anyhow::Result<Vec<LastSwitch>> {
        Ok(self
            .last_switch
            .get(&0, 0)
            .context("reading the last switch of each CPU")?
            .to_vec())
    }

    /// Reads the CPU map and the slice each CPU is running now, as one consistent picture.
    ///
    /// The programs count a slice only when it ends. A CPU whose switch count is the same
    /// before and after reading the map ran one slice throughout: the map lacks it, and its
    /// thread's runtime since its switch-in is exactly what the program will add at its end.
    /// If a CPU switched while we read, and the slice it was running had been long, read again
    /// (a few times at most); what is still unsettled then is left to the next sample. A CPU
    /// whose record names a thread not running there switched unreported: it is made to
    /// switch, and read again. The counters go to `self.gathered`, sorted by cgroup id; the
    /// running slices are returned.
    fn read_cpu_consistently(&mut self) -> anyhow::Result<Vec<RunningSlice>> {
        const ATTEMPTS: usize = 3;
        /// A running slice this long, on a CPU that switched while the maps were read, is
        /// worth a read again.
        const LONG_SLICE_NS: u64 = 10_000_000;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let before = self.read_last_switches()?;
            // The slots hold socket counters too: kept from the read that is used.
            self.slot_net.clear();
            // A read again (a busy CPU switched meanwhile, as at most samples of a thousand
            // ticking workers) reuses the last read's vectors.
            for (_, worker) in self.gathered.drain(..) {
                self.spare_per_cpu.give(worker);
            }
            if self.hash_used(HASHED_CPU) {
                read_all_into(&self.cpu_stats, &mut self.cpu_entries)?;
                for (cgroup_id, per_cpu) in self.cpu_entries.iter() {
                    let worker = self.spare_per_cpu.counters(per_cpu.iter());
                    self.gathered.push((cgroup_id, worker));
                }
            }
            if let Some(slots) = &mut self.cpu_slots {
                for (cgroup_id, per_cpu) in slots.read()? {
                    let worker = self
                        .spare_per_cpu
                        .counters(per_cpu.iter().map(|slot| &slot.stats));
                    self.gathered.push((cgroup_id, worker));
                    // Summed over CPUs here: no vector per worker.
                    let mut net = NetStats::default();
                    for on_cpu in per_cpu {
                        net.add(&on_cpu.net);
                    }
                    self.slot_net.push((cgroup_id, net));
                }
            }
            let mut running = Vec::new();
            let mut stale = Vec::new();
            for (cpu, record) in before.iter().enumerate() {
                if record.switch_count == 0 || record.next_tid == 0 {
                    continue; // no switch seen yet, or idle
                }
                let tid = record.next_tid;
                if cgroup::read_thread_running_cpu(tid) != Some(cpu) {
                    // The CPU switched since without a report: the kernel hid the switch from
                    // tracing (this host's 6.18 hides some of its init's threads' switches).
                    // The record's slice is not what runs there, and what does is unknown
                    // until the CPU switches again.
                    stale.push(cpu);
                    continue;
                }
                let (Some(runtime_ns), Some(path)) = (
                    cgroup::read_thread_runtime_ns(tid),
                    cgroup::read_thread_cgroup2_path(tid),
                ) else {
                    continue; // the thread is gone
                };
                if let Some(slice_ns) = runtime_ns.checked_sub(record.next_accounted_runtime_ns) {
                    running.push(RunningSlice {
                        cpu,
                        slice_ns,
                        path,
                    });
                }
            }
            let after = self.read_last_switches()?;
            let settled = |cpu: usize| {
                after.get(cpu).map(|record| record.switch_count)
                    == before.get(cpu).map(|record| record.switch_count)
            };
            // A CPU that switched meanwhile ended the slice it was running: that slice is in
            // this read or the next, and only what it ran is unsure. A read again is worth it
            // for a long one (a thread alone on its CPU, whose whole run would otherwise wait a
            // sample); a busy CPU's short slices are left to the next sample: at a thousand
            // ticking workers some CPU switched during nearly every read, and each read again
            // cost as much as the first.
            let long_slice_unsure = running
                .iter()
                .any(|slice| !settled(slice.cpu) && slice.slice_ns >= LONG_SLICE_NS);
            // A CPU that switched meanwhile has a new record anyway.
            stale.retain(|&cpu| settled(cpu));
            if (!long_slice_unsure && stale.is_empty()) || attempt == ATTEMPTS {
                running.retain(|slice| settled(slice.cpu));
                sort_per_worker(&mut self.gathered);
                return Ok(running);
            }
            // Its next switch is reported, and charges what ran there unseen: made now, so
            // a thread alone on its CPU is not left out until it leaves (seconds, if busy).
            crate::cpu_switch::switch_cpus(stale);
        }
    }

    /// Whether the programs made an entry in the hash at `index` of `HASHES_USED` (workers
    /// beyond the slots): until they do it is empty, and its read (a scan of every bucket)
    /// is skipped. Set before the entry is made, so a read after it is seen finds the entry.
    fn hash_used(&self, index: u32) -> bool {
        self.hashes_used
            .as_ref()
            .is_none_or(|used| !matches!(used.get(&index, 0), Ok(0)))
    }

    /// Frees, unreported, what the programs added for workers already summarised.
    fn free_late_counters(&mut self, per_worker: &mut Workers) {
        if self.finished_ids.is_empty() {
            return;
        }
        let late: Vec<u64> = per_worker
            .keys()
            .copied()
            .filter(|id| self.finished_ids.contains(id))
            .collect();
        for cgroup_id in late {
            per_worker.remove(&cgroup_id);
            let _ = self.cpu_stats.remove(&cgroup_id);
            let _ = self.net_stats.remove(&cgroup_id);
            if let Some(slots) = self.cpu_slots.as_mut() {
                let _ = slots.finish(cgroup_id, self.cpus);
            }
        }
        // Their socket counters, read with the slots, go too.
        let finished = &self.finished_ids;
        self.slot_net
            .retain(|(cgroup_id, _)| !finished.contains(cgroup_id));
    }

    /// Adds the running slices to their workers.
    fn add_running_slices(&mut self, sample: &mut Sample, running: Vec<RunningSlice>) {
        for RunningSlice {
            cpu,
            slice_ns,
            path,
        } in running
        {
            let Ok(cgroup_id) = cgroup::cgroup_id(&self.cgroups.dir_of(&path)) else {
                continue;
            };
            let worker = sample.workers.entry(cgroup_id).or_default();
            worker.on_cpu_ns_per_cpu.resize(self.cpus, 0);
            if worker.path.is_none() {
                worker.identity = Some(self.names.identity(cgroup_id, &path));
                worker.path = Some(path.into());
            }
            if let Some(on_cpu_ns) = worker.on_cpu_ns_per_cpu.get_mut(cpu) {
                *on_cpu_ns += slice_ns;
            }
        }
    }

    /// A running slice reported in one sample may be missing from the next if it ended while
    /// that one was read; its full length arrives in the sample after. Reporting at least
    /// what was reported before keeps every counter monotonic without counting twice.
    fn never_go_backwards(&mut self, sample: &mut Sample) {
        // Updated in place: a new map and a vector per worker each sample cost the agent
        // a thousand allocations a second at a thousand workers.
        self.reported_on_cpu_ns
            .retain(|cgroup_id, _| sample.workers.contains_key(cgroup_id));
        for (&cgroup_id, worker) in sample.workers.iter_mut() {
            let reported = self.reported_on_cpu_ns.entry(cgroup_id).or_default();
            // A CPU not reported before has no floor (0).
            reported.resize(worker.on_cpu_ns_per_cpu.len(), 0);
            for (on_cpu_ns, floor) in worker.on_cpu_ns_per_cpu.iter_mut().zip(reported.iter_mut()) {
                *on_cpu_ns = (*on_cpu_ns).max(*floor);
                *floor = *on_cpu_ns;
            }
        }
    }

    fn read_drops(&self) -> anyhow::Result<Drops> {
        // A pin set made by an older agent has fewer slots; its programs count none beyond.
        let slots = self.drops.len();
        let by_map = (0..DROP_NAMES.len() as u32)
            .map(|slot| {
                if slot >= slots {
                    return Ok(0);
                }
                self.drops
                    .get(&slot, 0)
                    .map(|per_cpu| per_cpu.iter().sum())
                    .with_context(|| format!("reading drop counter {slot}"))
            })
            .collect::<anyhow::Result<Vec<u64>>>()?;
        Ok(Drops { by_map })
    }
}

/// An endpoint slot's counters per CPU.
fn slot_stats(
    (key, per_cpu): (EndpointKey, Vec<EndpointSlot>),
) -> (EndpointKey, Vec<EndpointStats>) {
    (key, per_cpu.iter().map(|slot| slot.stats).collect())
}

/// Endpoints' counters summed over CPUs and by endpoint (one may have both a slot and a hash
/// entry).
fn sum_by_endpoint(entries: Vec<(EndpointKey, Vec<EndpointStats>)>) -> Vec<EndpointDelta> {
    let mut by_key: std::collections::BTreeMap<EndpointKey, EndpointStats> =
        std::collections::BTreeMap::new();
    for (key, per_cpu) in entries {
        let sum = by_key.entry(key).or_default();
        crate::model::endpoints::add_stats(sum, &sum_endpoint(key, &per_cpu).stats);
    }
    by_key
        .into_iter()
        .map(|(key, stats)| EndpointDelta { key, stats })
        .collect()
}

/// One endpoint's counters summed over CPUs.
fn sum_endpoint(key: EndpointKey, per_cpu: &[EndpointStats]) -> EndpointDelta {
    let mut stats = EndpointStats::default();
    for on_cpu in per_cpu {
        crate::model::endpoints::add_stats(&mut stats, on_cpu);
    }
    EndpointDelta { key, stats }
}

/// Sorts CPU counters gathered from the hash and the slots by cgroup id: a worker in both
/// (its hash entry made while it had no slot) has them summed into one entry.
fn sort_per_worker(gathered: &mut CpuPerWorker) {
    // The slots come in id order: only hash entries (workers beyond the slots) need the sort.
    // Unstable: no scratch copy of the entries, and equal ids are summed anyway.
    if !gathered.is_sorted_by_key(|(cgroup_id, _)| *cgroup_id) {
        gathered.sort_unstable_by_key(|(cgroup_id, _)| *cgroup_id);
    }
    gathered.dedup_by(|later, earlier| {
        if later.0 != earlier.0 {
            return false;
        }
        earlier.1.add_sched(&later.1);
        true
    });
}

/// Every entry of a per-CPU hash map into `into`, in a few batched calls; key by key where
/// the kernel lacks batch lookups.
fn read_all_into<K: aya::Pod + Copy + Default, V: aya::Pod + Copy + Default>(
    map: &PerCpuHashMap<MapData, K, V>,
    into: &mut batch::PerCpuEntries<K, V>,
) -> anyhow::Result<()> {
    use aya::maps::IterableMap as _;
    use std::os::fd::AsFd as _;
    let fd = map.map().fd().as_fd();
    // SAFETY: the map is a per-CPU hash with Pod keys of type K and values of type V.
    match unsafe { batch::read_first(fd, usize::MAX, into) } {
        Ok(()) => Ok(()),
        Err(err) if err.raw_os_error() == Some(libc::EINVAL) => {
            // An entry removed between listing and lookup is simply skipped.
            for (key, per_cpu) in map.iter().filter_map(Result::ok) {
                into.push(key, &per_cpu);
            }
            Ok(())
        }
        Err(err) => Err(anyhow::Error::new(err).context("reading a map")),
    }
}

/// Every entry of a per-CPU hash map, copied out (see [`read_all_into`]).
fn read_all<K: aya::Pod + Copy + Default, V: aya::Pod + Copy + Default>(
    map: &PerCpuHashMap<MapData, K, V>,
    cpus: usize,
) -> anyhow::Result<Vec<(K, Vec<V>)>> {
    let mut entries = batch::PerCpuEntries::new(cpus);
    read_all_into(map, &mut entries)?;
    Ok(entries.to_vec())
}
