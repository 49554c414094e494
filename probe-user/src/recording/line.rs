//! The lines of a recording: their serde types, how a tick line is built from the model, and
//! how it is turned back into the two cumulative samples whose difference is that tick.
//!
//! Each tick line carries both the interval's deltas (in seconds and bytes, for readers that
//! plot) and the worker's raw cumulative counters (integers, exact). The deltas are what
//! `model::diff` gave; the counters are the sample it was taken from. A reader rebuilds the
//! sample before the tick as "counters minus deltas", so every tick stands on its own: a
//! missing or corrupt tick before it changes nothing, and the totals stay the live ones.

use std::collections::BTreeMap;

use probe_common::{
    cpu::CpuStats,
    drops::DROP_NAMES,
    net::{FAMILY_COUNT, FAMILY_NAMES, FamilyCounters},
    wait::WAIT_NAMES,
};
use serde::{Deserialize, Serialize};

use crate::{
    clock::{Timestamp, rfc3339_from_unix_ns},
    model::{
        CpuStatUsec, Drops, Measured, MemoryReading, WorkerCounters, WorkerStats,
        endpoints::EndpointFigures,
        identity::{Identity, WorkerKind, identify},
        summary::ExitSummary,
    },
    node::NodeFacts,
};

/// Names the layout in every header, so a reader tells a recording from other JSON Lines.
pub const FORMAT: &str = "workerprobe-recording";

/// Version of the recording's layout, the one every workerprobe JSON output shares; bumped
/// when a field changes meaning or goes away (adding a field does not bump it).
pub use crate::model::SCHEMA_VERSION;

/// A moment on both clocks, as a recording writes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Moment {
    /// CLOCK_MONOTONIC ns: one clock for every worker on the node (resets at boot).
    pub monotonic_ns: u64,
    /// Wall time, ns since the Unix epoch.
    pub wall_unix_ns: u64,
    /// The same wall time, RFC 3339 in UTC.
    pub time: String,
}

impl From<Timestamp> for Moment {
    fn from(at: Timestamp) -> Self {
        Self {
            monotonic_ns: at.monotonic_ns,
            wall_unix_ns: at.wall_unix_ns,
            time: rfc3339_from_unix_ns(at.wall_unix_ns),
        }
    }
}

impl Moment {
    /// The moment as the model's timestamp.
    pub fn timestamp(&self) -> Timestamp {
        Timestamp {
            monotonic_ns: self.monotonic_ns,
            wall_unix_ns: self.wall_unix_ns,
        }
    }
}

/// One line of a recording, told apart by its `"type"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Line {
    /// The first line of every file and of every run appended to it.
    Header(Box<HeaderLine>),
    /// One worker active in one tick.
    Tick(Box<TickLine>),
    /// One worker that ended.
    Exit(Box<ExitLine>),
    /// The wall clock's quality, as the kernel saw it then.
    Clock(Box<ClockLine>),
    /// A type this reader does not know (a newer writer's); only ever read, never written.
    #[serde(other)]
    Unknown,
}

/// How good the node's wall clock was at a moment: written every
/// [`CLOCK_EVERY_SECONDS`] and whenever it gains or loses synchronisation, so a reader of
/// several nodes' recordings knows how far apart their timestamps may be.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClockLine {
    /// Version of the layout.
    pub schema_version: u32,
    /// When it was read.
    pub at: Moment,
    /// What adjtimex said.
    pub clock: crate::clock::ClockQuality,
    /// The node it is of, in a merged recording (`workerprobe merge`); absent in one
    /// node's own recording, whose lines are all of its header's node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// How often a recording notes its clock's quality.
pub const CLOCK_EVERY_SECONDS: u64 = 60;

/// The header: what made the recording, on which node, how.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeaderLine {
    /// Version of the layout.
    pub schema_version: u32,
    /// Always [`FORMAT`].
    pub format: String,
    /// Version of the workerprobe that wrote it.
    pub agent_version: String,
    /// The node the workers ran on.
    pub node: NodeFacts,
    /// When this file was begun (at the start of the run, or at a rotation).
    pub started: Moment,
    /// When the run (one `workerprobe record`) began; counters are cumulative since then.
    pub run_started: Moment,
    /// 0 for a run's first file; one more at each rotation.
    pub part: u32,
    /// The tick length asked for (`--interval`), seconds.
    pub interval_seconds: f64,
    /// The `--workers` patterns (empty: every worker).
    pub worker_patterns: Vec<String>,
    /// The `--programs` loaded (cpu, delays, net, workers).
    pub programs: Vec<String>,
    /// What this kernel let those programs measure: where a field is `false`, the ticks'
    /// figures for it read zero but are not measured. Absent in older recordings: everything.
    #[serde(default)]
    pub measured: Measured,
}

impl HeaderLine {
    /// Where `monotonic_ns` of this run falls on a timeline shared with other nodes: through
    /// the run's offset from its monotonic clock to its wall clock at its start (so a wall
    /// clock stepped mid-run moves none of the run's moments), ns on the wall clock's scale.
    pub fn timeline_ns(&self, monotonic_ns: u64) -> i128 {
        let run = &self.run_started;
        i128::from(monotonic_ns) + i128::from(run.wall_unix_ns) - i128::from(run.monotonic_ns)
    }
}

/// One worker's tick: what it did in the interval, and its counters since the run began.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TickLine {
    /// Version of the layout.
    pub schema_version: u32,
    /// Tick number in the run, from 1; every line of one tick has the same.
    pub tick: u64,
    /// Start of the interval (the previous sample).
    pub start: Moment,
    /// End of the interval (this sample).
    pub end: Moment,
    /// end − start, seconds.
    pub interval_seconds: f64,
    /// cgroup v2 id.
    pub cgroup_id: u64,
    /// Path under the cgroup2 mount; null if the cgroup was gone before it was ever named.
    pub path: Option<String>,
    /// Short name read from the path.
    pub name: Option<String>,
    /// Kind of worker (docker, kubernetes, systemd_service, exec, cgroup, root, …).
    pub kind: Option<WorkerKind>,
    /// Ids read from the path (container_id, pod_uid, unit, …); omitted when none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ids: BTreeMap<String, String>,
    /// CPU use in the interval.
    pub cpu: TickCpu,
    /// Where the threads' time went in the interval.
    pub time: TickTime,
    /// Socket payload in the interval.
    pub net: TickNet,
    /// Per remote endpoint in the interval, busiest first (named as the recorder's
    /// `--endpoint` rules named them); omitted when endpoints were not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Vec<EndpointFigures>>,
    /// Memory at the end of the interval; null when no source had it.
    pub memory: Option<MemoryReading>,
    /// Cumulative counters since the run began (raw, exact): replay's source of truth.
    pub totals: Totals,
    /// Events lost because a kernel map was full, per map, in the interval (node-wide).
    pub drops: BTreeMap<String, u64>,
    /// The same since the run began.
    pub drops_total: BTreeMap<String, u64>,
    /// The node it is of, in a merged recording (`workerprobe merge`); absent in one
    /// node's own recording, whose lines are all of its header's node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// CPU use of a worker in one interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TickCpu {
    /// On-CPU seconds, all CPUs.
    pub seconds: f64,
    /// On-CPU seconds per CPU, indexed by CPU number; sums to `seconds`.
    pub per_cpu_seconds: Vec<f64>,
    /// User-mode part of `seconds` (the kernel's tick-sampled split scaled to it, so user +
    /// system = seconds); null when not measured.
    pub user_seconds: Option<f64>,
    /// Kernel-mode part of `seconds`.
    pub system_seconds: Option<f64>,
    /// The tick-sampled user time behind the split, ns (raw, for replay).
    #[serde(default)]
    pub user_tick_ns: u64,
    /// The tick-sampled system time behind the split, ns.
    #[serde(default)]
    pub system_tick_ns: u64,
    /// Switches where a thread gave the CPU up.
    pub voluntary_switches: u64,
    /// Switches where a thread was preempted.
    pub involuntary_switches: u64,
}

/// Where a worker's thread time went in one interval (thread-seconds; a delay counts in the
/// interval it ends in).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TickTime {
    /// Running on a CPU.
    pub on_cpu_seconds: f64,
    /// Runnable, waiting for a CPU.
    pub runqueue_wait_seconds: f64,
    /// Uninterruptible sleep (D state).
    pub blocked_io_seconds: f64,
    /// Interruptible sleep (S state).
    pub sleep_seconds: f64,
    /// Wakeups from either sleep.
    pub wakeups: u64,
    /// Run-queue waits that ended.
    pub runqueue_waits: u64,
    /// Those waits by length: bucket 0 under 1 µs, bucket b in [2^(b-1), 2^b) µs; trailing
    /// empty buckets omitted.
    #[serde(default)]
    pub runqueue_wait_hist: Vec<u64>,
    /// Blocked-I/O plus sleep by what the threads waited on (network, disk, lock, timer,
    /// child, pipe, poll, other); reasons without sleeps omitted.
    #[serde(default)]
    pub waits: BTreeMap<String, WaitLine>,
}

/// Sleeps of one wait reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WaitLine {
    /// Thread-seconds.
    pub seconds: f64,
    /// Sleeps.
    pub count: u64,
}

/// Socket payload of a worker in one interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TickNet {
    /// Bytes sent, all families.
    pub sent_bytes: u64,
    /// Bytes received, all families.
    pub received_bytes: u64,
    /// Successful send calls.
    pub sent_calls: u64,
    /// Successful, non-peeking receive calls.
    pub received_calls: u64,
    /// The same per family (ipv4, ipv6, unix, other); families without calls omitted.
    #[serde(default)]
    pub families: BTreeMap<String, FamilyLine>,
}

/// Socket payload of one family, as every JSON output writes it.
pub type FamilyLine = crate::model::FamilyTotals;

/// A worker's cumulative counters since the run began, as integers so nothing is rounded.
/// Per-CPU detail is kept for on-CPU time only; the rest is summed over CPUs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// On-CPU ns, all CPUs.
    pub on_cpu_ns: u64,
    /// On-CPU ns per CPU, indexed by CPU number.
    pub on_cpu_ns_per_cpu: Vec<u64>,
    /// Voluntary context switches.
    pub voluntary_switches: u64,
    /// Involuntary context switches.
    pub involuntary_switches: u64,
    /// Run-queue wait ns.
    pub runqueue_wait_ns: u64,
    /// Uninterruptible sleep ns.
    pub blocked_io_ns: u64,
    /// Interruptible sleep ns.
    pub sleep_ns: u64,
    /// Wakeups.
    pub wakeups: u64,
    /// Run-queue waits by length, as in [`TickTime::runqueue_wait_hist`].
    #[serde(default)]
    pub runqueue_wait_hist: Vec<u64>,
    /// Blocked-I/O plus sleep ns by wait reason; reasons without sleeps omitted.
    #[serde(default)]
    pub wait_ns: BTreeMap<String, u64>,
    /// Sleeps by wait reason.
    #[serde(default)]
    pub waits: BTreeMap<String, u64>,
    /// Tick-sampled user time, ns (the split of `on_cpu_ns`).
    #[serde(default)]
    pub user_tick_ns: u64,
    /// Tick-sampled system time, ns.
    #[serde(default)]
    pub system_tick_ns: u64,
    /// Bytes sent, all families.
    pub sent_bytes: u64,
    /// Bytes received, all families.
    pub received_bytes: u64,
    /// Per family; families without calls omitted.
    #[serde(default)]
    pub families: BTreeMap<String, FamilyLine>,
    /// The cgroup's `cpu.stat` (µs, includes child cgroups, since the cgroup was made); null
    /// when not read.
    pub cpu_stat: Option<CpuStatUsec>,
}

/// A worker that ended: its exit summary (see `model::summary::ExitSummary`) with the
/// schema version. The reader keeps the identifying fields typed and the rest as JSON.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExitLine {
    /// Version of the layout.
    pub schema_version: u32,
    /// cgroup v2 id.
    pub cgroup_id: u64,
    /// Path under the cgroup2 mount.
    pub path: String,
    /// The node it is of, in a merged recording (`workerprobe merge`); absent in one
    /// node's own recording, whose lines are all of its header's node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Every other field of the exit summary.
    #[serde(flatten)]
    pub summary: serde_json::Map<String, serde_json::Value>,
}

impl ExitLine {
    /// The worker's name, as the summary gave it.
    pub fn name(&self) -> Option<&str> {
        self.summary.get("name").and_then(|name| name.as_str())
    }

    /// The worker's ids, as the summary gave them.
    pub fn ids(&self) -> BTreeMap<String, String> {
        self.summary
            .get("ids")
            .and_then(|ids| ids.as_object())
            .map(|ids| {
                ids.iter()
                    .filter_map(|(key, value)| Some((key.clone(), value.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// What the writer serializes for an exit: the summary as `watch --json` prints it, plus
/// the schema version.
#[derive(Serialize)]
pub struct ExitOut<'a> {
    /// Version of the layout.
    pub schema_version: u32,
    /// The summary (it carries `"type": "exit"`).
    #[serde(flatten)]
    pub summary: &'a ExitSummary,
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Back from seconds to ns. Exact for anything the writer wrote below about a day: an f64
/// holds 53 bits, and serde_json writes the shortest text that reads back to the same f64.
fn ns_of(seconds: f64) -> u64 {
    if seconds.is_finite() && seconds > 0.0 {
        (seconds * 1e9).round() as u64
    } else {
        0
    }
}

/// A histogram without its trailing empty buckets.
fn trimmed(hist: &[u64]) -> Vec<u64> {
    let used = hist
        .iter()
        .rposition(|&count| count > 0)
        .map_or(0, |i| i + 1);
    hist[..used].to_vec()
}

fn families_of(counters: &[FamilyCounters; FAMILY_COUNT]) -> BTreeMap<String, FamilyLine> {
    crate::model::families_with_calls(counters)
        .map(|(name, family)| (name.to_string(), family))
        .collect()
}

fn drops_by_name(by_map: &[u64]) -> BTreeMap<String, u64> {
    DROP_NAMES
        .iter()
        .enumerate()
        .map(|(slot, name)| (name.to_string(), by_map.get(slot).copied().unwrap_or(0)))
        .collect()
}

/// What the writer knows of a tick besides the worker: its number, bounds and drops.
#[derive(Clone, Debug)]
pub struct TickContext {
    /// Tick number in the run, from 1.
    pub tick: u64,
    /// Start of the interval.
    pub start: Timestamp,
    /// End of the interval.
    pub end: Timestamp,
    /// Drops in the interval per map (`DROP_NAMES` order).
    pub drops: Vec<u64>,
    /// Drops since the run began per map.
    pub drops_total: Vec<u64>,
}

impl TickLine {
    /// The line of one worker: `stats` is its interval from `model::diff`, `counters` the
    /// cumulative sample that interval ends with, `path` its path when the sample no longer
    /// knows it (the cgroup is gone), `identity` who the registry knows it as then,
    /// `memory` its latest reading.
    pub fn new(
        context: &TickContext,
        stats: &WorkerStats,
        counters: &WorkerCounters,
        path: Option<String>,
        identity: Option<&Identity>,
        memory: Option<MemoryReading>,
        endpoints: Option<Vec<EndpointFigures>>,
    ) -> Self {
        let identity = stats
            .identity
            .as_deref()
            .or(identity)
            .cloned()
            .or_else(|| path.as_deref().map(identify));
        let delays = &stats.delays;
        let sched = &counters.sched;
        let mut totals = Totals {
            on_cpu_ns_per_cpu: counters.on_cpu_ns_per_cpu.clone(),
            on_cpu_ns: counters.on_cpu_ns(),
            voluntary_switches: sched.voluntary_switches,
            involuntary_switches: sched.involuntary_switches,
            runqueue_wait_ns: sched.runqueue_wait_ns,
            blocked_io_ns: sched.blocked_io_ns,
            sleep_ns: sched.sleep_ns,
            wakeups: sched.wakeups,
            user_tick_ns: sched.user_tick_ns,
            system_tick_ns: sched.system_tick_ns,
            runqueue_wait_hist: trimmed(&sched.runqueue_wait_hist),
            ..Totals::default()
        };
        for (reason, name) in WAIT_NAMES.iter().enumerate() {
            if sched.waits[reason] > 0 || sched.wait_ns[reason] > 0 {
                totals
                    .wait_ns
                    .insert(name.to_string(), sched.wait_ns[reason]);
                totals.waits.insert(name.to_string(), sched.waits[reason]);
            }
        }
        totals.sent_bytes = counters.net.families.iter().map(|f| f.sent_bytes).sum();
        totals.received_bytes = counters.net.families.iter().map(|f| f.received_bytes).sum();
        totals.families = families_of(&counters.net.families);
        totals.cpu_stat = counters.cpu_stat;
        Self {
            schema_version: SCHEMA_VERSION,
            tick: context.tick,
            start: context.start.into(),
            end: context.end.into(),
            interval_seconds: seconds(
                context
                    .end
                    .monotonic_ns
                    .saturating_sub(context.start.monotonic_ns),
            ),
            cgroup_id: stats.cgroup_id,
            name: identity.as_ref().map(|identity| identity.name.clone()),
            kind: identity.as_ref().map(|identity| identity.kind),
            ids: identity.map(|identity| identity.ids).unwrap_or_default(),
            path,
            cpu: TickCpu {
                seconds: seconds(stats.cpu_ns()),
                per_cpu_seconds: stats.cpu_ns_per_cpu.iter().map(|&ns| seconds(ns)).collect(),
                user_seconds: stats.cpu_user_ns.map(seconds),
                system_seconds: stats.cpu_system_ns.map(seconds),
                user_tick_ns: stats.user_tick_ns,
                system_tick_ns: stats.system_tick_ns,
                voluntary_switches: stats.voluntary_switches,
                involuntary_switches: stats.involuntary_switches,
            },
            time: TickTime {
                on_cpu_seconds: seconds(stats.cpu_ns()),
                runqueue_wait_seconds: seconds(delays.runqueue_wait_ns),
                blocked_io_seconds: seconds(delays.blocked_io_ns),
                sleep_seconds: seconds(delays.sleep_ns),
                wakeups: delays.wakeups,
                runqueue_waits: delays.runqueue_waits(),
                runqueue_wait_hist: trimmed(&delays.runqueue_wait_hist),
                waits: WAIT_NAMES
                    .iter()
                    .enumerate()
                    .filter(|(reason, _)| delays.waits[*reason] > 0 || delays.wait_ns[*reason] > 0)
                    .map(|(reason, name)| {
                        (
                            name.to_string(),
                            WaitLine {
                                seconds: seconds(delays.wait_ns[reason]),
                                count: delays.waits[reason],
                            },
                        )
                    })
                    .collect(),
            },
            net: TickNet {
                sent_bytes: stats.sent_bytes(),
                received_bytes: stats.received_bytes(),
                sent_calls: stats.sent_calls(),
                received_calls: stats.received_calls(),
                families: families_of(&stats.net),
            },
            endpoints,
            memory,
            totals,
            drops: drops_by_name(&context.drops),
            drops_total: drops_by_name(&context.drops_total),
            node: None,
        }
    }

    /// The worker's cumulative counters at the end of the tick.
    pub fn counters_after(&self) -> WorkerCounters {
        let totals = &self.totals;
        // Only on-CPU time is kept per CPU, as in the model.
        let wait = |by_name: &BTreeMap<String, u64>, reason: usize| {
            by_name.get(WAIT_NAMES[reason]).copied().unwrap_or(0)
        };
        let sched = CpuStats {
            on_cpu_ns: 0,
            voluntary_switches: totals.voluntary_switches,
            involuntary_switches: totals.involuntary_switches,
            runqueue_wait_ns: totals.runqueue_wait_ns,
            blocked_io_ns: totals.blocked_io_ns,
            sleep_ns: totals.sleep_ns,
            wakeups: totals.wakeups,
            runqueue_wait_hist: std::array::from_fn(|bucket| {
                totals.runqueue_wait_hist.get(bucket).copied().unwrap_or(0)
            }),
            wait_ns: std::array::from_fn(|reason| wait(&totals.wait_ns, reason)),
            waits: std::array::from_fn(|reason| wait(&totals.waits, reason)),
            user_tick_ns: totals.user_tick_ns,
            system_tick_ns: totals.system_tick_ns,
        };
        let mut counters = WorkerCounters {
            path: self.path.as_deref().map(Into::into),
            on_cpu_ns_per_cpu: totals.on_cpu_ns_per_cpu.clone(),
            sched: Box::new(sched),
            cpu_stat: totals.cpu_stat,
            ..WorkerCounters::default()
        };
        for (name, family) in &totals.families {
            if let Some(slot) = family_slot(name) {
                counters.net.families[slot] = FamilyCounters {
                    sent_bytes: family.sent_bytes,
                    sent_calls: family.sent_calls,
                    received_bytes: family.received_bytes,
                    received_calls: family.received_calls,
                };
            }
        }
        counters
    }

    /// The worker's cumulative counters at the start of the tick: the counters at its end
    /// minus the tick's deltas (never below zero, whatever a damaged line says).
    pub fn counters_before(&self) -> WorkerCounters {
        let mut counters = self.counters_after();
        for (cpu, &delta_seconds) in self.cpu.per_cpu_seconds.iter().enumerate() {
            if let Some(on_cpu_ns) = counters.on_cpu_ns_per_cpu.get_mut(cpu) {
                *on_cpu_ns = on_cpu_ns.saturating_sub(ns_of(delta_seconds));
            }
        }
        let time = &self.time;
        let first = &mut counters.sched;
        first.voluntary_switches = first
            .voluntary_switches
            .saturating_sub(self.cpu.voluntary_switches);
        first.involuntary_switches = first
            .involuntary_switches
            .saturating_sub(self.cpu.involuntary_switches);
        first.runqueue_wait_ns = first
            .runqueue_wait_ns
            .saturating_sub(ns_of(time.runqueue_wait_seconds));
        first.blocked_io_ns = first
            .blocked_io_ns
            .saturating_sub(ns_of(time.blocked_io_seconds));
        first.sleep_ns = first.sleep_ns.saturating_sub(ns_of(time.sleep_seconds));
        first.wakeups = first.wakeups.saturating_sub(time.wakeups);
        first.user_tick_ns = first.user_tick_ns.saturating_sub(self.cpu.user_tick_ns);
        first.system_tick_ns = first.system_tick_ns.saturating_sub(self.cpu.system_tick_ns);
        for (slot, &count) in first
            .runqueue_wait_hist
            .iter_mut()
            .zip(&time.runqueue_wait_hist)
        {
            *slot = slot.saturating_sub(count);
        }
        for (reason, name) in WAIT_NAMES.iter().enumerate() {
            if let Some(wait) = time.waits.get(*name) {
                first.wait_ns[reason] = first.wait_ns[reason].saturating_sub(ns_of(wait.seconds));
                first.waits[reason] = first.waits[reason].saturating_sub(wait.count);
            }
        }
        for (name, delta) in &self.net.families {
            if let Some(slot) = family_slot(name) {
                let family = &mut counters.net.families[slot];
                family.sent_bytes = family.sent_bytes.saturating_sub(delta.sent_bytes);
                family.sent_calls = family.sent_calls.saturating_sub(delta.sent_calls);
                family.received_bytes = family.received_bytes.saturating_sub(delta.received_bytes);
                family.received_calls = family.received_calls.saturating_sub(delta.received_calls);
            }
        }
        // The model reads user/system from cpu.stat only when both ends have it.
        counters.cpu_stat = match (
            counters.cpu_stat,
            self.cpu.user_seconds,
            self.cpu.system_seconds,
        ) {
            (Some(stat), Some(user), Some(system)) => {
                let user_usec = ns_of(user) / 1_000;
                let system_usec = ns_of(system) / 1_000;
                Some(CpuStatUsec {
                    usage_usec: stat.usage_usec.saturating_sub(user_usec + system_usec),
                    user_usec: stat.user_usec.saturating_sub(user_usec),
                    system_usec: stat.system_usec.saturating_sub(system_usec),
                })
            }
            _ => None,
        };
        counters
    }

    /// Drops since the run began at the end of the tick, in `DROP_NAMES` order.
    pub fn drops_after(&self) -> Drops {
        Drops {
            by_map: DROP_NAMES
                .iter()
                .map(|name| self.drops_total.get(*name).copied().unwrap_or(0))
                .collect(),
        }
    }

    /// The same at the start of the tick.
    pub fn drops_before(&self) -> Drops {
        Drops {
            by_map: DROP_NAMES
                .iter()
                .map(|name| {
                    let total = self.drops_total.get(*name).copied().unwrap_or(0);
                    total.saturating_sub(self.drops.get(*name).copied().unwrap_or(0))
                })
                .collect(),
        }
    }
}

/// The slot of a family name; `None` for a name this version does not know.
fn family_slot(name: &str) -> Option<usize> {
    FAMILY_NAMES.iter().position(|known| *known == name)
}

#[cfg(test)]
mod tests {
    use probe_common::net::FAMILY_IPV4;

    use super::*;
    use crate::model::{MemorySource, Sample, diff};

    fn at(ms: u64) -> Timestamp {
        Timestamp {
            monotonic_ns: ms * 1_000_000,
            wall_unix_ns: 1_800_000_000_000_000_000 + ms * 1_000_000,
        }
    }

    /// A worker's counters with awkward (non-round) values everywhere.
    pub(crate) fn busy_counters(scale: u64) -> WorkerCounters {
        let mut hist = [0u64; probe_common::cpu::RUNQ_BUCKETS];
        hist[1] = 3 * scale;
        hist[7] = scale;
        let mut counters = WorkerCounters {
            path: Some("/system.slice/job.service".into()),
            on_cpu_ns_per_cpu: vec![123_456_789_123 * scale, 999_999_999_999 * scale],
            sched: Box::new(CpuStats {
                voluntary_switches: 17 * scale,
                involuntary_switches: 5 * scale,
                runqueue_wait_ns: 987_654_321 * scale,
                blocked_io_ns: 333_333_333 * scale,
                sleep_ns: 4_000_000_007 * scale,
                wakeups: 11 * scale,
                runqueue_wait_hist: hist,
                ..CpuStats::default()
            }),
            cpu_stat: Some(CpuStatUsec {
                usage_usec: 1_200_000 * scale,
                user_usec: 1_000_001 * scale,
                system_usec: 199_999 * scale,
            }),
            ..WorkerCounters::default()
        };
        counters.net.families[FAMILY_IPV4] = FamilyCounters {
            sent_bytes: 5_000_003 * scale,
            sent_calls: 153 * scale,
            received_bytes: 77 * scale,
            received_calls: 2 * scale,
        };
        counters
    }

    fn sample(ms: u64, counters: WorkerCounters, drops: u64) -> Sample {
        Sample {
            measured: Default::default(),
            taken_at: Some(at(ms)),
            workers: [(42, counters)].into_iter().collect(),
            drops: Drops {
                by_map: (0..DROP_NAMES.len())
                    .map(|slot| match slot {
                        0 => drops,
                        3 => 1,
                        _ => 0,
                    })
                    .collect(),
            },
        }
    }

    /// The line the writer makes for the tick from `before` to `after`.
    pub(crate) fn line_between(before: &Sample, after: &Sample, tick: u64) -> TickLine {
        let interval = diff(Some(before), after);
        let context = TickContext {
            tick,
            start: before.taken_at.expect("start"),
            end: after.taken_at.expect("end"),
            drops: interval.drops.clone(),
            drops_total: interval.total_drops.clone(),
        };
        let stats = &interval.workers[0];
        TickLine::new(
            &context,
            stats,
            &after.workers[&42],
            stats.path.as_deref().map(str::to_owned),
            None,
            Some(MemoryReading {
                current_bytes: 1 << 20,
                peak_bytes: 3 << 20,
                source: MemorySource::Cgroup2,
            }),
            None,
        )
    }

    #[test]
    fn a_tick_line_round_trips_through_json() {
        let before = sample(1_000, busy_counters(1), 2);
        let after = sample(2_000, busy_counters(3), 5);
        let line = Line::Tick(Box::new(line_between(&before, &after, 7)));
        let text = serde_json::to_string(&line).expect("serializes");
        assert!(
            text.starts_with(r#"{"type":"tick","schema_version":4,"tick":7,"#),
            "{text}"
        );
        assert!(!text.contains('\n'));
        let back: Line = serde_json::from_str(&text).expect("deserializes");
        assert_eq!(back, line);
    }

    #[test]
    fn the_rebuilt_samples_give_the_live_interval() {
        let before = sample(1_000, busy_counters(1), 2);
        let after = sample(2_000, busy_counters(3), 5);
        let live = diff(Some(&before), &after);
        let text = serde_json::to_string(&line_between(&before, &after, 1)).expect("json");
        let line: TickLine = serde_json::from_str(&text).expect("parses");
        let rebuilt_before = Sample {
            measured: Default::default(),
            taken_at: Some(line.start.timestamp()),
            workers: [(42, line.counters_before())].into_iter().collect(),
            drops: line.drops_before(),
        };
        let rebuilt_after = Sample {
            measured: Default::default(),
            taken_at: Some(line.end.timestamp()),
            workers: [(42, line.counters_after())].into_iter().collect(),
            drops: line.drops_after(),
        };
        let replayed = diff(Some(&rebuilt_before), &rebuilt_after);
        assert_eq!(replayed.start, live.start);
        assert_eq!(replayed.end, live.end);
        assert_eq!(replayed.drops, live.drops);
        assert_eq!(replayed.total_drops, live.total_drops);
        let (live, replayed) = (&live.workers[0], &replayed.workers[0]);
        // Everything the sinks read is the same, to the nanosecond and the byte.
        assert_eq!(replayed.cpu_ns_per_cpu, live.cpu_ns_per_cpu);
        assert_eq!(replayed.total_cpu_ns, live.total_cpu_ns);
        assert_eq!(replayed.total_sent_bytes, live.total_sent_bytes);
        assert_eq!(replayed.total_received_bytes, live.total_received_bytes);
        assert_eq!(replayed.net, live.net);
        assert_eq!(replayed.delays, live.delays);
        assert_eq!(replayed.voluntary_switches, live.voluntary_switches);
        assert_eq!(replayed.involuntary_switches, live.involuntary_switches);
        assert_eq!(replayed.cpu_user_ns, live.cpu_user_ns);
        assert_eq!(replayed.cpu_system_ns, live.cpu_system_ns);
        assert_eq!(replayed.interval_ns, live.interval_ns);
    }

    #[test]
    fn seconds_go_back_to_the_same_nanoseconds() {
        for ns in [0, 1, 999, 123_456_789, 999_999_999_999, 86_400_000_000_001] {
            let text = serde_json::to_string(&seconds(ns)).expect("json");
            let back: f64 = serde_json::from_str(&text).expect("parse");
            assert_eq!(ns_of(back), ns, "{text}");
        }
        assert_eq!(ns_of(f64::NAN), 0);
        assert_eq!(ns_of(-1.0), 0);
    }

    #[test]
    fn hist_drops_trailing_empty_buckets() {
        assert_eq!(trimmed(&[0, 2, 0, 1, 0, 0]), vec![0, 2, 0, 1]);
        assert!(trimmed(&[0, 0]).is_empty());
    }

    #[test]
    fn unknown_types_are_read_as_unknown() {
        let line: Line =
            serde_json::from_str(r#"{"type":"plot","schema_version":1}"#).expect("parses");
        assert_eq!(line, Line::Unknown);
    }
}

#[cfg(test)]
mod exit_tests {
    use super::*;
    use crate::model::{
        MemorySource, identity::identify, registry::WorkerRecord, summary::ExitSummary,
    };

    #[test]
    fn an_exit_line_is_the_summary_with_a_version() {
        let record = WorkerRecord {
            cgroup_id: 9,
            path: "/jobs/a".into(),
            identity: identify("/jobs/a"),
            started_at_monotonic_ns: 1_000,
            start_observed: true,
            memory: Some(MemoryReading {
                current_bytes: 10,
                peak_bytes: 20,
                source: MemorySource::Cgroup2,
            }),
            memory_peak_bytes: 20,
            cpu_stat: None,
        };
        let counters = super::tests::busy_counters(1);
        let summary = ExitSummary::new(
            &record,
            &counters,
            2_000_000_000,
            0,
            Measured::default(),
            &crate::model::endpoints::EndpointNamer::default(),
            None,
        );
        let text = serde_json::to_string(&ExitOut {
            schema_version: SCHEMA_VERSION,
            summary: &summary,
        })
        .expect("json");
        assert!(
            text.starts_with(r#"{"schema_version":4,"type":"exit","cgroup_id":9,"#),
            "{text}"
        );
        let Line::Exit(exit) = serde_json::from_str(&text).expect("parses") else {
            panic!("not read as an exit: {text}");
        };
        assert_eq!(exit.cgroup_id, 9);
        assert_eq!(exit.path, "/jobs/a");
        assert_eq!(exit.summary["name"], "a");
        assert_eq!(exit.summary["net"]["sent_bytes"], 5_000_003);
        // Written back, it is the same line.
        let again = serde_json::to_value(Line::Exit(exit)).expect("json");
        assert_eq!(
            again,
            serde_json::from_str::<serde_json::Value>(&text).expect("value")
        );
    }
}
