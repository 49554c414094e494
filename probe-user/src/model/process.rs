//! Process workers: each process's totals when it ends, folded from its threads' final
//! counters, and process trees named by a rule on their command line (`--process`), each
//! summed when its last process ends.
//!
//! A process's CPU time is its threads' own `sum_exec_runtime`, read as each thread left its
//! last CPU: what wait4's rusage gives for the process itself (without the children it
//! waited for), split into user and system as the kernel splits it (tick-sampled shares of
//! the precise total).

use probe_common::wait::WAIT_REASONS;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use regex::Regex;
use serde::Serialize;

use super::endpoints::{EndpointDelta, add_stats};

/// How long a process waits, once its last thread has ended, before its summary: a thread
/// that ended just before it may still be leaving its CPU elsewhere.
pub const SETTLE: Duration = Duration::from_millis(100);

/// The built-in rule for Lithops' localhost backend (version 2): one runner per call,
/// started as `python localhost-runner-v2.py run_job …/jobs/<executor>-<job>/<call>.task`.
pub const LITHOPS_PRESET: &str = r"localhost-runner-v2\.py run_job \S*/jobs/(?P<executor>[^/ ]+)-(?P<job>[^/ -]+)/(?P<call>[^/ ]+)\.task";

/// What the process programs tell.
#[derive(Clone, Debug)]
pub enum ProcessEvent {
    /// A process was made.
    Forked {
        /// The new process.
        pid: u32,
        /// The process that made it.
        parent_pid: u32,
    },
    /// A process started a program.
    Execed {
        /// The process.
        pid: u32,
        /// Its command line, arguments separated by spaces (`None`: it could not be read).
        command: Option<String>,
    },
    /// A process's last thread began to exit (told only where the kernel does so before
    /// releasing the process's memory).
    Exiting {
        /// The process.
        pid: u32,
        /// Its resident set, bytes.
        rss_bytes: u64,
    },
    /// A thread's final counters.
    ThreadEnded(ThreadTotals),
}

/// One thread's final counters, as the kernel kept them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ThreadTotals {
    /// Thread id.
    pub tid: u32,
    /// Process id.
    pub pid: u32,
    /// wait() status: `code << 8`, or the signal number.
    pub exit_code: u32,
    /// The process's last thread: the process has ended.
    pub last_of_process: bool,
    /// cgroup v2 id it ended in.
    pub cgroup_id: u64,
    /// CLOCK_MONOTONIC ns at its start.
    pub started_ns: u64,
    /// CLOCK_MONOTONIC ns at its exit (0: not seen).
    pub exited_ns: u64,
    /// CPU time.
    pub runtime_ns: u64,
    /// Tick-sampled user time.
    pub utime_ns: u64,
    /// Tick-sampled system time.
    pub stime_ns: u64,
    /// Runnable, waiting for a CPU.
    pub run_delay_ns: u64,
    /// Voluntary context switches.
    pub voluntary_switches: u64,
    /// Involuntary context switches.
    pub involuntary_switches: u64,
    /// The process's largest resident set so far.
    pub max_rss_bytes: u64,
    /// Socket payload sent.
    pub sent_bytes: u64,
    /// Socket payload received.
    pub received_bytes: u64,
    /// Its sleeps by wait reason (`probe_common::wait::WAIT_*`), ns.
    pub wait_ns: [u64; WAIT_REASONS],
    /// Thread name.
    pub comm: String,
}

/// `--process NAME:REGEX` or a preset: processes whose command line matches start a named
/// tree, which the processes they make join.
#[derive(Clone, Debug)]
pub struct ProcessRule {
    /// The rule's name (`lithops` for the preset).
    pub name: String,
    /// Matched against the command line, arguments separated by spaces.
    pub pattern: Regex,
}

/// Parses `--process`: `lithops`, or `NAME:REGEX` with named captures as ids.
pub fn parse_rule(text: &str) -> Result<ProcessRule, String> {
    if text == "lithops" {
        return Ok(ProcessRule {
            name: "lithops".into(),
            pattern: Regex::new(LITHOPS_PRESET).expect("the preset is a valid pattern"),
        });
    }
    let Some((name, pattern)) = text.split_once(':') else {
        return Err(format!(
            "`{text}` is not a process rule: give NAME:REGEX (e.g. 'etl:python .*etl\\.py (?P<step>\\w+)') or the preset lithops"
        ));
    };
    let name_ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !name_ok {
        return Err(format!(
            "`{name}` is not a rule name: use up to 64 letters, digits, '-', '_' or '.'"
        ));
    }
    match Regex::new(pattern) {
        Ok(pattern) => {
            // Captures become ids, and label names in Prometheus.
            let label_like = |capture: &str| {
                let mut chars = capture.chars();
                chars
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            };
            if let Some(bad) = pattern
                .capture_names()
                .flatten()
                .find(|capture| !label_like(capture))
            {
                return Err(format!(
                    "`{bad}` is not a capture name workerprobe can use: use letters, digits and '_', starting with a letter"
                ));
            }
            Ok(ProcessRule {
                name: name.into(),
                pattern,
            })
        }
        Err(_) => Err(format!(
            "`{pattern}` is not a valid regular expression; check its brackets and escapes (Rust regex syntax, named captures as (?P<name>...))"
        )),
    }
}

impl ProcessRule {
    /// The captures as ids when `command` matches.
    fn ids(&self, command: &str) -> Option<BTreeMap<String, String>> {
        let captures = self.pattern.captures(command)?;
        Some(
            self.pattern
                .capture_names()
                .flatten()
                .filter_map(|name| {
                    captures
                        .name(name)
                        .map(|value| (name.to_string(), value.as_str().to_string()))
                })
                .collect(),
        )
    }
}

/// Counters summed over threads or processes.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ProcessCounters {
    /// CPU time, ns.
    pub cpu_ns: u64,
    /// Its user-mode share, ns.
    pub user_ns: u64,
    /// Its kernel-mode share, ns.
    pub system_ns: u64,
    /// Thread time runnable but waiting for a CPU, ns.
    pub run_queue_ns: u64,
    /// Thread time neither on a CPU nor waiting for one (asleep, blocked), ns.
    pub off_cpu_ns: u64,
    /// Voluntary context switches.
    pub voluntary_switches: u64,
    /// Involuntary context switches.
    pub involuntary_switches: u64,
    /// Socket payload sent, bytes.
    pub sent_bytes: u64,
    /// Socket payload received, bytes.
    pub received_bytes: u64,
    /// Threads that ended.
    pub threads: u64,
    /// Thread time asleep by what it waited on (`probe_common::wait::WAIT_NAMES`), ns: how
    /// `off_cpu_ns` divides (shown only where the wait reasons were measured).
    #[serde(skip)]
    pub wait_ns: [u64; WAIT_REASONS],
    #[serde(skip)]
    utime_ns: u64,
    #[serde(skip)]
    stime_ns: u64,
}

impl ProcessCounters {
    fn add_thread(&mut self, thread: &ThreadTotals) {
        self.cpu_ns += thread.runtime_ns;
        self.utime_ns += thread.utime_ns;
        self.stime_ns += thread.stime_ns;
        self.run_queue_ns += thread.run_delay_ns;
        if thread.exited_ns > thread.started_ns {
            let lived = thread.exited_ns - thread.started_ns;
            self.off_cpu_ns += lived.saturating_sub(thread.runtime_ns + thread.run_delay_ns);
        }
        self.voluntary_switches += thread.voluntary_switches;
        self.involuntary_switches += thread.involuntary_switches;
        self.sent_bytes += thread.sent_bytes;
        self.received_bytes += thread.received_bytes;
        for (sum, add) in self.wait_ns.iter_mut().zip(thread.wait_ns) {
            *sum += add;
        }
        self.threads += 1;
        self.split();
    }

    /// Adds a whole process, as the kernel adds a child's times to its parent's: its own
    /// user/system split, not a new split of summed samples.
    fn add(&mut self, other: &ProcessCounters) {
        self.cpu_ns += other.cpu_ns;
        self.user_ns += other.user_ns;
        self.system_ns += other.system_ns;
        self.utime_ns += other.utime_ns;
        self.stime_ns += other.stime_ns;
        self.run_queue_ns += other.run_queue_ns;
        self.off_cpu_ns += other.off_cpu_ns;
        self.voluntary_switches += other.voluntary_switches;
        self.involuntary_switches += other.involuntary_switches;
        self.sent_bytes += other.sent_bytes;
        self.received_bytes += other.received_bytes;
        for (sum, add) in self.wait_ns.iter_mut().zip(other.wait_ns) {
            *sum += add;
        }
        self.threads += other.threads;
    }

    /// User and system as the kernel's cputime_adjust makes them: the precise total, split in
    /// the proportion of the tick-sampled times. The kernel also keeps each split it has
    /// given (`prev_cputime`) so later ones never go back: a process whose times were read
    /// while it ran (/proc/PID/stat, times()) can have its rusage split shifted from this by
    /// up to what it ran before that read; the total is the same.
    fn split(&mut self) {
        let sampled = self.utime_ns + self.stime_ns;
        self.system_ns = match (self.utime_ns, self.stime_ns) {
            (_, 0) => 0,
            (0, _) => self.cpu_ns,
            _ => (u128::from(self.cpu_ns) * u128::from(self.stime_ns) / u128::from(sampled)) as u64,
        };
        self.user_ns = self.cpu_ns - self.system_ns;
    }
}

/// How a process ended, as wait() tells it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitStatus {
    /// It exited with this code.
    Code(u32),
    /// A signal ended it.
    Signal(u32),
}

impl ExitStatus {
    fn from_wait_status(status: u32) -> Self {
        match status & 0x7f {
            0 => Self::Code((status >> 8) & 0xff),
            signal => Self::Signal(signal),
        }
    }
}

/// The tree a process belongs to, by the rule that named it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TreeLabel {
    /// The rule's name.
    pub rule: String,
    /// The rule's captures.
    pub ids: BTreeMap<String, String>,
    /// The process whose command line matched.
    pub root_pid: u32,
}

/// What the programs kept of an ended process beside its threads' ends.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessKept {
    /// Its CPU time on each CPU as the switch programs added it up (empty: none kept).
    pub cpu_ns_per_cpu: Vec<u64>,
    /// Its socket peers (empty where endpoints are not measured or it moved no bytes).
    pub endpoints: Vec<EndpointDelta>,
}

/// One process that ended.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProcessSummary {
    /// Process id.
    pub pid: u32,
    /// The process that made it (0: unknown, made before the agent started and gone before
    /// it could be read).
    pub parent_pid: u32,
    /// Its command line (its program's, or its parent's if it never started one), when the
    /// agent saw it start or could still read it.
    pub command: Option<String>,
    /// Whether it started a program of its own (exec) while the agent watched.
    pub execed: bool,
    /// Its main thread's name.
    pub comm: String,
    /// cgroup v2 id it ended in.
    pub cgroup_id: u64,
    /// CLOCK_MONOTONIC ns at its start.
    pub started_ns: u64,
    /// CLOCK_MONOTONIC ns when its main thread exited.
    pub ended_ns: u64,
    /// How it ended.
    pub exit: ExitStatus,
    /// Its largest resident set, bytes (its own ru_maxrss).
    pub peak_rss_bytes: u64,
    /// Its resident set as it ended, bytes; `None` where the kernel does not tell it.
    pub end_rss_bytes: Option<u64>,
    /// Its threads' counters, summed.
    pub counters: ProcessCounters,
    /// Its CPU time on each CPU, ns: the switch programs' per-CPU slices, scaled to add up
    /// to `counters.cpu_ns` (empty when none were kept).
    pub cpu_ns_per_cpu: Vec<u64>,
    /// What it did with each socket peer (keys without its pid; empty where not measured).
    #[serde(skip)]
    pub endpoints: Vec<EndpointDelta>,
    /// The named tree it belongs to.
    pub tree: Option<TreeLabel>,
}

/// A named tree whose last process ended.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TreeSummary {
    /// The tracker's id of the tree (as [`LiveTree::id`]).
    #[serde(skip)]
    pub id: u64,
    /// The rule, its captures and the root process.
    pub label: TreeLabel,
    /// The root's command line.
    pub command: String,
    /// Processes in the tree.
    pub processes: u64,
    /// CLOCK_MONOTONIC ns when its root started.
    pub started_ns: u64,
    /// CLOCK_MONOTONIC ns when its last process ended.
    pub ended_ns: u64,
    /// Every process's counters, summed.
    pub counters: ProcessCounters,
    /// Its CPU time on each CPU, ns (its processes' summed).
    pub cpu_ns_per_cpu: Vec<u64>,
    /// Its processes' socket peers, summed by peer.
    #[serde(skip)]
    pub endpoints: Vec<EndpointDelta>,
    /// The largest resident set of any of its processes, bytes.
    pub peak_rss_bytes: u64,
    /// The root's own summary.
    pub root: Option<ProcessSummary>,
    /// Of the processes that ran what their parent ran (forked, no exec of their own), the
    /// one that used the most CPU: in a framework that forks a process per task (Lithops'
    /// runner), the process that ran the task.
    pub busiest_fork: Option<ProcessSummary>,
}

/// A named tree while it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveTree {
    /// The tracker's id of the tree (its summary ends it).
    pub id: u64,
    /// The rule, its captures and the root process.
    pub label: TreeLabel,
    /// Processes in it so far, ended and running.
    pub processes: u64,
    /// Its CPU time so far, ns.
    pub cpu_ns: u64,
    /// Socket payload its processes sent so far, bytes.
    pub sent_bytes: u64,
    /// Socket payload its processes received so far, bytes.
    pub received_bytes: u64,
}

/// One named tree's series in an exposition.
#[derive(Clone, Debug, PartialEq)]
pub struct TreeSeries {
    /// The rule, its captures and the root process.
    pub label: TreeLabel,
    /// Processes in it so far.
    pub processes: u64,
    /// CPU time so far, ns; never lower than an earlier exposition's.
    pub cpu_ns: u64,
    /// Socket payload sent so far, bytes; never lower than an earlier exposition's.
    pub sent_bytes: u64,
    /// Socket payload received so far, bytes; never lower than an earlier exposition's.
    pub received_bytes: u64,
    /// Whether it still runs.
    pub running: bool,
}

/// Named trees for an exposition: running ones as they run, ended ones with their final
/// figures for a grace period, then gone (bounded like the workers' series).
#[derive(Debug)]
pub struct TreeSeriesBook {
    grace: Duration,
    running: HashMap<u64, TreeSeries>,
    ended: VecDeque<(Instant, TreeSeries)>,
}

impl TreeSeriesBook {
    /// Ended trees stay `grace`.
    pub fn new(grace: Duration) -> Self {
        Self {
            grace,
            running: HashMap::new(),
            ended: VecDeque::new(),
        }
    }

    /// Takes the running trees as read now (a tree not among them has ended or is ending).
    pub fn observe(&mut self, live: Vec<LiveTree>) {
        let mut running = HashMap::with_capacity(live.len());
        for tree in live {
            let before = self.running.get(&tree.id);
            let at_least = |now: u64, then: fn(&TreeSeries) -> u64| now.max(before.map_or(0, then));
            running.insert(
                tree.id,
                TreeSeries {
                    // A process ending between two reads can be briefly in neither part.
                    cpu_ns: at_least(tree.cpu_ns, |s| s.cpu_ns),
                    sent_bytes: at_least(tree.sent_bytes, |s| s.sent_bytes),
                    received_bytes: at_least(tree.received_bytes, |s| s.received_bytes),
                    label: tree.label,
                    processes: tree.processes,
                    running: true,
                },
            );
        }
        self.running = running;
    }

    /// A tree ended at `now` with these final figures.
    pub fn ended(&mut self, tree: &TreeSummary, now: Instant) {
        let before = self.running.remove(&tree.id);
        let at_least =
            |now: u64, then: fn(&TreeSeries) -> u64| now.max(before.as_ref().map_or(0, then));
        self.ended.push_back((
            now + self.grace,
            TreeSeries {
                label: tree.label.clone(),
                processes: tree.processes,
                cpu_ns: at_least(tree.counters.cpu_ns, |s| s.cpu_ns),
                sent_bytes: at_least(tree.counters.sent_bytes, |s| s.sent_bytes),
                received_bytes: at_least(tree.counters.received_bytes, |s| s.received_bytes),
                running: false,
            },
        ));
    }

    /// Drops ended trees past their grace period; true if any went.
    pub fn expire(&mut self, now: Instant) -> bool {
        let before = self.ended.len();
        while self.ended.front().is_some_and(|(until, _)| *until <= now) {
            self.ended.pop_front();
        }
        self.ended.len() != before
    }

    /// Every series to expose.
    pub fn series(&self) -> Vec<TreeSeries> {
        self.running
            .values()
            .cloned()
            .chain(self.ended.iter().map(|(_, series)| series.clone()))
            .collect()
    }
}

/// What ended.
#[derive(Clone, Debug, PartialEq)]
#[allow(clippy::large_enum_variant)] // processes are the common case: not boxed
pub enum ProcessEnd {
    /// A process.
    Process(ProcessSummary),
    /// A named tree.
    Tree(Box<TreeSummary>),
}

#[derive(Debug, Default)]
struct Process {
    parent_pid: u32,
    command: Option<String>,
    /// It started a program of its own (else it runs what its parent ran).
    execed: bool,
    /// Found running when the agent started (from /proc), not told by a fork.
    adopted: bool,
    tree: Option<u64>,
    counters: ProcessCounters,
    main: Option<ThreadTotals>,
    /// The thread that ended last: its exit status and peak are the process's.
    last: Option<ThreadTotals>,
    /// Its resident set as its last thread began to exit.
    end_rss_bytes: Option<u64>,
}

#[derive(Debug)]
struct Tree {
    label: TreeLabel,
    command: String,
    live: u64,
    processes: u64,
    started_ns: u64,
    ended_ns: u64,
    counters: ProcessCounters,
    cpu_ns_per_cpu: Vec<u64>,
    endpoints: Vec<EndpointDelta>,
    peak_rss_bytes: u64,
    root: Option<ProcessSummary>,
    busiest_fork: Option<ProcessSummary>,
}

/// Most processes tracked at once (about 300 bytes each); past it new ones are not tracked
/// (counted in [`ProcessTracker::refused`]).
const MAX_PROCESSES: usize = 1 << 18;
/// Most named trees at once; past it no new tree is started.
const MAX_TREES: usize = 1 << 16;
/// How long a summarised process's pid is remembered, so a thread of it told too late is
/// dropped rather than summarised again.
const ENDED_KEPT: Duration = Duration::from_secs(2);

/// Folds process events into process and tree summaries.
pub struct ProcessTracker {
    rules: Vec<ProcessRule>,
    processes: HashMap<u32, Process>,
    trees: HashMap<u64, Tree>,
    next_tree: u64,
    /// Processes whose last thread ended, due for their summary.
    ending: VecDeque<(Instant, u32)>,
    /// Processes summarised in the last [`ENDED_KEPT`], oldest first.
    ended_order: VecDeque<(Instant, u32)>,
    ended: std::collections::HashSet<u32>,
    /// Processes not tracked because [`MAX_PROCESSES`] were.
    pub refused: u64,
}

impl ProcessTracker {
    /// A tracker naming trees by `rules`.
    pub fn new(rules: Vec<ProcessRule>) -> Self {
        Self {
            rules,
            processes: HashMap::new(),
            trees: HashMap::new(),
            next_tree: 0,
            ending: VecDeque::new(),
            ended_order: VecDeque::new(),
            ended: std::collections::HashSet::new(),
            refused: 0,
        }
    }

    /// Takes one event at `now`; `command_of` reads a live process's command line, for those
    /// made before the agent started.
    pub fn apply(
        &mut self,
        event: ProcessEvent,
        now: Instant,
        command_of: &dyn Fn(u32) -> Option<String>,
    ) {
        match event {
            ProcessEvent::Forked { pid, parent_pid } => {
                if self
                    .processes
                    .get(&pid)
                    .is_some_and(|process| process.adopted && process.last.is_none())
                {
                    // Told before the agent read /proc, which found it already: as it is.
                    return;
                }
                if self.processes.len() >= MAX_PROCESSES {
                    self.refused += 1;
                    return;
                }
                self.known(parent_pid, command_of);
                let (command, tree) = self
                    .processes
                    .get(&parent_pid)
                    .map(|parent| (parent.command.clone(), parent.tree))
                    .unwrap_or_default();
                if let Some(tree) = tree.and_then(|id| self.trees.get_mut(&id)) {
                    tree.live += 1;
                }
                // The pid is used again: its threads are this process's.
                self.ended.remove(&pid);
                self.processes.insert(
                    pid,
                    Process {
                        parent_pid,
                        command,
                        tree,
                        ..Process::default()
                    },
                );
            }
            ProcessEvent::Execed { pid, command } => {
                let process = self.processes.entry(pid).or_default();
                process.execed = true;
                // An unreadable command line keeps the one it had.
                if let Some(command) = command {
                    process.command = Some(command.clone());
                    if process.tree.is_none() {
                        self.start_tree(pid, &command);
                    }
                }
            }
            ProcessEvent::Exiting { pid, rss_bytes } => {
                if !self.ended.contains(&pid) {
                    self.processes.entry(pid).or_default().end_rss_bytes = Some(rss_bytes);
                }
            }
            ProcessEvent::ThreadEnded(thread) => {
                let pid = thread.pid;
                self.forget_ended(now);
                if self.ended.contains(&pid) {
                    return; // a thread of a process already summarised, too late
                }
                let process = self.processes.entry(pid).or_default();
                process.counters.add_thread(&thread);
                // The main thread names the process; it may end before the others.
                if thread.tid == thread.pid || process.main.is_none() {
                    process.main = Some(thread.clone());
                }
                if thread.last_of_process {
                    process.last = Some(thread);
                    self.ending.push_back((now + SETTLE, pid));
                }
            }
        }
    }

    /// Takes in the processes running when the agent started, as (pid, parent pid, command
    /// line): those a rule names start their trees, with every descendant in them. A process
    /// already known is left as it is.
    pub fn adopt_running(&mut self, running: &[(u32, u32, Option<String>)]) {
        let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
        for &(pid, parent_pid, _) in running {
            children.entry(parent_pid).or_default().push(pid);
        }
        for (pid, parent_pid, command) in running {
            if self.processes.len() >= MAX_PROCESSES {
                return;
            }
            self.processes.entry(*pid).or_insert_with(|| Process {
                parent_pid: *parent_pid,
                command: command.clone(),
                adopted: true,
                ..Process::default()
            });
        }
        let named = |command: &Option<String>| {
            command
                .as_deref()
                .is_some_and(|command| self.rules.iter().any(|rule| rule.pattern.is_match(command)))
        };
        let parent_of: HashMap<u32, (u32, bool)> = running
            .iter()
            .map(|(pid, parent_pid, command)| (*pid, (*parent_pid, named(command))))
            .collect();
        // A named process inside another named one's tree is not a tree of its own.
        let named_ancestor = |mut pid: u32| {
            for _ in 0..running.len() {
                let Some(&(parent, _)) = parent_of.get(&pid) else {
                    return false;
                };
                match parent_of.get(&parent) {
                    Some(&(_, true)) => return true,
                    Some(_) if parent != pid => pid = parent,
                    _ => return false,
                }
            }
            false
        };
        for (pid, _, command) in running {
            let Some(command) = command else {
                continue;
            };
            if self
                .processes
                .get(pid)
                .is_none_or(|process| process.tree.is_some())
                || named_ancestor(*pid)
            {
                continue;
            }
            self.start_tree(*pid, command);
            let Some(tree) = self.processes.get(pid).and_then(|process| process.tree) else {
                continue;
            };
            // Its descendants join, depth first.
            let mut pending = children.get(pid).cloned().unwrap_or_default();
            while let Some(child) = pending.pop() {
                let Some(process) = self.processes.get_mut(&child) else {
                    continue;
                };
                if process.tree.is_some() {
                    continue;
                }
                process.tree = Some(tree);
                if let Some(tree) = self.trees.get_mut(&tree) {
                    tree.live += 1;
                }
                pending.extend(children.get(&child).cloned().unwrap_or_default());
            }
        }
    }

    /// Summaries due by `now`: each ended process, and each named tree whose last process
    /// ended (after its processes' own summaries).
    /// `kept_of` takes what the programs kept of a process, given whether it moved bytes.
    pub fn take_due(
        &mut self,
        now: Instant,
        kept_of: &mut dyn FnMut(u32, bool) -> ProcessKept,
    ) -> Vec<ProcessEnd> {
        let mut ends = Vec::new();
        while let Some(&(due, pid)) = self.ending.front() {
            if due > now {
                break;
            }
            self.ending.pop_front();
            let Some(process) = self.processes.remove(&pid) else {
                continue;
            };
            self.ended.insert(pid);
            self.ended_order.push_back((now, pid));
            let (Some(main), Some(last)) = (process.main, process.last) else {
                continue;
            };
            let tree_label = process
                .tree
                .and_then(|id| self.trees.get(&id))
                .map(|tree| tree.label.clone());
            let moved_bytes = process.counters.sent_bytes + process.counters.received_bytes > 0;
            let kept = kept_of(pid, moved_bytes);
            let summary = ProcessSummary {
                pid,
                parent_pid: process.parent_pid,
                command: process.command,
                execed: process.execed,
                comm: main.comm.clone(),
                cgroup_id: main.cgroup_id,
                started_ns: main.started_ns,
                ended_ns: last.exited_ns,
                exit: ExitStatus::from_wait_status(last.exit_code),
                peak_rss_bytes: last.max_rss_bytes,
                end_rss_bytes: process.end_rss_bytes,
                cpu_ns_per_cpu: scaled_to(kept.cpu_ns_per_cpu, process.counters.cpu_ns),
                endpoints: kept
                    .endpoints
                    .into_iter()
                    .map(|mut endpoint| {
                        endpoint.key.cgroup_id = 0;
                        endpoint
                    })
                    .collect(),
                counters: process.counters,
                tree: tree_label,
            };
            ends.push(ProcessEnd::Process(summary.clone()));
            let Some(tree_id) = process.tree else {
                continue;
            };
            let Some(tree) = self.trees.get_mut(&tree_id) else {
                continue;
            };
            tree.counters.add(&summary.counters);
            if tree.cpu_ns_per_cpu.len() < summary.cpu_ns_per_cpu.len() {
                tree.cpu_ns_per_cpu.resize(summary.cpu_ns_per_cpu.len(), 0);
            }
            for (sum, cpu_ns) in tree.cpu_ns_per_cpu.iter_mut().zip(&summary.cpu_ns_per_cpu) {
                *sum += cpu_ns;
            }
            for endpoint in &summary.endpoints {
                match tree.endpoints.iter_mut().find(|e| e.key == endpoint.key) {
                    Some(sum) => add_stats(&mut sum.stats, &endpoint.stats),
                    None => tree.endpoints.push(endpoint.clone()),
                }
            }
            tree.processes += 1;
            tree.peak_rss_bytes = tree.peak_rss_bytes.max(summary.peak_rss_bytes);
            tree.ended_ns = tree.ended_ns.max(summary.ended_ns);
            if summary.pid == tree.label.root_pid {
                tree.started_ns = summary.started_ns;
                tree.root = Some(summary);
            } else if !summary.execed
                && tree
                    .busiest_fork
                    .as_ref()
                    .is_none_or(|busiest| busiest.counters.cpu_ns < summary.counters.cpu_ns)
            {
                tree.busiest_fork = Some(summary);
            }
            tree.live = tree.live.saturating_sub(1);
            if tree.live == 0
                && let Some(tree) = self.trees.remove(&tree_id)
            {
                ends.push(ProcessEnd::Tree(Box::new(TreeSummary {
                    id: tree_id,
                    label: tree.label,
                    command: tree.command,
                    processes: tree.processes,
                    started_ns: tree.started_ns,
                    ended_ns: tree.ended_ns,
                    counters: tree.counters,
                    cpu_ns_per_cpu: tree.cpu_ns_per_cpu,
                    endpoints: tree.endpoints,
                    peak_rss_bytes: tree.peak_rss_bytes,
                    root: tree.root,
                    busiest_fork: tree.busiest_fork,
                })));
            }
        }
        ends
    }

    /// Every named tree still running, with its CPU and bytes so far: its ended processes'
    /// final counters, and for each live process its ended threads' CPU plus what
    /// `live_runtime_ns` reads of its running threads (given the pid and whether its main
    /// thread has ended, so a main thread waiting to be reaped is not counted twice), and
    /// what `live_bytes` reads of its bytes so far (all its threads; `None` if none yet).
    pub fn live_trees(
        &self,
        live_runtime_ns: &dyn Fn(u32, bool) -> u64,
        live_bytes: &dyn Fn(u32) -> Option<(u64, u64)>,
    ) -> Vec<LiveTree> {
        #[derive(Default)]
        struct SoFar {
            processes: u64,
            cpu_ns: u64,
            sent_bytes: u64,
            received_bytes: u64,
        }
        let mut live: HashMap<u64, SoFar> = HashMap::new();
        for (&pid, process) in &self.processes {
            let Some(tree) = process.tree else {
                continue;
            };
            let entry = live.entry(tree).or_default();
            entry.processes += 1;
            let ended = process.last.is_some();
            // Ended, its summary on its way into the tree: its final counters.
            let (sent, received) = match live_bytes(pid) {
                Some((sent, received)) if !ended => (
                    sent.max(process.counters.sent_bytes),
                    received.max(process.counters.received_bytes),
                ),
                _ => (process.counters.sent_bytes, process.counters.received_bytes),
            };
            entry.sent_bytes += sent;
            entry.received_bytes += received;
            entry.cpu_ns += process.counters.cpu_ns;
            if !ended {
                let main_ended = process.main.as_ref().is_some_and(|main| main.tid == pid);
                entry.cpu_ns += live_runtime_ns(pid, main_ended);
            }
        }
        self.trees
            .iter()
            .map(|(id, tree)| {
                let so_far = live.remove(id).unwrap_or_default();
                LiveTree {
                    id: *id,
                    label: tree.label.clone(),
                    processes: tree.processes + so_far.processes,
                    cpu_ns: tree.counters.cpu_ns + so_far.cpu_ns,
                    sent_bytes: tree.counters.sent_bytes + so_far.sent_bytes,
                    received_bytes: tree.counters.received_bytes + so_far.received_bytes,
                }
            })
            .collect()
    }

    /// Forgets the pids summarised more than [`ENDED_KEPT`] ago (a pid may be used again).
    fn forget_ended(&mut self, now: Instant) {
        while let Some(&(at, pid)) = self.ended_order.front() {
            if now.duration_since(at) < ENDED_KEPT {
                break;
            }
            self.ended_order.pop_front();
            self.ended.remove(&pid);
        }
    }

    /// True while ended processes wait out [`SETTLE`].
    pub fn settling(&self) -> bool {
        !self.ending.is_empty()
    }

    /// Makes sure a process made before the agent started is known, with its command line,
    /// and starts its tree if a rule names it.
    fn known(&mut self, pid: u32, command_of: &dyn Fn(u32) -> Option<String>) {
        if pid == 0 || self.processes.contains_key(&pid) {
            return;
        }
        let command = command_of(pid);
        self.processes.insert(
            pid,
            Process {
                command: command.clone(),
                ..Process::default()
            },
        );
        if let Some(command) = command {
            self.start_tree(pid, &command);
        }
    }

    /// Starts a tree rooted at `pid` if a rule matches its command line.
    fn start_tree(&mut self, pid: u32, command: &str) {
        if self.trees.len() >= MAX_TREES {
            return;
        }
        let Some((rule, ids)) = self
            .rules
            .iter()
            .find_map(|rule| rule.ids(command).map(|ids| (rule.name.clone(), ids)))
        else {
            return;
        };
        let id = self.next_tree;
        self.next_tree += 1;
        self.trees.insert(
            id,
            Tree {
                label: TreeLabel {
                    rule,
                    ids,
                    root_pid: pid,
                },
                command: command.to_string(),
                live: 1,
                processes: 0,
                started_ns: 0,
                ended_ns: 0,
                counters: ProcessCounters::default(),
                cpu_ns_per_cpu: Vec::new(),
                endpoints: Vec::new(),
                peak_rss_bytes: 0,
                root: None,
                busiest_fork: None,
            },
        );
        if let Some(process) = self.processes.get_mut(&pid) {
            process.tree = Some(id);
        }
    }
}

/// `per_cpu` scaled to add up to `total_ns` (the exact total; the per-CPU slices miss a
/// thread's slices before the agent saw it run), the rounding left on the busiest CPU.
fn scaled_to(per_cpu: Vec<u64>, total_ns: u64) -> Vec<u64> {
    let sum: u128 = per_cpu.iter().map(|&ns| u128::from(ns)).sum();
    if sum == 0 {
        return Vec::new();
    }
    let mut scaled: Vec<u64> = per_cpu
        .iter()
        .map(|&ns| (u128::from(ns) * u128::from(total_ns) / sum) as u64)
        .collect();
    let rest = total_ns - scaled.iter().sum::<u64>();
    if let Some(busiest) = (0..scaled.len()).max_by_key(|&cpu| per_cpu[cpu]) {
        scaled[busiest] += rest;
    }
    scaled
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept_cpu(cpu_ns_per_cpu: Vec<u64>) -> ProcessKept {
        ProcessKept {
            cpu_ns_per_cpu,
            ..ProcessKept::default()
        }
    }

    fn thread(tid: u32, pid: u32, runtime_ns: u64, utime_ns: u64, stime_ns: u64) -> ThreadTotals {
        ThreadTotals {
            tid,
            pid,
            started_ns: 1_000,
            exited_ns: 1_000 + 10 * runtime_ns,
            runtime_ns,
            utime_ns,
            stime_ns,
            run_delay_ns: runtime_ns,
            last_of_process: tid == pid,
            comm: format!("t{tid}"),
            ..ThreadTotals::default()
        }
    }

    fn no_command(_: u32) -> Option<String> {
        None
    }

    #[test]
    fn a_process_sums_its_threads_and_splits_user_and_system_like_the_kernel() {
        let mut tracker = ProcessTracker::new(Vec::new());
        let now = Instant::now();
        tracker.apply(
            ProcessEvent::Forked {
                pid: 10,
                parent_pid: 1,
            },
            now,
            &no_command,
        );
        tracker.apply(
            ProcessEvent::ThreadEnded(thread(11, 10, 300, 2, 1)),
            now,
            &no_command,
        );
        tracker.apply(
            ProcessEvent::ThreadEnded(ThreadTotals {
                exit_code: 3 << 8,
                ..thread(10, 10, 600, 4, 2)
            }),
            now,
            &no_command,
        );
        assert!(
            tracker
                .take_due(now, &mut |_, _| ProcessKept::default())
                .is_empty(),
            "not before it settles"
        );
        let ends = tracker.take_due(now + SETTLE, &mut |_, _| kept_cpu(vec![1, 3]));
        let [ProcessEnd::Process(summary)] = ends.as_slice() else {
            panic!("{ends:?}");
        };
        assert_eq!(summary.parent_pid, 1);
        assert_eq!(summary.exit, ExitStatus::Code(3));
        assert_eq!(summary.counters.cpu_ns, 900);
        assert_eq!(summary.counters.threads, 2);
        // Sampled 6 user : 3 system of a precise 900.
        assert_eq!(
            (summary.counters.user_ns, summary.counters.system_ns),
            (600, 300)
        );
        assert_eq!(summary.counters.run_queue_ns, 900);
        // Lived 10× their runtime: the rest of the life was off the CPU.
        assert_eq!(summary.counters.off_cpu_ns, 3000 - 600 + 6000 - 1200);
        assert_eq!(summary.comm, "t10");
        // Slices kept 1:3, scaled to the exact 900.
        assert_eq!(summary.cpu_ns_per_cpu, [225, 675]);
        assert!(!tracker.settling());
    }

    #[test]
    fn a_live_tree_adds_its_running_processes_to_its_ended_ones() {
        let rule = parse_rule("job:job (?P<n>\\d+)").unwrap();
        let mut tracker = ProcessTracker::new(vec![rule]);
        let now = Instant::now();
        let exec = |pid: u32| ProcessEvent::Execed {
            pid,
            command: Some("job 7".into()),
        };
        tracker.apply(exec(30), now, &no_command);
        for child in [31, 32] {
            tracker.apply(
                ProcessEvent::Forked {
                    pid: child,
                    parent_pid: 30,
                },
                now,
                &no_command,
            );
        }
        tracker.apply(
            ProcessEvent::ThreadEnded(ThreadTotals {
                received_bytes: 40,
                ..thread(31, 31, 100, 1, 0)
            }),
            now,
            &no_command,
        );
        let _ = tracker.take_due(now + SETTLE, &mut |_, _| kept_cpu(vec![1, 3]));
        // Running: 30 (its threads read 1,000) and 32 (2,000); 31 ended with 100.
        let read = |pid: u32, _| if pid == 30 { 1_000 } else { 2_000 };
        // Bytes so far: 30 received 500 and sent 7; 32 none yet; 31's map entry is gone.
        let bytes = |pid: u32| (pid == 30).then_some((7, 500));
        let trees = tracker.live_trees(&read, &bytes);
        assert_eq!(trees.len(), 1);
        assert_eq!(trees[0].processes, 3);
        assert_eq!(trees[0].cpu_ns, 3_100);
        assert_eq!(trees[0].received_bytes, 540);
        assert_eq!(trees[0].sent_bytes, 7);
        assert_eq!(trees[0].label.ids["n"], "7");
    }

    #[test]
    fn a_tree_running_before_the_agent_is_adopted_with_its_descendants() {
        let rule = parse_rule("job:job (?P<n>\\d+)").unwrap();
        let mut tracker = ProcessTracker::new(vec![rule]);
        tracker.adopt_running(&[
            (1, 0, Some("init".into())),
            (40, 1, Some("job 9".into())),
            (41, 40, Some("job 9".into())),
            (42, 41, None),
            (50, 1, Some("other".into())),
        ]);
        let trees = tracker.live_trees(&|_, _| 10, &|_| None);
        assert_eq!(trees.len(), 1, "{trees:?}");
        assert_eq!(trees[0].label.root_pid, 40);
        assert_eq!(trees[0].processes, 3);
        assert_eq!(trees[0].cpu_ns, 30);
    }

    #[test]
    fn a_signal_is_told_apart_from_an_exit_code() {
        assert_eq!(ExitStatus::from_wait_status(9), ExitStatus::Signal(9));
        assert_eq!(ExitStatus::from_wait_status(0), ExitStatus::Code(0));
        assert_eq!(ExitStatus::from_wait_status(1 << 8), ExitStatus::Code(1));
    }

    #[test]
    fn a_named_tree_takes_in_what_its_processes_fork_and_ends_with_the_last() {
        let rule = parse_rule("lithops").unwrap();
        let mut tracker = ProcessTracker::new(vec![rule]);
        let now = Instant::now();
        let command = "/usr/bin/python3 /tmp/lithops-root/localhost-runner-v2.py run_job /tmp/lithops-root/jobs/a1b2c3-0-M000/00003.task";
        tracker.apply(
            ProcessEvent::Forked {
                pid: 20,
                parent_pid: 5,
            },
            now,
            &no_command,
        );
        tracker.apply(
            ProcessEvent::Execed {
                pid: 20,
                command: Some(command.into()),
            },
            now,
            &no_command,
        );
        tracker.apply(
            ProcessEvent::Forked {
                pid: 21,
                parent_pid: 20,
            },
            now,
            &no_command,
        );
        tracker.apply(
            ProcessEvent::Exiting {
                pid: 21,
                rss_bytes: 4096,
            },
            now,
            &no_command,
        );
        tracker.apply(
            ProcessEvent::ThreadEnded(thread(21, 21, 5_000, 1, 0)),
            now,
            &no_command,
        );
        // Both processes talked to one peer; the child to another as well (keys as kept,
        // holding the pid).
        let peer = |pid: u32, port: u16, received_bytes: u64| EndpointDelta {
            key: probe_common::net::EndpointKey {
                cgroup_id: u64::from(pid),
                port,
                family: probe_common::net::AF_INET,
                ..Default::default()
            },
            stats: probe_common::net::EndpointStats {
                received_bytes,
                ..Default::default()
            },
        };
        let mut kept_of = |pid: u32, _| ProcessKept {
            cpu_ns_per_cpu: vec![1, 3],
            endpoints: if pid == 21 {
                vec![peer(21, 80, 100), peer(21, 443, 7)]
            } else {
                vec![peer(20, 80, 20)]
            },
        };
        let ends = tracker.take_due(now + SETTLE, &mut kept_of);
        let [ProcessEnd::Process(child)] = ends.as_slice() else {
            panic!("the child's own summary only: {ends:?}");
        };
        assert_eq!(child.end_rss_bytes, Some(4096));
        assert_eq!(child.endpoints.len(), 2);
        tracker.apply(
            ProcessEvent::ThreadEnded(thread(20, 20, 1_000, 1, 1)),
            now,
            &no_command,
        );
        let ends = tracker.take_due(now + SETTLE, &mut kept_of);
        let [ProcessEnd::Process(root), ProcessEnd::Tree(tree)] = ends.as_slice() else {
            panic!("{ends:?}");
        };
        assert_eq!(root.end_rss_bytes, None, "not told: not measured");
        // The tree's endpoints: one per peer, its processes' summed.
        let received: Vec<(u16, u64)> = tree
            .endpoints
            .iter()
            .map(|e| (e.key.port, e.stats.received_bytes))
            .collect();
        assert_eq!(received, [(80, 120), (443, 7)]);
        assert_eq!(root.tree.as_ref().unwrap().rule, "lithops");
        assert_eq!(tree.label.ids["executor"], "a1b2c3-0");
        assert_eq!(tree.label.ids["job"], "M000");
        assert_eq!(tree.label.ids["call"], "00003");
        assert_eq!(tree.processes, 2);
        assert_eq!(tree.counters.cpu_ns, 6_000);
        assert_eq!(tree.busiest_fork.as_ref().unwrap().pid, 21);
        assert_eq!(tree.root.as_ref().unwrap().pid, 20);
    }

    #[test]
    fn a_tree_rooted_before_the_agent_is_named_from_its_command_line() {
        let rule = parse_rule("dask:dask worker (?P<name>\\S+)").unwrap();
        let mut tracker = ProcessTracker::new(vec![rule]);
        let now = Instant::now();
        let command_of = |pid: u32| (pid == 7).then(|| "python -m dask worker w1".to_string());
        tracker.apply(
            ProcessEvent::Forked {
                pid: 8,
                parent_pid: 7,
            },
            now,
            &command_of,
        );
        tracker.apply(
            ProcessEvent::ThreadEnded(thread(8, 8, 10, 1, 0)),
            now,
            &command_of,
        );
        let ends = tracker.take_due(now + SETTLE, &mut |_, _| kept_cpu(vec![1, 3]));
        let [ProcessEnd::Process(child)] = ends.as_slice() else {
            panic!("{ends:?}");
        };
        assert_eq!(child.tree.as_ref().unwrap().ids["name"], "w1");
        assert_eq!(child.command.as_deref(), Some("python -m dask worker w1"));
    }

    #[test]
    fn bad_rules_are_one_sentence() {
        for text in [
            "nocolon",
            ":x",
            "bad name:x",
            "ok:(unclosed",
            "ok:(?P<a.b>x)",
            "ok:(?P<é>x)",
        ] {
            let err = parse_rule(text).unwrap_err();
            assert_eq!(err.lines().count(), 1, "{err}");
        }
        assert!(parse_rule("etl:python (?P<step>\\w+)").is_ok());
    }
}
