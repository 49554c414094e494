//! Cumulative series per worker for a scrape (`serve`): live workers' counters as sampled, never
//! going back, and exited workers' final counters for a grace period.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use probe_common::{cpu::CpuStats, net::NetStats};

use super::{
    CpuStatUsec, Sample, WorkerCounters, identity::Identity, registry::WorkerRecord,
    summary::ExitSummary,
};

/// One worker's series: its identity and cumulative counters.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerSeries {
    /// cgroup path relative to the cgroup2 mount: the `worker` label, unique and stable.
    pub path: String,
    /// Name, kind and ids read from the path, for the info metric.
    pub identity: Identity,
    /// Cumulative counters since the programs were loaded (`cpu_stat` since the cgroup was
    /// made, as the kernel keeps it).
    pub counters: WorkerCounters,
    /// Memory in use at the last sample; `None` once the worker has exited.
    pub memory_bytes: Option<u64>,
    /// Highest memory use known.
    pub memory_peak_bytes: Option<u64>,
}

/// The series of live workers and of exited ones in their grace period.
#[derive(Debug)]
pub struct SeriesBook {
    live: BTreeMap<u64, WorkerSeries>,
    /// Exited workers: cgroup id → (when they exited, final series).
    exited: BTreeMap<u64, (Instant, WorkerSeries)>,
    /// Exits since start.
    exits: u64,
    grace: Duration,
}

impl SeriesBook {
    /// Exited workers' series stay `grace`.
    pub fn new(grace: Duration) -> Self {
        Self {
            live: BTreeMap::new(),
            exited: BTreeMap::new(),
            exits: 0,
            grace,
        }
    }

    /// Rebuilds the live series from a sample and the registry's records (the selected,
    /// live workers). A counter never goes back: a worker missing from one sample keeps its
    /// last values rather than dropping to zero, which Prometheus would read as a reset.
    pub fn observe<'a>(
        &mut self,
        sample: &Sample,
        records: impl Iterator<Item = &'a WorkerRecord>,
    ) {
        let mut live = BTreeMap::new();
        for record in records {
            if self.exited.contains_key(&record.cgroup_id) {
                continue;
            }
            let previous = self.live.remove(&record.cgroup_id);
            let mut counters = sample
                .workers
                .get(&record.cgroup_id)
                .cloned()
                .unwrap_or_default();
            if counters.cpu_stat.is_none() {
                counters.cpu_stat = record.cpu_stat;
            }
            if let Some(previous) = &previous {
                counters = monotonic(&previous.counters, counters);
            }
            let peak = record
                .memory
                .map(|reading| reading.peak_bytes.max(record.memory_peak_bytes));
            live.insert(
                record.cgroup_id,
                WorkerSeries {
                    path: record.path.clone(),
                    identity: record.identity.clone(),
                    counters,
                    memory_bytes: record.memory.map(|reading| reading.current_bytes),
                    memory_peak_bytes: peak,
                },
            );
        }
        self.live = live;
    }

    /// A worker exited: its final counters stay for the grace period.
    pub fn exit(&mut self, summary: &ExitSummary, final_counters: WorkerCounters, now: Instant) {
        self.exits += 1;
        let previous = self.live.remove(&summary.cgroup_id);
        let mut counters = match &previous {
            Some(previous) => monotonic(&previous.counters, final_counters),
            None => final_counters,
        };
        counters.path = Some(summary.path.as_str().into());
        if counters.cpu_stat.is_none() {
            counters.cpu_stat = summary
                .cpu
                .user_seconds
                .zip(summary.cpu.system_seconds)
                .map(|(user, system)| CpuStatUsec {
                    usage_usec: ((user + system) * 1e6).round() as u64,
                    user_usec: (user * 1e6).round() as u64,
                    system_usec: (system * 1e6).round() as u64,
                });
        }
        let peak = summary
            .memory
            .as_ref()
            .map(|memory| memory.peak_bytes)
            .or(previous.as_ref().and_then(|p| p.memory_peak_bytes));
        let series = WorkerSeries {
            path: summary.path.clone(),
            identity: Identity {
                name: summary.name.clone(),
                kind: summary.kind,
                ids: summary.ids.clone(),
            },
            counters,
            // It uses no memory any more; its peak stays.
            memory_bytes: None,
            memory_peak_bytes: peak,
        };
        self.exited.insert(summary.cgroup_id, (now, series));
    }

    /// Drops exited workers whose grace period is over; whether any went.
    pub fn expire(&mut self, now: Instant) -> bool {
        let before = self.exited.len();
        let grace = self.grace;
        self.exited
            .retain(|_, (exited_at, _)| now.saturating_duration_since(*exited_at) < grace);
        self.exited.len() != before
    }

    /// Exits since start.
    pub fn exits(&self) -> u64 {
        self.exits
    }

    /// Live workers with a series.
    pub fn live_workers(&self) -> u64 {
        self.live.len() as u64
    }

    /// Every series to expose, one per path: a cgroup made again at the path of an exited one
    /// replaces it (two series with one label set would break the scrape).
    pub fn workers(&self) -> Vec<WorkerSeries> {
        let mut by_path: BTreeMap<&str, &WorkerSeries> = BTreeMap::new();
        let mut exited: Vec<&(Instant, WorkerSeries)> = self.exited.values().collect();
        exited.sort_by_key(|(exited_at, _)| *exited_at);
        for (_, series) in exited {
            by_path.insert(&series.path, series);
        }
        for series in self.live.values() {
            by_path.insert(&series.path, series);
        }
        by_path.into_values().cloned().collect()
    }
}

/// Field by field the larger of two readings of one worker's cumulative counters.
fn monotonic(previous: &WorkerCounters, mut current: WorkerCounters) -> WorkerCounters {
    if current.on_cpu_ns_per_cpu.len() < previous.on_cpu_ns_per_cpu.len() {
        current
            .on_cpu_ns_per_cpu
            .resize(previous.on_cpu_ns_per_cpu.len(), 0);
    }
    for (cur, prev) in current
        .on_cpu_ns_per_cpu
        .iter_mut()
        .zip(&previous.on_cpu_ns_per_cpu)
    {
        *cur = (*cur).max(*prev);
    }
    *current.sched = max_cpu(&previous.sched, &current.sched);
    current.net = max_net(&previous.net, &current.net);
    for before in &previous.endpoints {
        match current.endpoints.iter_mut().find(|e| e.key == before.key) {
            Some(now) => {
                let (a, b) = (before.stats, now.stats);
                now.stats = probe_common::net::EndpointStats {
                    sent_bytes: a.sent_bytes.max(b.sent_bytes),
                    received_bytes: a.received_bytes.max(b.received_bytes),
                    sent_calls: a.sent_calls.max(b.sent_calls),
                    received_calls: a.received_calls.max(b.received_calls),
                    wait_ns: a.wait_ns.max(b.wait_ns),
                    waits: a.waits.max(b.waits),
                };
            }
            None => current.endpoints.push(before.clone()),
        }
    }
    current.cpu_stat = match (previous.cpu_stat, current.cpu_stat) {
        (Some(p), Some(c)) => Some(CpuStatUsec {
            usage_usec: p.usage_usec.max(c.usage_usec),
            user_usec: p.user_usec.max(c.user_usec),
            system_usec: p.system_usec.max(c.system_usec),
        }),
        (p, c) => c.or(p),
    };
    current
}

fn max_cpu(a: &CpuStats, b: &CpuStats) -> CpuStats {
    let mut hist = b.runqueue_wait_hist;
    for (out, &other) in hist.iter_mut().zip(&a.runqueue_wait_hist) {
        *out = (*out).max(other);
    }
    CpuStats {
        on_cpu_ns: a.on_cpu_ns.max(b.on_cpu_ns),
        voluntary_switches: a.voluntary_switches.max(b.voluntary_switches),
        involuntary_switches: a.involuntary_switches.max(b.involuntary_switches),
        runqueue_wait_ns: a.runqueue_wait_ns.max(b.runqueue_wait_ns),
        blocked_io_ns: a.blocked_io_ns.max(b.blocked_io_ns),
        sleep_ns: a.sleep_ns.max(b.sleep_ns),
        wakeups: a.wakeups.max(b.wakeups),
        runqueue_wait_hist: hist,
        wait_ns: std::array::from_fn(|r| a.wait_ns[r].max(b.wait_ns[r])),
        waits: std::array::from_fn(|r| a.waits[r].max(b.waits[r])),
        user_tick_ns: a.user_tick_ns.max(b.user_tick_ns),
        system_tick_ns: a.system_tick_ns.max(b.system_tick_ns),
    }
}

fn max_net(a: &NetStats, b: &NetStats) -> NetStats {
    let mut out = *b;
    for (family, other) in out.families.iter_mut().zip(&a.families) {
        family.sent_bytes = family.sent_bytes.max(other.sent_bytes);
        family.sent_calls = family.sent_calls.max(other.sent_calls);
        family.received_bytes = family.received_bytes.max(other.received_bytes);
        family.received_calls = family.received_calls.max(other.received_calls);
    }
    out
}

#[cfg(test)]
mod tests {
    use probe_common::net::FAMILY_IPV4;

    use super::*;
    use crate::model::{
        Measured, MemoryReading, MemorySource,
        identity::{WorkerKind, identify},
    };

    fn record(id: u64, path: &str) -> WorkerRecord {
        WorkerRecord {
            cgroup_id: id,
            path: path.into(),
            identity: identify(path),
            started_at_monotonic_ns: 0,
            start_observed: true,
            memory: Some(MemoryReading {
                current_bytes: 100,
                peak_bytes: 300,
                source: MemorySource::Cgroup2,
            }),
            memory_peak_bytes: 300,
            cpu_stat: None,
        }
    }

    fn counters(on_cpu_ns: u64, sent_bytes: u64) -> WorkerCounters {
        let mut counters = WorkerCounters {
            on_cpu_ns_per_cpu: vec![on_cpu_ns, 0],
            ..WorkerCounters::default()
        };
        counters.net.families[FAMILY_IPV4].sent_bytes = sent_bytes;
        counters.net.families[FAMILY_IPV4].sent_calls = 1;
        counters
    }

    fn sample(workers: &[(u64, WorkerCounters)]) -> Sample {
        Sample {
            workers: workers.iter().cloned().collect(),
            ..Sample::default()
        }
    }

    fn summary(record: &WorkerRecord, final_counters: &WorkerCounters) -> ExitSummary {
        ExitSummary::new(
            record,
            final_counters,
            1_000,
            0,
            Measured::default(),
            &crate::model::endpoints::EndpointNamer::default(),
            None,
        )
    }

    #[test]
    fn exited_workers_stay_for_the_grace_period_then_go() {
        let mut book = SeriesBook::new(Duration::from_secs(10));
        let job = record(7, "/job");
        let other = record(8, "/other");
        book.observe(
            &sample(&[(7, counters(100, 10)), (8, counters(5, 0))]),
            [&job, &other].into_iter(),
        );
        assert_eq!(book.live_workers(), 2);
        let start = Instant::now();
        let last = counters(250, 40);
        book.exit(&summary(&job, &last), last.clone(), start);
        assert_eq!(book.exits, 1);
        assert_eq!(book.live_workers(), 1);
        let workers = book.workers();
        assert_eq!(workers.len(), 2);
        let exited = &workers[0];
        assert_eq!(exited.path, "/job");
        assert_eq!(exited.counters.on_cpu_ns(), 250, "final counters kept");
        assert_eq!(exited.memory_bytes, None);
        assert_eq!(exited.memory_peak_bytes, Some(300));
        assert_eq!(exited.identity.kind, WorkerKind::Cgroup);

        // A sample after the exit (the registry no longer has it) keeps it exited.
        book.observe(&sample(&[(8, counters(6, 0))]), [&other].into_iter());
        assert_eq!(book.workers().len(), 2);
        assert!(!book.expire(start + Duration::from_secs(9)));
        assert!(book.expire(start + Duration::from_secs(10)));
        let workers = book.workers();
        assert_eq!(workers.len(), 1);
        assert_eq!(workers[0].path, "/other");
        assert_eq!(book.exits, 1, "the exit count never drops");
    }

    #[test]
    fn a_short_worker_never_sampled_is_still_exposed() {
        let mut book = SeriesBook::new(Duration::from_secs(60));
        let job = record(9, "/short");
        let last = counters(30_000_000, 0);
        book.exit(&summary(&job, &last), last, Instant::now());
        let workers = book.workers();
        assert_eq!(workers.len(), 1);
        assert_eq!(workers[0].counters.on_cpu_ns(), 30_000_000);
        assert_eq!(book.live_workers(), 0);
    }

    #[test]
    fn counters_never_go_back() {
        let mut book = SeriesBook::new(Duration::from_secs(60));
        let job = record(7, "/job");
        book.observe(&sample(&[(7, counters(100, 10))]), [&job].into_iter());
        // Missing from one sample: keeps its values rather than reading zero.
        book.observe(&sample(&[]), [&job].into_iter());
        let workers = book.workers();
        assert_eq!(workers[0].counters.on_cpu_ns(), 100);
        assert_eq!(workers[0].counters.net.families[FAMILY_IPV4].sent_bytes, 10);
        // Final counters a little behind the last sample do not lower it either.
        let last = counters(90, 10);
        book.exit(&summary(&job, &last), last, Instant::now());
        assert_eq!(book.workers()[0].counters.on_cpu_ns(), 100);
    }

    #[test]
    fn a_cgroup_made_again_replaces_the_exited_one() {
        let mut book = SeriesBook::new(Duration::from_secs(60));
        let old = record(7, "/job");
        let last = counters(500, 0);
        book.observe(&sample(&[(7, last.clone())]), [&old].into_iter());
        book.exit(&summary(&old, &last), last, Instant::now());
        let new = record(11, "/job");
        book.observe(&sample(&[(11, counters(1, 0))]), [&new].into_iter());
        let workers = book.workers();
        assert_eq!(workers.len(), 1, "one series per path");
        assert_eq!(workers[0].counters.on_cpu_ns(), 1);
    }
}
