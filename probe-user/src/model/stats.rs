//! What each worker did between two samples.

use probe_common::{
    cpu::{RUNQ_BUCKETS, runq_bucket_upper_ns},
    net::{FAMILY_COUNT, FamilyCounters},
    wait::{WAIT_NAMES, WAIT_REASONS},
};

use super::sample::{Sample, WorkerCounters};
use crate::clock::Timestamp;

/// Socket traffic of one family over an interval.
pub type FamilyDelta = FamilyCounters;

/// One family's socket payload and calls, as every JSON output writes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FamilyTotals {
    /// Payload bytes sent.
    pub sent_bytes: u64,
    /// Payload bytes received.
    pub received_bytes: u64,
    /// Successful send calls.
    pub sent_calls: u64,
    /// Successful receive calls.
    pub received_calls: u64,
}

/// The families that had calls, by name (`probe_common::net::FAMILY_NAMES`).
pub fn families_with_calls(
    counters: &[FamilyCounters; FAMILY_COUNT],
) -> impl Iterator<Item = (&'static str, FamilyTotals)> + '_ {
    counters
        .iter()
        .zip(probe_common::net::FAMILY_NAMES)
        .filter(|(family, _)| family.sent_calls + family.received_calls > 0)
        .map(|(family, name)| {
            (
                name,
                FamilyTotals {
                    sent_bytes: family.sent_bytes,
                    received_bytes: family.received_bytes,
                    sent_calls: family.sent_calls,
                    received_calls: family.received_calls,
                },
            )
        })
}

/// One worker over one interval, plus its totals since the programs were loaded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkerStats {
    /// cgroup v2 id.
    pub cgroup_id: u64,
    /// Path relative to the cgroup2 mount, when known.
    pub path: Option<std::sync::Arc<str>>,
    /// Who the worker is, when its path is known.
    pub identity: Option<std::sync::Arc<super::identity::Identity>>,
    /// Length of the interval.
    pub interval_ns: u64,
    /// On-CPU nanoseconds per CPU in the interval.
    pub cpu_ns_per_cpu: Vec<u64>,
    /// Voluntary context switches in the interval.
    pub voluntary_switches: u64,
    /// Involuntary context switches in the interval.
    pub involuntary_switches: u64,
    /// Where the off-CPU time went, for delays that ended in the interval.
    pub delays: Delays,
    /// Socket traffic per family in the interval (`probe_common::net::FAMILY_*` order).
    pub net: [FamilyDelta; FAMILY_COUNT],
    /// User-mode part of the on-CPU time: the kernel's tick-sampled user/system split of the
    /// same slices, scaled to their precise total (as the kernel's `cputime_adjust` does), so
    /// user + system = on-CPU time. `None` when no CPU was measured.
    pub cpu_user_ns: Option<u64>,
    /// Kernel-mode part of the on-CPU time (see `cpu_user_ns`).
    pub cpu_system_ns: Option<u64>,
    /// The tick-sampled user time behind that split, ns.
    pub user_tick_ns: u64,
    /// The tick-sampled system time behind it, ns.
    pub system_tick_ns: u64,
    /// On-CPU nanoseconds since load.
    pub total_cpu_ns: u64,
    /// Bytes sent since load.
    pub total_sent_bytes: u64,
    /// Bytes received since load.
    pub total_received_bytes: u64,
    /// Remote endpoints in the interval (those with any call), by kernel key.
    pub endpoints: Vec<super::endpoints::EndpointDelta>,
    /// Memory at the end of the interval, read from the cgroup (not by the programs); `None`
    /// when not read or no source had it.
    pub memory: Option<super::MemoryReading>,
    /// The figures are the worker's whole subtree's (descendants folded in by
    /// [`Interval::fold`]), not only its own threads'.
    pub subtree: bool,
}

impl WorkerStats {
    /// Who the worker is: as the collector named it, or as its path says.
    pub fn named(&self) -> Option<super::identity::Identity> {
        match (&self.identity, &self.path) {
            (Some(identity), _) => Some(super::identity::Identity::clone(identity)),
            (None, Some(path)) => Some(super::identity::identify(path)),
            (None, None) => None,
        }
    }

    /// On-CPU nanoseconds summed over CPUs.
    pub fn cpu_ns(&self) -> u64 {
        self.cpu_ns_per_cpu.iter().sum()
    }

    /// Average number of CPUs busy with this worker (1.0 = one core all the time).
    pub fn cpu_cores(&self) -> f64 {
        ratio(self.cpu_ns(), self.interval_ns)
    }

    /// Cores used on each CPU.
    pub fn cpu_cores_per_cpu(&self) -> Vec<f64> {
        self.cpu_ns_per_cpu
            .iter()
            .map(|&ns| ratio(ns, self.interval_ns))
            .collect()
    }

    /// Bytes sent over all families.
    pub fn sent_bytes(&self) -> u64 {
        self.net.iter().map(|family| family.sent_bytes).sum()
    }

    /// Bytes received over all families.
    pub fn received_bytes(&self) -> u64 {
        self.net.iter().map(|family| family.received_bytes).sum()
    }

    /// Successful send calls over all families.
    pub fn sent_calls(&self) -> u64 {
        self.net.iter().map(|family| family.sent_calls).sum()
    }

    /// Successful receive calls over all families.
    pub fn received_calls(&self) -> u64 {
        self.net.iter().map(|family| family.received_calls).sum()
    }

    /// Send rate over the interval.
    pub fn sent_bytes_per_second(&self) -> f64 {
        ratio(self.sent_bytes(), self.interval_ns) * 1e9
    }

    /// Receive rate over the interval.
    pub fn received_bytes_per_second(&self) -> f64 {
        ratio(self.received_bytes(), self.interval_ns) * 1e9
    }

    /// `ns` as a share of the interval (thread-seconds per second: a worker with several
    /// threads can exceed 1).
    pub fn share_of_interval(&self, ns: u64) -> f64 {
        ratio(ns, self.interval_ns)
    }

    /// Whether anything happened in the interval.
    pub fn is_active(&self) -> bool {
        self.cpu_ns() > 0
            || self.voluntary_switches + self.involuntary_switches > 0
            || self.sent_calls() + self.received_calls() > 0
    }
}

/// Off-CPU time of a worker's threads over an interval. A delay is counted when it ends (the
/// thread is switched in or woken), so a thread asleep through the whole interval shows it
/// in a later one.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Delays {
    /// Runnable but waiting for a CPU.
    pub runqueue_wait_ns: u64,
    /// Uninterruptible sleep (D state): disk and some network file system waits.
    pub blocked_io_ns: u64,
    /// Interruptible sleep (S state): sockets, locks, timers, idle waits.
    pub sleep_ns: u64,
    /// Wakeups from either sleep.
    pub wakeups: u64,
    /// Run-queue waits by length (`probe_common::cpu::runq_bucket`).
    pub runqueue_wait_hist: [u64; RUNQ_BUCKETS],
    /// Blocked-I/O plus sleep time by wait reason (`probe_common::wait::WAIT_NAMES` order);
    /// sums to `blocked_io_ns + sleep_ns`.
    pub wait_ns: [u64; WAIT_REASONS],
    /// Sleeps by wait reason.
    pub waits: [u64; WAIT_REASONS],
}

impl Delays {
    /// Wait reasons by time, longest first, with their names; only those with time.
    pub fn reasons_by_time(&self) -> Vec<(&'static str, u64)> {
        let mut reasons: Vec<(&'static str, u64)> = WAIT_NAMES
            .iter()
            .copied()
            .zip(self.wait_ns)
            .filter(|(_, ns)| *ns > 0)
            .collect();
        reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        reasons
    }

    /// Run-queue waits in the histogram.
    pub fn runqueue_waits(&self) -> u64 {
        self.runqueue_wait_hist.iter().sum()
    }

    /// The upper edge of the bucket holding quantile `q` (0..=1) of the run-queue waits;
    /// `None` without waits. The last bucket is open: its lower edge is reported.
    pub fn runqueue_wait_quantile_ns(&self, q: f64) -> Option<u64> {
        let total = self.runqueue_waits();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (bucket, &count) in self.runqueue_wait_hist.iter().enumerate() {
            seen += count;
            if seen >= rank {
                let upper = runq_bucket_upper_ns(bucket);
                return Some(if upper == u64::MAX {
                    runq_bucket_upper_ns(bucket - 1)
                } else {
                    upper
                });
            }
        }
        None
    }
}

/// `part / whole`, 0 when the interval is empty.
fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64
    }
}

/// Every worker between two samples.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Interval {
    /// Start of the interval (the earlier sample), if there was one.
    pub start: Option<Timestamp>,
    /// End of the interval.
    pub end: Option<Timestamp>,
    /// Workers, active or not, in cgroup id order.
    pub workers: Vec<WorkerStats>,
    /// Drops in the interval per map.
    pub drops: Vec<u64>,
    /// Drops since load per map.
    pub total_drops: Vec<u64>,
    /// What the counters cover: the rest reads zero but is not measured.
    pub measured: super::Measured,
    /// The tree level the workers were folded to ([`Interval::fold`]), if they were.
    pub level: Option<super::tree::Level>,
}

impl Interval {
    /// Length of the interval in nanoseconds (0 without a start).
    pub fn duration_ns(&self) -> u64 {
        match (self.start, self.end) {
            (Some(start), Some(end)) => end.monotonic_ns.saturating_sub(start.monotonic_ns),
            _ => 0,
        }
    }

    /// Workers that did something in the interval.
    pub fn active_workers(&self) -> impl Iterator<Item = &WorkerStats> {
        self.workers.iter().filter(|worker| worker.is_active())
    }

    /// Drops the workers `selection` does not pick (and those whose path is unknown, unless
    /// every worker is picked).
    pub fn retain_selected(&mut self, selection: &super::selection::Selection) {
        if selection.is_all() {
            return;
        }
        self.workers
            .retain(|worker| match (&worker.path, worker.named()) {
                (Some(path), Some(identity)) => selection.matches_identity(path, &identity),
                _ => false,
            });
    }
}

/// What each worker did from `previous` to `current`. A worker absent from `previous` counts
/// from zero (it started after the programs were loaded). A counter that went backwards (its
/// entry was freed and made again) also counts from zero rather than wrapping.
pub fn diff(previous: Option<&Sample>, current: &Sample) -> Interval {
    diff_reusing(previous, current, Interval::default())
}

/// [`diff`], its workers written into the vector of `spent`, an interval the caller is done
/// with: a thousand workers' figures are most of a MiB, which freshly allocated each sample
/// cost the agent its mapping and a page fault per page.
pub fn diff_reusing(previous: Option<&Sample>, current: &Sample, spent: Interval) -> Interval {
    let start = previous.and_then(|sample| sample.taken_at);
    let end = current.taken_at;
    let interval_ns = match (start, end) {
        (Some(start), Some(end)) => end.monotonic_ns.saturating_sub(start.monotonic_ns),
        _ => 0,
    };
    let mut workers = spent.workers;
    workers.clear();
    workers.extend(current.workers.iter().map(|(&cgroup_id, now)| {
        let before = previous.and_then(|sample| sample.workers.get(&cgroup_id));
        worker_delta(cgroup_id, before, now, interval_ns)
    }));
    let before_drops = previous.map(|sample| sample.drops.by_map.as_slice());
    let drops = current
        .drops
        .by_map
        .iter()
        .enumerate()
        .map(|(slot, &now)| {
            let before = before_drops.and_then(|d| d.get(slot)).copied().unwrap_or(0);
            now.checked_sub(before).unwrap_or(now)
        })
        .collect();
    Interval {
        start,
        end,
        workers,
        drops,
        total_drops: current.drops.by_map.clone(),
        measured: current.measured,
        level: None,
    }
}

/// A worker's whole record as one interval of `interval_ns`: its counters from zero.
pub fn totals(cgroup_id: u64, counters: &WorkerCounters, interval_ns: u64) -> WorkerStats {
    worker_delta(cgroup_id, None, counters, interval_ns)
}

fn worker_delta(
    cgroup_id: u64,
    before: Option<&WorkerCounters>,
    now: &WorkerCounters,
    interval_ns: u64,
) -> WorkerStats {
    // A worker whose counters went backwards was freed and re-made: count it from zero.
    let before = before.filter(|before| counters_grew(before, now));
    let zero = probe_common::cpu::CpuStats::default();
    let base = before.map_or(&zero, |b| &b.sched);
    let on_cpu_before = |cpu: usize| {
        before
            .and_then(|b| b.on_cpu_ns_per_cpu.get(cpu))
            .copied()
            .unwrap_or(0)
    };
    let counters = &now.sched;
    let user_ticks = counters.user_tick_ns.saturating_sub(base.user_tick_ns);
    let system_ticks = counters.system_tick_ns.saturating_sub(base.system_tick_ns);
    let mut stats = WorkerStats {
        cgroup_id,
        path: now.path.clone(),
        identity: now.identity.clone(),
        interval_ns,
        total_cpu_ns: now.on_cpu_ns(),
        total_sent_bytes: now.net.families.iter().map(|f| f.sent_bytes).sum(),
        total_received_bytes: now.net.families.iter().map(|f| f.received_bytes).sum(),
        cpu_ns_per_cpu: now
            .on_cpu_ns_per_cpu
            .iter()
            .enumerate()
            .map(|(cpu, on_cpu_ns)| on_cpu_ns - on_cpu_before(cpu))
            .collect(),
        voluntary_switches: counters.voluntary_switches - base.voluntary_switches,
        involuntary_switches: counters.involuntary_switches - base.involuntary_switches,
        ..WorkerStats::default()
    };
    let delays = &mut stats.delays;
    delays.runqueue_wait_ns = counters
        .runqueue_wait_ns
        .saturating_sub(base.runqueue_wait_ns);
    delays.blocked_io_ns = counters.blocked_io_ns.saturating_sub(base.blocked_io_ns);
    delays.sleep_ns = counters.sleep_ns.saturating_sub(base.sleep_ns);
    delays.wakeups = counters.wakeups.saturating_sub(base.wakeups);
    for reason in 0..WAIT_REASONS {
        delays.wait_ns[reason] = counters.wait_ns[reason].saturating_sub(base.wait_ns[reason]);
        delays.waits[reason] = counters.waits[reason].saturating_sub(base.waits[reason]);
    }
    for (delta, (now, then)) in delays.runqueue_wait_hist.iter_mut().zip(
        counters
            .runqueue_wait_hist
            .iter()
            .zip(base.runqueue_wait_hist.iter()),
    ) {
        *delta = now.saturating_sub(*then);
    }
    for (slot, family) in now.net.families.iter().enumerate() {
        let base = before.map(|b| b.net.families[slot]).unwrap_or_default();
        stats.net[slot] = FamilyCounters {
            sent_bytes: family.sent_bytes - base.sent_bytes,
            sent_calls: family.sent_calls - base.sent_calls,
            received_bytes: family.received_bytes - base.received_bytes,
            received_calls: family.received_calls - base.received_calls,
        };
    }
    for endpoint in &now.endpoints {
        let base = before
            .and_then(|b| b.endpoints.iter().find(|e| e.key == endpoint.key))
            .map(|e| e.stats)
            .unwrap_or_default();
        let delta = super::endpoints::sub_stats(&endpoint.stats, &base);
        if delta.sent_calls + delta.received_calls > 0 {
            stats.endpoints.push(super::endpoints::EndpointDelta {
                key: endpoint.key,
                stats: delta,
            });
        }
    }
    let (user_ns, system_ns) = split_user_system(stats.cpu_ns(), user_ticks, system_ticks);
    stats.cpu_user_ns = Some(user_ns);
    stats.cpu_system_ns = Some(system_ns);
    stats.user_tick_ns = user_ticks;
    stats.system_tick_ns = system_ticks;
    stats
}

/// Splits `cpu_ns` into user and system time in the proportion of the tick-sampled times,
/// as the kernel's `cputime_adjust` does: with no system ticks (or no ticks at all, a life
/// shorter than a tick) it is all user; with no user ticks, all system.
pub fn split_user_system(cpu_ns: u64, user_ticks: u64, system_ticks: u64) -> (u64, u64) {
    if system_ticks == 0 {
        return (cpu_ns, 0);
    }
    if user_ticks == 0 {
        return (0, cpu_ns);
    }
    let user = (u128::from(cpu_ns) * u128::from(user_ticks)
        / (u128::from(user_ticks) + u128::from(system_ticks))) as u64;
    (user, cpu_ns - user)
}

/// Whether every counter in `now` is at least its value in `before`.
fn counters_grew(before: &WorkerCounters, now: &WorkerCounters) -> bool {
    let on_cpu_ok = before.on_cpu_ns_per_cpu.len() <= now.on_cpu_ns_per_cpu.len()
        && before
            .on_cpu_ns_per_cpu
            .iter()
            .zip(&now.on_cpu_ns_per_cpu)
            .all(|(b, n)| n >= b);
    let switches_ok = now.sched.voluntary_switches >= before.sched.voluntary_switches
        && now.sched.involuntary_switches >= before.sched.involuntary_switches;
    let net_ok = before
        .net
        .families
        .iter()
        .zip(&now.net.families)
        .all(|(b, n)| {
            n.sent_bytes >= b.sent_bytes
                && n.sent_calls >= b.sent_calls
                && n.received_bytes >= b.received_bytes
                && n.received_calls >= b.received_calls
        });
    on_cpu_ok && switches_ok && net_ok
}

#[cfg(test)]
mod split_tests {
    use super::split_user_system;

    #[test]
    fn splits_like_the_kernels_cputime_adjust() {
        assert_eq!(split_user_system(900, 2, 1), (600, 300));
        // No ticks (a life under one) or no system ticks: all user; no user ticks: system.
        assert_eq!(split_user_system(900, 0, 0), (900, 0));
        assert_eq!(split_user_system(900, 5, 0), (900, 0));
        assert_eq!(split_user_system(900, 0, 5), (0, 900));
        // No overflow on long lives.
        let (user, system) = split_user_system(u64::MAX / 2, u64::MAX / 3, u64::MAX / 3);
        assert_eq!(user + system, u64::MAX / 2);
    }
}

#[cfg(test)]
mod tests {
    use probe_common::{cpu::CpuStats, net::FAMILY_IPV4};

    use super::*;
    use crate::model::{Drops, WorkerCounters};

    fn at(ms: u64) -> Option<Timestamp> {
        Some(Timestamp {
            monotonic_ns: ms * 1_000_000,
            wall_unix_ns: ms * 1_000_000,
        })
    }

    fn counters(cpu0_ns: u64, cpu1_ns: u64, sent: u64) -> WorkerCounters {
        let mut worker = WorkerCounters {
            path: Some("/a".into()),
            ..WorkerCounters::default()
        };
        worker.add_cpu(
            0,
            &CpuStats {
                on_cpu_ns: cpu0_ns,
                voluntary_switches: 1,
                sleep_ns: cpu0_ns * 2,
                ..CpuStats::default()
            },
        );
        worker.add_cpu(
            1,
            &CpuStats {
                on_cpu_ns: cpu1_ns,
                involuntary_switches: 2,
                runqueue_wait_ns: cpu1_ns / 2,
                ..CpuStats::default()
            },
        );
        worker.net.families[FAMILY_IPV4].sent_bytes = sent;
        worker.net.families[FAMILY_IPV4].sent_calls = sent / 100;
        worker
    }

    fn sample(ms: u64, worker: WorkerCounters, drops: u64) -> Sample {
        Sample {
            measured: Default::default(),
            taken_at: at(ms),
            workers: [(7, worker)].into_iter().collect(),
            drops: Drops {
                by_map: vec![drops, 0],
            },
        }
    }

    #[test]
    fn diff_takes_deltas_and_rates() {
        let before = sample(1_000, counters(100, 0, 1_000), 1);
        let after = sample(2_000, counters(500_000_100, 250_000_000, 3_000), 4);
        let interval = diff(Some(&before), &after);
        assert_eq!(interval.duration_ns(), 1_000_000_000);
        let worker = &interval.workers[0];
        assert_eq!(worker.cpu_ns_per_cpu, vec![500_000_000, 250_000_000]);
        assert_eq!(worker.cpu_ns(), 750_000_000);
        assert!((worker.cpu_cores() - 0.75).abs() < 1e-12);
        assert_eq!(worker.sent_bytes(), 2_000);
        assert_eq!(worker.sent_calls(), 20);
        assert!((worker.sent_bytes_per_second() - 2_000.0).abs() < 1e-9);
        assert_eq!(worker.total_cpu_ns, 750_000_100);
        assert_eq!(interval.drops, vec![3, 0]);
        assert_eq!(worker.delays.sleep_ns, 1_000_000_000);
        assert_eq!(worker.delays.runqueue_wait_ns, 125_000_000);
        assert!((worker.share_of_interval(worker.delays.sleep_ns) - 1.0).abs() < 1e-12);
        assert_eq!(interval.total_drops, vec![4, 0]);
    }

    #[test]
    fn runqueue_quantiles_come_from_the_histogram() {
        let mut delays = Delays {
            runqueue_wait_hist: [0; RUNQ_BUCKETS],
            ..Delays::default()
        };
        assert_eq!(delays.runqueue_wait_quantile_ns(0.5), None);
        delays.runqueue_wait_hist[1] = 50; // [1, 2) µs
        delays.runqueue_wait_hist[11] = 40; // [1024, 2048) µs
        delays.runqueue_wait_hist[RUNQ_BUCKETS - 1] = 10; // open last bucket
        assert_eq!(delays.runqueue_wait_quantile_ns(0.5), Some(2_000));
        assert_eq!(delays.runqueue_wait_quantile_ns(0.9), Some(2_048_000));
        assert_eq!(
            delays.runqueue_wait_quantile_ns(0.99),
            Some(runq_bucket_upper_ns(RUNQ_BUCKETS - 2))
        );
    }

    #[test]
    fn new_worker_counts_from_zero() {
        let after = sample(2_000, counters(10, 20, 30), 0);
        let interval = diff(Some(&Sample::default()), &after);
        assert_eq!(interval.workers[0].cpu_ns(), 30);
        assert_eq!(interval.workers[0].sent_bytes(), 30);
    }

    #[test]
    fn counter_going_backwards_never_wraps() {
        let before = sample(1_000, counters(1_000, 1_000, 1_000), 0);
        let after = sample(2_000, counters(10, 1_000, 1_000), 0);
        let interval = diff(Some(&before), &after);
        assert_eq!(interval.workers[0].cpu_ns(), 1_010);
    }

    #[test]
    fn idle_worker_is_inactive_and_zero_interval_has_zero_rate() {
        let before = sample(1_000, counters(5, 5, 5), 0);
        let interval = diff(Some(&before), &before.clone());
        assert!(!interval.workers[0].is_active());
        assert_eq!(interval.active_workers().count(), 0);
        assert_eq!(interval.workers[0].cpu_cores(), 0.0);
    }
}
