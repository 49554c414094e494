//! Exit summaries: one record per finished worker, with the meanings of Lithops' per-call
//! worker stats beside workerprobe's own.

use std::collections::BTreeMap;

use serde::Serialize;

use probe_common::wait::WAIT_NAMES;

use super::{
    ExitMemoryPeaks, Measured, MemoryReading, MemorySource, WorkerCounters,
    endpoints::{EndpointFigures, EndpointNamer, figures},
    identity::WorkerKind,
    registry::WorkerRecord,
    stats::{WorkerStats, totals},
};
use crate::clock::rfc3339_from_unix_ns;

/// A moment on the node's monotonic clock, with its wall time.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Moment {
    /// CLOCK_MONOTONIC ns (one clock for every worker on the node).
    pub monotonic_ns: u64,
    /// RFC 3339 wall time.
    pub time: String,
}

impl Moment {
    /// A monotonic moment; `boot_offset_ns` converts it to wall time (wall = monotonic + it).
    pub fn new(monotonic_ns: u64, boot_offset_ns: i128) -> Self {
        let wall_ns = (i128::from(monotonic_ns) + boot_offset_ns).max(0) as u64;
        Self {
            monotonic_ns,
            time: rfc3339_from_unix_ns(wall_ns),
        }
    }
}

/// What the summary adds when the agent ran the worker itself (`workerprobe exec`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ExecOutcome {
    /// The command line.
    pub command: Vec<String>,
    /// Exit code, or 128 + signal when killed (as a shell reports it).
    pub exit_code: i32,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
    /// Largest resident set of the command's processes (`ru_maxrss` of wait4).
    pub max_rss_bytes: u64,
}

/// One finished worker.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExitSummary {
    /// Always "exit", to tell these lines apart in a stream.
    #[serde(rename = "type")]
    pub record_type: &'static str,
    /// cgroup v2 id.
    pub cgroup_id: u64,
    /// Path relative to the cgroup2 mount.
    pub path: String,
    /// Short name.
    pub name: String,
    /// Kind of worker (docker, kubernetes, systemd_service, exec, cgroup, …).
    pub kind: WorkerKind,
    /// Ids read from the path (container id, pod uid, unit, …).
    pub ids: BTreeMap<String, String>,
    /// What the figures cover: `self`, the cgroup's own threads, or `subtree`, itself and
    /// the cgroups below it that `--depth` folded in.
    pub scope: &'static str,
    /// When the cgroup was made (or first seen: see `start_observed`).
    pub start: Moment,
    /// Whether `start` is when it was made; false when it existed before the agent started,
    /// and its numbers then cover only the time since.
    pub start_observed: bool,
    /// When it was removed (or the command ended).
    pub end: Moment,
    /// end − start.
    pub wall_seconds: f64,
    /// CPU use.
    pub cpu: SummaryCpu,
    /// Where the threads' time went; null when this kernel or `--programs` did not measure it.
    pub time: Option<SummaryTime>,
    /// Socket payload; null when not measured.
    pub net: Option<SummaryNet>,
    /// Per remote endpoint, busiest first; null when not measured.
    pub endpoints: Option<Vec<EndpointFigures>>,
    /// Memory, when a source had it.
    pub memory: Option<SummaryMemory>,
    /// Context switches.
    pub context_switches: Option<SummarySwitches>,
    /// The same numbers under the names and units of Lithops' worker stats.
    pub lithops: LithopsView,
    /// For `workerprobe exec`: the command and how it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecOutcome>,
}

/// CPU use over the worker's life.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SummaryCpu {
    /// On-CPU seconds, all CPUs.
    pub total_seconds: f64,
    /// User-mode seconds from cpu.stat; null when the cgroup was gone before it was read.
    pub user_seconds: Option<f64>,
    /// Kernel-mode seconds from cpu.stat; null likewise.
    pub system_seconds: Option<f64>,
    /// On-CPU seconds per CPU, indexed by CPU number; sums to `total_seconds`.
    pub per_cpu_seconds: Vec<f64>,
    /// Average CPUs busy over the wall time.
    pub cores: f64,
}

/// Time breakdown over the worker's life (thread-seconds).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SummaryTime {
    /// Running.
    pub on_cpu_seconds: f64,
    /// Runnable, waiting for a CPU.
    pub runqueue_wait_seconds: f64,
    /// Uninterruptible sleep (D).
    pub blocked_io_seconds: f64,
    /// Interruptible sleep (S).
    pub sleep_seconds: f64,
    /// Wakeups.
    pub wakeups: u64,
    /// Median run-queue wait (log2 bucket upper edge).
    pub runqueue_wait_p50_seconds: Option<f64>,
    /// 90th percentile.
    pub runqueue_wait_p90_seconds: Option<f64>,
    /// 99th percentile.
    pub runqueue_wait_p99_seconds: Option<f64>,
    /// Blocked-I/O plus sleep by what the threads waited on (network, disk, lock, timer,
    /// child, pipe, poll, other); sums to blocked_io + sleep. Null without `--programs waits`.
    pub waits: Option<BTreeMap<&'static str, SummaryWait>>,
}

/// Time waited for one reason.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SummaryWait {
    /// Thread-seconds.
    pub seconds: f64,
    /// Sleeps.
    pub count: u64,
}

/// Socket payload over the worker's life.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SummaryNet {
    /// Bytes sent.
    pub sent_bytes: u64,
    /// Bytes received.
    pub received_bytes: u64,
    /// Send calls.
    pub sent_calls: u64,
    /// Receive calls.
    pub received_calls: u64,
    /// The same four per family (ipv4, ipv6, unix, other; families without calls omitted),
    /// as a tick line and `snapshot --json` have them.
    pub families: BTreeMap<&'static str, super::FamilyTotals>,
}

/// Memory over the worker's life.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SummaryMemory {
    /// Highest use known (see `source`).
    pub peak_bytes: u64,
    /// The last reading taken while it lived; null when it ended before any sample read it.
    pub last_bytes: Option<u64>,
    /// cgroup2 (the memory cgroup's own peak), cgroup2_current or rss (sampled: a peak between
    /// samples is missed), cgroup1, or process_max_rss (the largest of its processes' own
    /// peaks, kept by the kernel).
    pub source: MemorySource,
}

impl SummaryMemory {
    /// The best peak known at a worker's end: the memory cgroup's own high-water mark where it
    /// had one (cgroup2 at removal, or a v1 memory cgroup's as last read), else what the
    /// samples saw, or the largest process peak the kernel kept when that is higher than a
    /// sampled peak (always, for a worker that ended before any sample).
    pub fn at_exit(
        sampled: Option<MemoryReading>,
        sampled_peak_bytes: u64,
        kernel: Option<ExitMemoryPeaks>,
    ) -> Option<Self> {
        let last_bytes = sampled.map(|reading| reading.current_bytes);
        let sampled_peak = sampled.map(|reading| reading.peak_bytes.max(sampled_peak_bytes));
        let kernel = kernel.unwrap_or_default();
        if let Some(cgroup_peak_bytes) = kernel.cgroup_peak_bytes {
            return Some(Self {
                peak_bytes: cgroup_peak_bytes,
                last_bytes,
                source: MemorySource::Cgroup2,
            });
        }
        let process_peak = kernel.largest_process_peak_bytes;
        match (sampled, sampled_peak) {
            (Some(reading), Some(peak_bytes))
                if !matches!(
                    reading.source,
                    MemorySource::Rss | MemorySource::Cgroup2Current
                ) || process_peak.is_none_or(|process| process <= peak_bytes) =>
            {
                Some(Self {
                    peak_bytes,
                    last_bytes,
                    source: reading.source,
                })
            }
            _ => process_peak.map(|peak_bytes| Self {
                peak_bytes,
                last_bytes,
                source: MemorySource::ProcessMaxRss,
            }),
        }
    }
}

/// Context switches over the worker's life.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SummarySwitches {
    /// Gave the CPU up (blocked, slept).
    pub voluntary: u64,
    /// Preempted while runnable.
    pub involuntary: u64,
}

/// Lithops' worker stats, same names and units (seconds, bytes, % per core).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LithopsView {
    /// % of each core used over the wall time (100 = that core all the time).
    pub worker_func_cpu_usage: Vec<f64>,
    /// User-mode CPU seconds.
    pub worker_func_cpu_user_time: Option<f64>,
    /// Kernel-mode CPU seconds.
    pub worker_func_cpu_system_time: Option<f64>,
    /// All CPU seconds.
    pub worker_func_cpu_total_time: f64,
    /// Bytes sent; null when not measured.
    pub worker_func_sent_net_io: Option<u64>,
    /// Bytes received; null when not measured.
    pub worker_func_recv_net_io: Option<u64>,
    /// Resident memory at the last reading.
    pub worker_func_rss: Option<u64>,
    /// Peak memory over the worker's life: Lithops' `worker_peak_memory_end` (its
    /// ru_maxrss when the call ends). Lithops' `_start` (the peak before the call began) has
    /// no counterpart in a cgroup's life, so it is not given.
    pub worker_peak_memory_end: Option<u64>,
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

impl ExitSummary {
    /// The summary of a worker from its record and final counters (cumulative since the
    /// programs were loaded, or since it was made if later).
    pub fn new(
        record: &WorkerRecord,
        counters: &WorkerCounters,
        end_monotonic_ns: u64,
        boot_offset_ns: i128,
        measured: Measured,
        namer: &EndpointNamer,
        exec: Option<ExecOutcome>,
    ) -> Self {
        let wall_ns = end_monotonic_ns.saturating_sub(record.started_at_monotonic_ns);
        let stats: WorkerStats = totals(record.cgroup_id, counters, wall_ns);
        let delays = &stats.delays;
        // The same threads and slices as the total: user + system = total.
        let user_seconds = measured
            .cpu
            .then(|| stats.cpu_user_ns.map(seconds))
            .flatten();
        let system_seconds = measured
            .cpu
            .then(|| stats.cpu_system_ns.map(seconds))
            .flatten();
        let per_cpu_seconds: Vec<f64> =
            stats.cpu_ns_per_cpu.iter().map(|&ns| seconds(ns)).collect();
        let memory = SummaryMemory::at_exit(
            record.memory,
            record.memory_peak_bytes,
            counters.exit_memory,
        );
        let families = super::families_with_calls(&stats.net).collect();
        let quantile = |q: f64| delays.runqueue_wait_quantile_ns(q).map(seconds);
        let peak = memory
            .as_ref()
            .map(|memory| memory.peak_bytes)
            .or(exec.as_ref().map(|exec| exec.max_rss_bytes));
        Self {
            record_type: "exit",
            cgroup_id: record.cgroup_id,
            path: record.path.clone(),
            name: record.identity.name.clone(),
            kind: record.identity.kind,
            ids: record.identity.ids.clone(),
            scope: "self",
            start: Moment::new(record.started_at_monotonic_ns, boot_offset_ns),
            start_observed: record.start_observed,
            end: Moment::new(end_monotonic_ns, boot_offset_ns),
            wall_seconds: seconds(wall_ns),
            cpu: SummaryCpu {
                total_seconds: seconds(stats.cpu_ns()),
                user_seconds,
                system_seconds,
                per_cpu_seconds: per_cpu_seconds.clone(),
                cores: stats.cpu_cores(),
            },
            time: measured.delays.then(|| SummaryTime {
                on_cpu_seconds: seconds(stats.cpu_ns()),
                runqueue_wait_seconds: seconds(delays.runqueue_wait_ns),
                blocked_io_seconds: seconds(delays.blocked_io_ns),
                sleep_seconds: seconds(delays.sleep_ns),
                wakeups: delays.wakeups,
                runqueue_wait_p50_seconds: quantile(0.5),
                runqueue_wait_p90_seconds: quantile(0.9),
                runqueue_wait_p99_seconds: quantile(0.99),
                waits: measured.waits.then(|| {
                    WAIT_NAMES
                        .iter()
                        .zip(delays.wait_ns.iter().zip(&delays.waits))
                        .filter(|(_, (ns, count))| **ns > 0 || **count > 0)
                        .map(|(name, (&ns, &count))| {
                            (
                                *name,
                                SummaryWait {
                                    seconds: seconds(ns),
                                    count,
                                },
                            )
                        })
                        .collect()
                }),
            }),
            endpoints: figures(namer, &stats.endpoints, measured),
            net: measured.net.then(|| SummaryNet {
                sent_bytes: stats.sent_bytes(),
                received_bytes: stats.received_bytes(),
                sent_calls: stats.sent_calls(),
                received_calls: stats.received_calls(),
                families,
            }),
            memory: memory.clone(),
            context_switches: measured.switches.then_some(SummarySwitches {
                voluntary: stats.voluntary_switches,
                involuntary: stats.involuntary_switches,
            }),
            lithops: LithopsView {
                worker_func_cpu_usage: stats
                    .cpu_cores_per_cpu()
                    .iter()
                    .map(|cores| cores * 100.0)
                    .collect(),
                worker_func_cpu_user_time: user_seconds,
                worker_func_cpu_system_time: system_seconds,
                worker_func_cpu_total_time: seconds(stats.cpu_ns()),
                worker_func_sent_net_io: measured.net.then(|| stats.sent_bytes()),
                worker_func_recv_net_io: measured.net.then(|| stats.received_bytes()),
                worker_func_rss: memory.as_ref().and_then(|memory| memory.last_bytes),
                worker_peak_memory_end: peak,
            },
            exec,
        }
    }
}

#[cfg(test)]
mod tests {
    use probe_common::{cpu::CpuStats, net::FAMILY_IPV4};

    use super::*;
    use crate::model::{CpuStatUsec, MemoryReading, identity::identify};

    #[test]
    fn summary_carries_totals_and_the_lithops_view() {
        let record = WorkerRecord {
            cgroup_id: 7,
            path: "/system.slice/job.service".into(),
            identity: identify("/system.slice/job.service"),
            started_at_monotonic_ns: 1_000_000_000,
            start_observed: true,
            memory: Some(MemoryReading {
                current_bytes: 100,
                peak_bytes: 300,
                source: MemorySource::Cgroup2,
            }),
            memory_peak_bytes: 300,
            cpu_stat: Some(CpuStatUsec {
                usage_usec: 1_500_000,
                user_usec: 1_000_000,
                system_usec: 500_000,
            }),
        };
        let mut counters = WorkerCounters::default();
        counters.add_cpu(
            0,
            &CpuStats {
                on_cpu_ns: 1_000_000_000,
                voluntary_switches: 3,
                // Two user ticks to one system tick: 1.0 s user, 0.5 s system.
                user_tick_ns: 8_000_000,
                system_tick_ns: 4_000_000,
                ..CpuStats::default()
            },
        );
        counters.add_cpu(
            1,
            &CpuStats {
                on_cpu_ns: 500_000_000,
                involuntary_switches: 2,
                ..CpuStats::default()
            },
        );
        counters.net.families[FAMILY_IPV4].sent_bytes = 1234;
        counters.net.families[FAMILY_IPV4].sent_calls = 2;
        let summary = ExitSummary::new(
            &record,
            &counters,
            3_000_000_000,
            0,
            Measured::default(),
            &EndpointNamer::default(),
            None,
        );
        assert_eq!(summary.wall_seconds, 2.0);
        assert_eq!(summary.cpu.total_seconds, 1.5);
        assert_eq!(summary.cpu.per_cpu_seconds, vec![1.0, 0.5]);
        assert_eq!(summary.cpu.cores, 0.75);
        assert_eq!(summary.name, "job");
        assert_eq!(summary.kind, WorkerKind::SystemdService);
        assert_eq!(summary.lithops.worker_func_cpu_usage, vec![50.0, 25.0]);
        assert_eq!(summary.lithops.worker_func_cpu_user_time, Some(1.0));
        assert_eq!(summary.lithops.worker_func_sent_net_io, Some(1234));
        assert_eq!(summary.lithops.worker_peak_memory_end, Some(300));
        assert_eq!(
            summary.context_switches.as_ref().map(|s| s.voluntary),
            Some(3)
        );
        let ipv4 = &summary.net.as_ref().unwrap().families["ipv4"];
        assert_eq!(
            (ipv4.sent_bytes, ipv4.sent_calls, ipv4.received_bytes),
            (1234, 2, 0)
        );
        let json = serde_json::to_value(&summary).expect("json");
        assert_eq!(json["type"], "exit");
        assert_eq!(json["kind"], "systemd_service");
        assert!(json.get("exec").is_none());
        // What was not measured is null, never zero.
        let cpu_only = Measured {
            delays: false,
            net: false,
            ..Measured::default()
        };
        let json = serde_json::to_value(ExitSummary::new(
            &record,
            &counters,
            3_000_000_000,
            0,
            cpu_only,
            &EndpointNamer::default(),
            None,
        ))
        .expect("json");
        assert!(json["time"].is_null() && json["net"].is_null(), "{json}");
        assert!(json["lithops"]["worker_func_sent_net_io"].is_null());
        assert_eq!(json["cpu"]["total_seconds"], 1.5);
    }

    #[test]
    fn the_peak_at_exit_is_the_best_the_kernel_kept() {
        let rss = |bytes| MemoryReading {
            current_bytes: bytes,
            peak_bytes: bytes,
            source: MemorySource::Rss,
        };
        let kernel = |cgroup, process| {
            Some(ExitMemoryPeaks {
                cgroup_peak_bytes: cgroup,
                largest_process_peak_bytes: process,
            })
        };
        // Shorter than a sample: the kernel's figures alone, no last reading.
        let short = SummaryMemory::at_exit(None, 0, kernel(None, Some(50))).expect("memory");
        assert_eq!(
            (short.peak_bytes, short.last_bytes, short.source),
            (50, None, MemorySource::ProcessMaxRss)
        );
        // The memory cgroup's own peak wins over any sample.
        let cgroup = SummaryMemory::at_exit(Some(rss(70)), 80, kernel(Some(90), Some(60)));
        let cgroup = cgroup.expect("memory");
        assert_eq!(
            (cgroup.peak_bytes, cgroup.last_bytes, cgroup.source),
            (90, Some(70), MemorySource::Cgroup2)
        );
        // Sampled RSS keeps its peak unless one process alone was seen higher by the kernel.
        let sampled = SummaryMemory::at_exit(Some(rss(70)), 80, kernel(None, Some(60)));
        assert_eq!(sampled.expect("memory").source, MemorySource::Rss);
        let missed = SummaryMemory::at_exit(Some(rss(70)), 80, kernel(None, Some(95)));
        assert_eq!(missed.expect("memory").peak_bytes, 95);
        assert!(SummaryMemory::at_exit(None, 0, None).is_none());
    }
}
