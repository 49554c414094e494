//! Tree levels. Every worker's figures are its own threads' (a cgroup's `self`); a user who
//! cares about pods or slices rather than their containers folds every worker below a level
//! into its ancestor at that level, whose figures then cover its whole subtree. Own figures
//! are disjoint, so a sum of them never counts a thread twice.

use std::collections::HashMap;

use super::{
    identity::{WorkerKind, identify},
    sample::WorkerCounters,
    stats::{Interval, WorkerStats},
};

/// The level of the cgroup tree whose cgroups are the workers (`--depth`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    /// The cgroups this many levels below the cgroup2 root (`/` is 0).
    Depth(usize),
    /// Each Kubernetes pod's cgroup, at whatever depth its QoS class puts it.
    Pods,
}

impl serde::Serialize for Level {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Level::Depth(depth) => serializer.serialize_u64(*depth as u64),
            Level::Pods => serializer.serialize_str("pods"),
        }
    }
}

impl std::fmt::Display for Level {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Level::Depth(depth) => write!(f, "depth {depth}"),
            Level::Pods => write!(f, "pods"),
        }
    }
}

impl Level {
    /// The cgroup at this level that holds `path` (`path` itself when it is at the level), or
    /// `None` when `path` is above the level (or, for pods, in no pod): it stays its own.
    pub fn holder(&self, path: &str) -> Option<String> {
        match *self {
            Level::Depth(depth) => {
                (depth_of(path) >= depth).then(|| ancestor_at_depth(path, depth))
            }
            Level::Pods => (1..=depth_of(path))
                .map(|depth| ancestor_at_depth(path, depth))
                .find(|prefix| {
                    let identity = identify(prefix);
                    identity.kind == WorkerKind::Kubernetes
                        && identity.ids.contains_key("pod_uid")
                        && !identity.ids.contains_key("container_id")
                }),
        }
    }
}

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
    /// Folds every worker below `level` into its ancestor at `level`, which becomes a worker
    /// (with `subtree` set) even if no thread of its own ran: a pod summing its containers, a
    /// slice its services. Workers above the level keep their own figures, so no thread is
    /// counted twice. `holder_of` gives an ancestor's cgroup id and identity when no worker
    /// had it. Memory is cleared where workers were merged: read it again for the folded path.
    pub fn fold(
        &mut self,
        level: Level,
        mut holder_of: impl FnMut(&str) -> (u64, std::sync::Arc<super::identity::Identity>),
    ) {
        let mut kept: Vec<WorkerStats> = Vec::new();
        let mut folded: Vec<WorkerStats> = Vec::new();
        let mut at: HashMap<String, usize> = HashMap::new();
        for worker in std::mem::take(&mut self.workers) {
            let Some(path) = worker.path.clone() else {
                kept.push(worker);
                continue;
            };
            let Some(ancestor) = level.holder(&path) else {
                kept.push(worker);
                continue;
            };
            let is_ancestor = *path == *ancestor;
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
                        let (cgroup_id, identity) = holder_of(&ancestor);
                        entry.cgroup_id = cgroup_id;
                        entry.path = Some(ancestor.as_str().into());
                        entry.identity = Some(identity);
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
        self.level = Some(level);
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
            sum.add(add);
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

impl WorkerCounters {
    /// Adds a descendant's final counters to these (a subtree's exit summary sums them). The
    /// memory cgroup's own peak is kept (on cgroup2 it already covers the subtree); the
    /// largest process peak is the larger of the two.
    pub fn absorb(&mut self, other: &WorkerCounters) {
        self.add_sched(other);
        self.net.add(&other.net);
        // One entry per remote endpoint, whichever descendant talked to it: a holder that
        // lives long keeps a bounded list.
        for add in &other.endpoints {
            let same_peer = |mine: &&mut super::endpoints::EndpointDelta| {
                (mine.key.addr, mine.key.port, mine.key.family)
                    == (add.key.addr, add.key.port, add.key.family)
            };
            match self.endpoints.iter_mut().find(same_peer) {
                Some(mine) => super::endpoints::add_stats(&mut mine.stats, &add.stats),
                None => self.endpoints.push(add.clone()),
            }
        }
        if let Some(add) = other.exit_memory {
            let mine = self.exit_memory.get_or_insert_with(Default::default);
            mine.largest_process_peak_bytes = mine
                .largest_process_peak_bytes
                .max(add.largest_process_peak_bytes);
        }
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
    fn a_pod_holds_its_containers_at_any_qos_depth() {
        const UID: &str = "0d2b9a4e-5c36-4a35-9f0e-3d2a1b7c8e90";
        let burstable = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice",
            UID.replace('-', "_")
        );
        let guaranteed = format!(
            "/kubepods.slice/kubepods-pod{}.slice",
            UID.replace('-', "_")
        );
        let container = format!("{burstable}/cri-containerd-{}.scope", "ab".repeat(32));
        assert_eq!(Level::Pods.holder(&container), Some(burstable.clone()));
        assert_eq!(Level::Pods.holder(&burstable), Some(burstable.clone()));
        assert_eq!(
            Level::Pods.holder(&format!("{guaranteed}/{}", "cd".repeat(32))),
            Some(guaranteed)
        );
        assert_eq!(Level::Pods.holder("/kubepods.slice"), None);
        assert_eq!(Level::Pods.holder("/system.slice/nginx.service"), None);
        assert_eq!(Level::Depth(2).holder("/a"), None);
        assert_eq!(Level::Depth(1).holder("/a/b"), Some("/a".into()));
    }

    #[test]
    fn a_subtrees_final_counters_sum_its_descendants() {
        let mut cpu = probe_common::cpu::CpuStats {
            on_cpu_ns: 10,
            user_tick_ns: 4,
            ..Default::default()
        };
        cpu.wait_ns[1] = 3;
        let mut child = WorkerCounters {
            exit_memory: Some(super::super::ExitMemoryPeaks {
                cgroup_peak_bytes: Some(7),
                largest_process_peak_bytes: Some(9),
            }),
            ..Default::default()
        };
        child.add_cpu(0, &cpu);
        child.add_cpu(1, &cpu);
        child.net.families[1].received_bytes = 100;
        let peer = probe_common::net::EndpointKey {
            cgroup_id: 7,
            addr: [10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            port: 9000,
            family: 2,
            reserved: 0,
        };
        child.endpoints = vec![super::super::endpoints::EndpointDelta {
            key: peer,
            stats: probe_common::net::EndpointStats {
                sent_bytes: 5,
                ..Default::default()
            },
        }];
        let mut other_child = child.clone();
        other_child.endpoints[0].key.cgroup_id = 8;
        let mut pod = WorkerCounters::default();
        pod.absorb(&child);
        pod.absorb(&other_child);
        assert_eq!(pod.endpoints.len(), 1, "one entry per remote endpoint");
        assert_eq!(pod.endpoints[0].stats.sent_bytes, 10);
        assert_eq!(pod.on_cpu_ns_per_cpu, vec![20, 20]);
        assert_eq!(pod.sched.user_tick_ns, 16);
        assert_eq!(pod.sched.wait_ns[1], 12);
        assert_eq!(pod.net.families[1].received_bytes, 200);
        let memory = pod.exit_memory.expect("memory");
        assert_eq!(memory.largest_process_peak_bytes, Some(9));
        assert_eq!(
            memory.cgroup_peak_bytes, None,
            "a child's memcg peak is not the pod's"
        );
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
        interval.fold(Level::Depth(3), |path| {
            (
                ids.get(path).copied().unwrap_or(0),
                std::sync::Arc::new(identify(path)),
            )
        });

        assert_eq!(interval.level, Some(Level::Depth(3)));
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
