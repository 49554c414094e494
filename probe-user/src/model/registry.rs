//! The worker registry: which cgroups are workers, what they are called, when they started,
//! and what is known of them between samples (memory, the kernel's user/system split).

use super::{
    CpuStatUsec, LifecycleEvent, MemoryReading, Sample,
    identity::{Identity, identify},
    selection::Selection,
};

/// What the agent knows of one worker.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerRecord {
    /// cgroup v2 id.
    pub cgroup_id: u64,
    /// Path relative to the cgroup2 mount.
    pub path: String,
    /// Name, kind and ids: read from the path, and from the container's runtime.
    pub identity: Identity,
    /// CLOCK_MONOTONIC ns when it was made, or first seen.
    pub started_at_monotonic_ns: u64,
    /// Whether `started_at_monotonic_ns` is when it was made (the kernel told us), rather than
    /// when the agent first saw it.
    pub start_observed: bool,
    /// Latest memory reading.
    pub memory: Option<MemoryReading>,
    /// Highest memory figure seen (peak of the source, or highest sampled RSS).
    pub memory_peak_bytes: u64,
    /// Latest `cpu.stat` of the cgroup.
    pub cpu_stat: Option<CpuStatUsec>,
}

impl WorkerRecord {
    fn new(
        cgroup_id: u64,
        path: &str,
        identity: Option<&Identity>,
        at_monotonic_ns: u64,
        observed: bool,
    ) -> Self {
        Self {
            cgroup_id,
            path: path.to_string(),
            identity: identity.cloned().unwrap_or_else(|| identify(path)),
            started_at_monotonic_ns: at_monotonic_ns,
            start_observed: observed,
            memory: None,
            memory_peak_bytes: 0,
            cpu_stat: None,
        }
    }

    /// Takes a later identity that its runtime named (a container whose runtime was asked
    /// before it knew the container).
    fn learn(&mut self, identity: &Identity) {
        if self.identity.wants_runtime_names() && !identity.wants_runtime_names() {
            self.identity = identity.clone();
        }
    }
}

/// Every selected worker alive (or just removed), by cgroup id.
#[derive(Debug)]
pub struct WorkerRegistry {
    records: crate::IdMap<WorkerRecord>,
    selection: Selection,
}

impl WorkerRegistry {
    /// An empty registry of the workers `selection` picks.
    pub fn new(selection: Selection) -> Self {
        Self {
            records: crate::IdMap::default(),
            selection,
        }
    }

    /// Whether a path is a selected worker.
    pub fn selects(&self, path: &str) -> bool {
        self.selection.matches(path)
    }

    /// Applies a cgroup made or removed. Returns the id of a removed, selected worker: its
    /// record stays until [`WorkerRegistry::remove`] takes it for the exit summary.
    pub fn apply(&mut self, event: &LifecycleEvent) -> Option<u64> {
        if !self
            .selection
            .matches_identity(&event.path, &event.identity)
        {
            return None;
        }
        if event.made {
            self.records.insert(
                event.cgroup_id,
                WorkerRecord::new(
                    event.cgroup_id,
                    &event.path,
                    Some(&event.identity),
                    event.at_monotonic_ns,
                    true,
                ),
            );
            None
        } else {
            let record = self.records.entry(event.cgroup_id).or_insert_with(|| {
                WorkerRecord::new(
                    event.cgroup_id,
                    &event.path,
                    Some(&event.identity),
                    event.at_monotonic_ns,
                    false,
                )
            });
            record.learn(&event.identity);
            Some(event.cgroup_id)
        }
    }

    /// Registers the selected workers a sample shows that were made before the agent
    /// started, and keeps their latest `cpu.stat`.
    pub fn observe(&mut self, sample: &Sample) {
        let now_ns = sample.taken_at.map_or(0, |at| at.monotonic_ns);
        for (&cgroup_id, worker) in &sample.workers {
            let Some(path) = &worker.path else { continue };
            let selected = match worker.identity.as_deref() {
                Some(identity) => self.selection.matches_identity(path, identity),
                None => self.selection.matches(path),
            };
            if !selected {
                continue;
            }
            let identity = worker.identity.as_deref();
            let record = self
                .records
                .entry(cgroup_id)
                .or_insert_with(|| WorkerRecord::new(cgroup_id, path, identity, now_ns, false));
            if let Some(identity) = identity {
                record.learn(identity);
            }
            if worker.cpu_stat.is_some() {
                record.cpu_stat = worker.cpu_stat;
            }
        }
    }

    /// Notes a memory reading of a worker.
    pub fn record_memory(&mut self, cgroup_id: u64, reading: MemoryReading) {
        if let Some(record) = self.records.get_mut(&cgroup_id) {
            record.memory_peak_bytes = record.memory_peak_bytes.max(reading.peak_bytes);
            record.memory = Some(reading);
        }
    }

    /// Takes a worker's record out (it was removed).
    pub fn remove(&mut self, cgroup_id: u64) -> Option<WorkerRecord> {
        self.records.remove(&cgroup_id)
    }

    /// A worker's record.
    pub fn get(&self, cgroup_id: u64) -> Option<&WorkerRecord> {
        self.records.get(&cgroup_id)
    }

    /// Every record, in no particular order.
    pub fn records(&self) -> impl Iterator<Item = &WorkerRecord> {
        self.records.values()
    }

    /// How many workers are registered.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{MemorySource, WorkerCounters};

    fn event(id: u64, made: bool, path: &str, at: u64) -> LifecycleEvent {
        LifecycleEvent {
            identity: std::sync::Arc::new(identify(path)),
            cgroup_id: id,
            at_monotonic_ns: at,
            made,
            path: path.into(),
        }
    }

    #[test]
    fn made_then_removed_gives_its_id_once_selected() {
        let selection = Selection::new(&["/jobs/*".to_string()]).expect("pattern");
        let mut registry = WorkerRegistry::new(selection);
        assert_eq!(registry.apply(&event(5, true, "/jobs/a", 100)), None);
        assert_eq!(registry.apply(&event(6, true, "/other", 100)), None);
        assert_eq!(registry.len(), 1);
        registry.record_memory(
            5,
            MemoryReading {
                current_bytes: 10,
                peak_bytes: 30,
                source: MemorySource::Rss,
            },
        );
        registry.record_memory(
            5,
            MemoryReading {
                current_bytes: 20,
                peak_bytes: 20,
                source: MemorySource::Rss,
            },
        );
        assert_eq!(registry.apply(&event(5, false, "/jobs/a", 900)), Some(5));
        assert_eq!(registry.apply(&event(6, false, "/other", 900)), None);
        let record = registry.remove(5).expect("record");
        assert!(record.start_observed);
        assert_eq!(record.started_at_monotonic_ns, 100);
        assert_eq!(record.memory_peak_bytes, 30);
        assert!(registry.is_empty());
    }

    #[test]
    fn workers_from_before_the_agent_are_first_seen() {
        let mut registry = WorkerRegistry::new(Selection::all());
        let mut sample = Sample {
            taken_at: Some(crate::clock::Timestamp {
                monotonic_ns: 42,
                wall_unix_ns: 0,
            }),
            ..Sample::default()
        };
        sample.workers.insert(
            9,
            WorkerCounters {
                path: Some("/system.slice/nginx.service".into()),
                ..WorkerCounters::default()
            },
        );
        registry.observe(&sample);
        let record = registry.get(9).expect("registered");
        assert!(!record.start_observed);
        assert_eq!(record.started_at_monotonic_ns, 42);
        assert_eq!(record.identity.name, "nginx");
    }
}
