//! The `snapshot --json` document: what each worker did in one window.

use std::collections::BTreeMap;

use probe_common::{drops::DROP_NAMES, wait::WAIT_NAMES};
use serde::Serialize;

use crate::{
    model::{
        FamilyTotals, Interval, Measured, MemoryReading, WorkerStats,
        endpoints::{EndpointFigures, EndpointNamer, figures},
        families_with_calls,
        identity::WorkerKind,
    },
    node::NodeFacts,
};

pub use crate::model::SCHEMA_VERSION;

/// One snapshot window.
#[derive(Debug, Serialize)]
pub struct SnapshotDocument {
    /// Version of this layout.
    pub schema_version: u32,
    /// The window the numbers cover.
    pub window: Window,
    /// The node the workers ran on.
    pub node: NodeFacts,
    /// What was measured: a `false` here is null in every worker, never zero.
    pub measured: Measured,
    /// The tree level `--depth` folded the workers to (a number, or `"pods"`): each worker at
    /// it covers its subtree (`scope: "subtree"`); null when every worker is its own threads.
    pub depth: Option<crate::model::tree::Level>,
    /// Workers active in the window, busiest first.
    pub workers: Vec<WorkerDocument>,
    /// Failed map inserts (lost events) per map: in the window and since load.
    pub drops: BTreeMap<&'static str, DropCount>,
}

/// The time window of a document.
#[derive(Debug, Serialize)]
pub struct Window {
    /// CLOCK_MONOTONIC ns at the start.
    pub start_monotonic_ns: u64,
    /// CLOCK_MONOTONIC ns at the end.
    pub end_monotonic_ns: u64,
    /// Start, RFC 3339.
    pub start: String,
    /// End, RFC 3339.
    pub end: String,
    /// Length in seconds.
    pub duration_seconds: f64,
}

/// A drop counter.
#[derive(Debug, Serialize)]
pub struct DropCount {
    /// In the window.
    pub window: u64,
    /// Since the programs were loaded.
    pub total: u64,
}

/// One worker in a window.
#[derive(Debug, Serialize)]
pub struct WorkerDocument {
    /// cgroup v2 id (inode of its directory).
    pub cgroup_id: u64,
    /// Path under the cgroup2 mount; null when the cgroup is gone.
    pub path: Option<String>,
    /// Short name read from the path (container id, unit, …).
    pub name: Option<String>,
    /// Kind of worker (docker, kubernetes, systemd_service, exec, cgroup, root).
    pub kind: Option<WorkerKind>,
    /// Ids read from the path (container_id, pod_uid, unit, …).
    pub ids: BTreeMap<String, String>,
    /// What the figures cover: `self`, the cgroup's own threads, or `subtree`, itself and
    /// every cgroup below it (folded by `--depth`).
    pub scope: &'static str,
    /// CPU use.
    pub cpu: CpuDocument,
    /// Where the threads' time went; null when not measured (see `measured`).
    pub time: Option<TimeDocument>,
    /// Socket traffic; null when not measured.
    pub net: Option<NetDocument>,
    /// Per remote endpoint, busiest first; null when not measured.
    pub endpoints: Option<Vec<EndpointFigures>>,
    /// Memory at the end of the window (`current_bytes`, `peak_bytes`, `source`), as a
    /// recording's tick line has it; null when no source had it.
    pub memory: Option<MemoryReading>,
}

/// CPU use of a worker in a window.
#[derive(Debug, Serialize)]
pub struct CpuDocument {
    /// On-CPU seconds, all CPUs (sched_switch accounting).
    pub seconds: f64,
    /// Average CPUs busy (seconds / window).
    pub cores: f64,
    /// On-CPU seconds per CPU, indexed by CPU number; sums to `seconds`.
    pub per_cpu_seconds: Vec<f64>,
    /// User-mode seconds from the cgroup's cpu.stat (null if not read).
    pub user_seconds: Option<f64>,
    /// Kernel-mode seconds from the cgroup's cpu.stat (null if not read).
    pub system_seconds: Option<f64>,
    /// Switches where a thread gave up the CPU (blocked or slept); null when not measured.
    pub voluntary_switches: Option<u64>,
    /// Switches where a thread was preempted while runnable; null when not measured.
    pub involuntary_switches: Option<u64>,
}

/// Where a worker's thread time went in a window. Shares are of the window's length per
/// thread-second: several threads can add up to more than 1. A delay counts when it ends.
#[derive(Debug, Serialize)]
pub struct TimeDocument {
    /// Running on a CPU.
    pub on_cpu_seconds: f64,
    /// Runnable, waiting for a CPU.
    pub runqueue_wait_seconds: f64,
    /// Uninterruptible sleep (D state: disk, some network file systems).
    pub blocked_io_seconds: f64,
    /// Interruptible sleep (S state: sockets, locks, timers).
    pub sleep_seconds: f64,
    /// on_cpu_seconds / window.
    pub on_cpu_share: f64,
    /// runqueue_wait_seconds / window.
    pub runqueue_wait_share: f64,
    /// blocked_io_seconds / window.
    pub blocked_io_share: f64,
    /// sleep_seconds / window.
    pub sleep_share: f64,
    /// Wakeups from either sleep.
    pub wakeups: u64,
    /// Run-queue waits that ended in the window.
    pub runqueue_waits: u64,
    /// Median run-queue wait (upper edge of its log2 bucket); null without waits.
    pub runqueue_wait_p50_seconds: Option<f64>,
    /// 90th percentile run-queue wait.
    pub runqueue_wait_p90_seconds: Option<f64>,
    /// 99th percentile run-queue wait.
    pub runqueue_wait_p99_seconds: Option<f64>,
    /// Blocked-I/O plus sleep by what the threads waited on (reasons with time only):
    /// seconds, sleeps and share of the window; null without `--programs waits`.
    pub waits: Option<BTreeMap<&'static str, WaitDocument>>,
}

/// Time waited for one reason in a window.
#[derive(Debug, Serialize)]
pub struct WaitDocument {
    /// Thread-seconds.
    pub seconds: f64,
    /// Sleeps that ended in the window.
    pub count: u64,
    /// seconds / window.
    pub share: f64,
}

impl TimeDocument {
    /// The breakdown of one worker's stats.
    pub fn from_stats(worker: &WorkerStats, waits_measured: bool) -> Self {
        let delays = &worker.delays;
        let quantile = |q: f64| delays.runqueue_wait_quantile_ns(q).map(seconds);
        Self {
            on_cpu_seconds: seconds(worker.cpu_ns()),
            runqueue_wait_seconds: seconds(delays.runqueue_wait_ns),
            blocked_io_seconds: seconds(delays.blocked_io_ns),
            sleep_seconds: seconds(delays.sleep_ns),
            on_cpu_share: worker.share_of_interval(worker.cpu_ns()),
            runqueue_wait_share: worker.share_of_interval(delays.runqueue_wait_ns),
            blocked_io_share: worker.share_of_interval(delays.blocked_io_ns),
            sleep_share: worker.share_of_interval(delays.sleep_ns),
            wakeups: delays.wakeups,
            runqueue_waits: delays.runqueue_waits(),
            runqueue_wait_p50_seconds: quantile(0.5),
            runqueue_wait_p90_seconds: quantile(0.9),
            runqueue_wait_p99_seconds: quantile(0.99),
            waits: waits_measured.then(|| {
                WAIT_NAMES
                    .iter()
                    .zip(delays.wait_ns.iter().zip(&delays.waits))
                    .filter(|(_, (ns, count))| **ns > 0 || **count > 0)
                    .map(|(name, (&ns, &count))| {
                        (
                            *name,
                            WaitDocument {
                                seconds: seconds(ns),
                                count,
                                share: worker.share_of_interval(ns),
                            },
                        )
                    })
                    .collect()
            }),
        }
    }
}

/// Socket traffic of a worker in a window.
#[derive(Debug, Serialize)]
pub struct NetDocument {
    /// Payload bytes sent, all families.
    pub sent_bytes: u64,
    /// Payload bytes received, all families.
    pub received_bytes: u64,
    /// Successful send calls.
    pub sent_calls: u64,
    /// Successful receive calls (MSG_PEEK excluded).
    pub received_calls: u64,
    /// Send rate.
    pub sent_bytes_per_second: f64,
    /// Receive rate.
    pub received_bytes_per_second: f64,
    /// The same per family: ipv4, ipv6, unix, other (families with no traffic are omitted).
    pub families: BTreeMap<&'static str, FamilyTotals>,
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

impl WorkerDocument {
    /// The document of one worker's stats, with null for what `measured` lacks.
    pub fn from_stats(worker: &WorkerStats, measured: Measured, namer: &EndpointNamer) -> Self {
        let families = families_with_calls(&worker.net).collect();
        let identity = worker.named();
        Self {
            cgroup_id: worker.cgroup_id,
            path: worker.path.as_deref().map(str::to_owned),
            name: identity.as_ref().map(|identity| identity.name.clone()),
            kind: identity.as_ref().map(|identity| identity.kind),
            ids: identity.map(|identity| identity.ids).unwrap_or_default(),
            scope: if worker.subtree { "subtree" } else { "self" },
            cpu: CpuDocument {
                seconds: seconds(worker.cpu_ns()),
                cores: worker.cpu_cores(),
                per_cpu_seconds: worker
                    .cpu_ns_per_cpu
                    .iter()
                    .map(|&ns| seconds(ns))
                    .collect(),
                user_seconds: worker.cpu_user_ns.map(seconds),
                system_seconds: worker.cpu_system_ns.map(seconds),
                voluntary_switches: measured.switches.then_some(worker.voluntary_switches),
                involuntary_switches: measured.switches.then_some(worker.involuntary_switches),
            },
            time: measured
                .delays
                .then(|| TimeDocument::from_stats(worker, measured.waits)),
            net: measured.net.then(|| NetDocument {
                sent_bytes: worker.sent_bytes(),
                received_bytes: worker.received_bytes(),
                sent_calls: worker.sent_calls(),
                received_calls: worker.received_calls(),
                sent_bytes_per_second: worker.sent_bytes_per_second(),
                received_bytes_per_second: worker.received_bytes_per_second(),
                families,
            }),
            endpoints: figures(namer, &worker.endpoints, measured),
            memory: worker.memory,
        }
    }
}

impl SnapshotDocument {
    /// The document of one interval: active workers, busiest first.
    pub fn new(interval: &Interval, node: NodeFacts, namer: &EndpointNamer) -> Self {
        let mut active: Vec<&WorkerStats> = interval.active_workers().collect();
        active.sort_by(|a, b| {
            b.cpu_ns()
                .cmp(&a.cpu_ns())
                .then(a.cgroup_id.cmp(&b.cgroup_id))
        });
        let start = interval.start.unwrap_or_else(|| {
            interval.end.unwrap_or(crate::clock::Timestamp {
                monotonic_ns: 0,
                wall_unix_ns: 0,
            })
        });
        let end = interval.end.unwrap_or(start);
        let drops = DROP_NAMES
            .iter()
            .enumerate()
            .map(|(slot, &name)| {
                (
                    name,
                    DropCount {
                        window: interval.drops.get(slot).copied().unwrap_or(0),
                        total: interval.total_drops.get(slot).copied().unwrap_or(0),
                    },
                )
            })
            .collect();
        Self {
            schema_version: SCHEMA_VERSION,
            window: Window {
                start_monotonic_ns: start.monotonic_ns,
                end_monotonic_ns: end.monotonic_ns,
                start: start.rfc3339(),
                end: end.rfc3339(),
                duration_seconds: seconds(interval.duration_ns()),
            },
            node,
            measured: interval.measured,
            depth: interval.level,
            workers: active
                .into_iter()
                .map(|worker| WorkerDocument::from_stats(worker, interval.measured, namer))
                .collect(),
            drops,
        }
    }
}
