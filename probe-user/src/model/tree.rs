//! Tree levels. Every worker's figures are its own threads' (a cgroup's `self`); a user who
//! cares about pods or slices rather than their containers folds every worker below a depth
//! into its ancestor at that depth, whose figures then cover its whole subtree. Own figures
//! are disjoint, so a sum of them never counts a thread twice.

use std::collections::HashMap;

use super::stats::{Interval, WorkerStats};

/// How many levels below the cgroup2 root `path` is (`/` is 0, `/a/b` is 2).
pub fn depth_of(path: &str) -> usize {
    path.split('/').filter(|part| !part.is_empty()).count()
}

/// The path of the cgroup `depth` levels below the root that holds `path`: `path` itself when
/// it is not deeper.
pub fn ancestor_at_depth(path: &str, depth: usize) -> String {
    let parts: Vec<&str> = path.split('/').filter(|part| !part.is_empty()).collect();
    if parts.len() <= depth {
        return path.to_owned();
    }
    format!("/{}", parts[..depth].join("/"))
}

impl Interval {
    /// Folds every worker deeper than `depth` into its ancestor at `depth`, which becomes a
    /// worker (with `subtree` set) even if no thread of its own ran: a pod summing its
    /// containers, a slice its services. Workers above `depth` keep their own figures, so no
    /// thread is counted twice. `id_of` gives an ancestor's cgroup id when no worker had it.
    /// Memory is cleared where workers were merged: read it again for the folded path.
    pub fn fold_to_depth(&mut self, depth: usize, mut id_of: impl FnMut(&str) -> Option<u64>) {
        let mut kept: Vec<WorkerStats> = Vec::new();
        let mut folded: Vec<WorkerStats> = Vec::new();
        let mut at: HashMap<String, usize> = HashMap::new();
        for worker in std::mem::take(&mut self.workers) {
            let Some(path) = worker.path.clone() else {
                kept.push(worker);
                continue;
            };
            if depth_of(&path) < depth {
                kept.push(worker);
                continue;
            }
            let ancestor = ancestor_at_depth(&path, depth);
            let is_ancestor = path == ancestor;
            match at.get(&ancestor) {
                Some(&slot) => {
                    let entry = &mut folded[slot];
                    entry.absorb(&worker);
                    if is_ancestor {
                        // The ancestor's own entry names it best (its runtime's names).
                        entry.cgroup_id = worker.cgroup_id;
                        entry.identity = worker.identity.clone();
                    }
                    entry.memory = None;
                }
                None => {
                    let mut entry = worker;
                    if !is_ancestor {
                        entry.cgroup_id = id_of(&ancestor).unwrap_or(0);
                        entry.path = Some(ancestor.clone());
                        entry.identity = None;
                        entry.memory = None;
                    }
                    entry.subtree = true;
                    at.insert(ancestor, folded.len());
                    folded.push(entry);
                }
            }
        }
        kept.extend(folded);
        kept.sort_by_key(|worker| worker.cgroup_id);
        self.workers = kept;
        self.depth = Some(depth);
    }
}

impl WorkerStats {
    /// Adds `other`'s figures to this worker's (same interval).
    fn absorb(&mut self, other: &WorkerStats) {
        if self.cpu_ns_per_cpu.len() < other.cpu_ns_per_cpu.len() {
            self.cpu_ns_per_cpu.resize(other.cpu_ns_per_cpu.len(), 0);
        }
        for (sum, add) in self.cpu_ns_per_cpu.iter_mut().zip(&other.cpu_ns_per_cpu) {
            *sum += add;
        }
        self.voluntary_switches += other.voluntary_switches;
        self.involuntary_switches += other.involuntary_switches;
        let (delays, add) = (&mut self.delays, &other.delays);
        delays.runqueue_wait_ns += add.runqueue_wait_ns;
        delays.blocked_io_ns += add.blocked_io_ns;
        delays.sleep_ns += add.sleep_ns;
        delays.wakeups += add.wakeups;
        if delays.runqueue_wait_hist.len() < add.runqueue_wait_hist.len() {
            delays
                .runqueue_wait_hist
                .resize(add.runqueue_wait_hist.len(), 0);
        }
        for (sum, add) in delays
            .runqueue_wait_hist
            .iter_mut()
            .zip(&add.runqueue_wait_hist)
        {
            *sum += add;
        }
        for (sum, add) in delays.wait_ns.iter_mut().zip(add.wait_ns) {
            *sum += add;
        }
        for (sum, add) in delays.waits.iter_mut().zip(add.waits) {
            *sum += add;
        }
        for (sum, add) in self.net.iter_mut().zip(&other.net) {
            sum.sent_bytes += add.sent_bytes;
            sum.received_bytes += add.received_bytes;
            sum.sent_calls += add.sent_calls;
            sum.received_calls += add.received_calls;
        }
        let add_measured = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a + b),
            (a, None) | (None, a) => a,
        };
        self.cpu_user_ns = add_measured(self.cpu_user_ns, other.cpu_user_ns);
        self.cpu_system_ns = add_measured(self.cpu_system_ns, other.cpu_system_ns);
        self.user_tick_ns += other.user_tick_ns;
        self.system_tick_ns += other.system_tick_ns;
        self.total_cpu_ns += other.total_cpu_ns;
        self.total_sent_bytes += other.total_sent_bytes;
        self.total_received_bytes += other.total_received_bytes;
        self.endpoints.extend(other.endpoints.iter().cloned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(cgroup_id: u64, path: &str, cpu_ns: u64, sent_bytes: u64) -> WorkerStats {
        let mut worker = WorkerStats {
            cgroup_id,
            path: Some(path.into()),
            interval_ns: 1_000_000_000,
            cpu_ns_per_cpu: vec![cpu_ns, 1],
            voluntary_switches: 1,
            cpu_user_ns: Some(cpu_ns / 2),
            cpu_system_ns: Some(cpu_ns - cpu_ns / 2 + 1),
            total_cpu_ns: cpu_ns + 1,
            ..WorkerStats::default()
        };
        worker.net[0].sent_bytes = sent_bytes;
        worker.net[0].sent_calls = 1;
        worker
    }

    #[test]
    fn ancestors_and_depths() {
        assert_eq!(depth_of("/"), 0);
        assert_eq!(depth_of("/kubepods/burstable/pod1/c1"), 4);
        assert_eq!(
            ancestor_at_depth("/kubepods/burstable/pod1/c1", 3),
            "/kubepods/burstable/pod1"
        );
        assert_eq!(ancestor_at_depth("/kubepods/burstable/pod1/c1", 0), "/");
        assert_eq!(ancestor_at_depth("/a", 3), "/a");
    }

    #[test]
    fn a_pod_sums_its_containers_and_nothing_is_counted_twice() {
        let mut interval = Interval {
            workers: vec![
                worker(10, "/", 5, 0),
                worker(11, "/kubepods", 7, 0),
                worker(20, "/kubepods/burstable/pod1/c1", 100, 1000),
                worker(21, "/kubepods/burstable/pod1/c2", 300, 24),
                worker(22, "/kubepods/burstable/pod2/c3", 50, 0),
                worker(23, "/kubepods/burstable/pod2", 2, 0),
            ],
            ..Interval::default()
        };
        let before: u64 = interval.workers.iter().map(WorkerStats::cpu_ns).sum();
        let ids = HashMap::from([("/kubepods/burstable/pod1".to_owned(), 15u64)]);
        interval.fold_to_depth(3, |path| ids.get(path).copied());

        assert_eq!(interval.depth, Some(3));
        let after: u64 = interval.workers.iter().map(WorkerStats::cpu_ns).sum();
        assert_eq!(after, before, "folding moves figures, never adds them");
        let paths: Vec<(u64, &str, bool)> = interval
            .workers
            .iter()
            .map(|w| (w.cgroup_id, w.path.as_deref().unwrap(), w.subtree))
            .collect();
        assert_eq!(
            paths,
            [
                (10, "/", false),
                (11, "/kubepods", false),
                (15, "/kubepods/burstable/pod1", true),
                (23, "/kubepods/burstable/pod2", true),
            ]
        );
        let pod1 = &interval.workers[2];
        assert_eq!(pod1.cpu_ns_per_cpu, [400, 2]);
        assert_eq!(pod1.cpu_user_ns, Some(200));
        assert_eq!(pod1.cpu_system_ns, Some(202));
        assert_eq!(pod1.net[0].sent_bytes, 1024);
        assert_eq!(pod1.net[0].sent_calls, 2);
        assert_eq!(pod1.voluntary_switches, 2);
        assert_eq!(pod1.total_cpu_ns, 402);
        let pod2 = &interval.workers[3];
        assert_eq!(pod2.cpu_ns_per_cpu, [52, 2]);
    }
}
