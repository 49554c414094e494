//! The one warning an agent gives when a kernel map starts losing numbers.
//!
//! Drops are always counted and exported (JSON `drops`, `workerprobe_map_drops_total`, the
//! `top` header); this adds one line on stderr the first time any counter rises, so an
//! operator learns it without reading the numbers. Pure: it sees only drop counters.

use probe_common::drops::DROP_NAMES;

use crate::model::Drops;

/// Says, once per agent run, that a drop counter has risen above its value at start.
#[derive(Clone, Debug)]
pub struct DropWarning {
    /// Counter values at start (the agent's own maps start at zero).
    baseline: Vec<u64>,
    /// The capacity the maps were loaded with (`--max-workers`).
    max_workers: u32,
    /// Whether the warning has been given.
    given: bool,
}

impl DropWarning {
    /// A warning for maps loaded with `max_workers` entries, whose counters start at zero.
    pub fn new(max_workers: u32) -> Self {
        Self {
            baseline: Vec::new(),
            max_workers,
            given: false,
        }
    }

    /// Counts from `start` on: drops before it do not warn.
    pub fn with_baseline(mut self, start: &Drops) -> Self {
        self.baseline = start.by_map.clone();
        self
    }

    /// The capacity named in the message.
    pub fn set_max_workers(&mut self, max_workers: u32) {
        self.max_workers = max_workers;
    }

    /// The warning line, the first time a counter in `drops` is above its baseline; `None`
    /// before that and ever after. When several rose at once, the first in
    /// [`DROP_NAMES`] order is named (the counters tell the rest).
    pub fn check(&mut self, drops: &Drops) -> Option<String> {
        if self.given {
            return None;
        }
        let slot = drops
            .by_map
            .iter()
            .enumerate()
            .find(|&(slot, &now)| now > self.baseline.get(slot).copied().unwrap_or(0))
            .map(|(slot, _)| slot)?;
        self.given = true;
        Some(message(slot, self.max_workers))
    }
}

/// Writes `line` on stderr, best effort: a closed stderr must not bring the agent down
/// (`eprintln!` would panic).
pub fn tell(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// The text for drop slot `slot`.
fn message(slot: usize, max_workers: u32) -> String {
    let name = DROP_NAMES.get(slot).copied().unwrap_or("a map");
    let advice = match slot {
        0 => format!(
            "new workers' CPU time is not counted until a removed worker frees its entry; raise --max-workers (now {max_workers})"
        ),
        1 => format!(
            "new workers' socket bytes are not counted until a removed worker frees its entry; raise --max-workers (now {max_workers})"
        ),
        2 => format!(
            "some threads' CPU slices are not counted (per-thread kernel storage could not be made or was in use; --max-workers, now {max_workers}, does not size it)"
        ),
        3 => "exit summaries may be missing; read the agent's output faster".to_string(),
        7 => "process summaries may be missing or incomplete; read the agent's output faster"
            .to_string(),
        8 => format!(
            "some removed workers' summaries lack their CPU time (too many removals waited to be summarised); raise --max-workers (now {max_workers})"
        ),
        9 => format!(
            "the CPU time of workers beyond its room is not shown until removed workers free their entries; raise --max-workers (now {max_workers})"
        ),
        10 => format!(
            "the memory of workers beyond its room is read from their files instead (the same numbers, more of the agent's CPU); raise --max-workers (now {max_workers})"
        ),
        _ => format!("some numbers are not counted; raise --max-workers (now {max_workers})"),
    };
    format!("workerprobe: warning: {name} is full or busy: {advice}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drops(by_map: &[u64]) -> Drops {
        Drops {
            by_map: by_map.to_vec(),
        }
    }

    #[test]
    fn silent_while_no_counter_rises() {
        let mut warning = DropWarning::new(8);
        assert_eq!(warning.check(&drops(&[0, 0, 0, 0])), None);
        assert_eq!(warning.check(&drops(&[])), None);
        let mut warning = DropWarning::new(8).with_baseline(&drops(&[5, 0, 2, 0]));
        assert_eq!(warning.check(&drops(&[5, 0, 2, 0])), None);
    }

    #[test]
    fn warns_once_naming_the_map_and_capacity() {
        let mut warning = DropWarning::new(8);
        assert_eq!(warning.check(&drops(&[0, 0, 0, 0])), None);
        let line = warning.check(&drops(&[3, 0, 0, 0])).expect("a warning");
        assert_eq!(
            line,
            "workerprobe: warning: cpu_stats is full or busy: new workers' CPU time is not counted until a removed worker frees its entry; raise --max-workers (now 8)"
        );
        // Never again, whatever rises later.
        assert_eq!(warning.check(&drops(&[9, 0, 0, 0])), None);
        assert_eq!(warning.check(&drops(&[9, 4, 1, 1])), None);
    }

    #[test]
    fn counts_from_the_baseline() {
        let mut warning = DropWarning::new(16_384).with_baseline(&drops(&[0, 7, 0, 0]));
        assert_eq!(warning.check(&drops(&[0, 7, 0, 0])), None);
        let line = warning.check(&drops(&[0, 8, 0, 0])).expect("a warning");
        assert!(line.starts_with("workerprobe: warning: net_stats is full or busy: "));
        assert!(line.ends_with("raise --max-workers (now 16384)"));
    }

    #[test]
    fn each_map_has_its_own_text() {
        let line = |by_map: &[u64]| DropWarning::new(100).check(&drops(by_map)).unwrap();
        assert!(line(&[0, 0, 1, 0]).contains("task_state is full or busy: some threads'"));
        assert_eq!(
            line(&[0, 0, 0, 1]),
            "workerprobe: warning: cgroup_events is full or busy: exit summaries may be missing; read the agent's output faster"
        );
        // Several at once: the first is named.
        assert!(line(&[0, 2, 0, 1]).contains("net_stats is full"));
        let mut warning = DropWarning::new(4);
        warning.set_max_workers(64);
        assert!(warning.check(&drops(&[1])).unwrap().ends_with("(now 64)"));
    }
}
