//! `workerprobe watch`: one exit summary per worker as each one ends.

use std::{
    collections::VecDeque,
    io::Write as _,
    time::{Duration, Instant},
};

use anyhow::Context as _;

use crate::{
    cli::WatchArgs,
    clock::Timestamp,
    collect::{KernelCollector, Source as _, memory::MemoryReader},
    model::{
        Sample, WorkerCounters,
        endpoints::EndpointNamer,
        process::{ProcessEnd, ProcessTracker},
        registry::WorkerRegistry,
        selection::Selection,
        summary::ExitSummary,
        tree::Level,
    },
    node::NodeFacts,
    sink::{json::SCHEMA_VERSION, process as process_sink, summary::human_line},
};

/// How long after a cgroup is removed its summary is taken: a thread that left the cgroup on
/// exit may still be in its last context switch on another CPU.
const SETTLE: Duration = Duration::from_millis(100);
/// How often the lifecycle ring buffer is read.
const EVENT_POLL: Duration = Duration::from_millis(50);
/// Longest wait at the end for what ended before the stop to be summarised.
pub const FINAL_WAIT: Duration = Duration::from_secs(1);
/// Lines queued for a reader of the output that is slow to take them; past it the agent
/// waits for the reader.
const QUEUED_LINES: usize = 16_384;

/// Follows workers' lives and reports each exit through `emit`.
pub struct Watcher {
    collector: KernelCollector,
    registry: WorkerRegistry,
    memory: MemoryReader,
    /// Removed workers waiting to settle: (cgroup id, removed at, when to finish).
    removed: VecDeque<(u64, u64, Instant)>,
    /// Removed cgroups no one watches, waiting to settle before their counters are freed
    /// unreported (they took slots and entries all the same).
    unwatched_removed: VecDeque<(u64, Instant)>,
    /// Workers whose directory was gone at the last sample: if it still is at the next, they
    /// are finished even without a removal event (the lifecycle programs may be off, or the
    /// event was dropped), so their map entries never linger.
    gone: std::collections::HashSet<u64>,
    /// When live workers' directories were last checked (a stat each: not every sample).
    last_vanished_check: Option<Instant>,
    /// Checks of live workers' directories so far.
    vanished_checks: u32,
    /// The lifecycle ring's drop count at the last check.
    events_dropped_at_check: u64,
    boot_offset_ns: i128,
    /// Whether samples read live workers' memory (not needed where nobody shows it).
    read_memory: bool,
    /// Says once on stderr when a kernel map starts dropping (serve, record, watch and top
    /// all sample through here).
    drop_warning: super::warn::DropWarning,
    /// Keep the warning for [`Watcher::take_warning`] instead of printing it (a full-screen
    /// view owns the terminal).
    defer_warning: bool,
    deferred_warning: Option<String>,
    /// Names the endpoints in exit summaries.
    namer: EndpointNamer,
    /// The tree level whose cgroups are the workers (`--depth`), if not every cgroup.
    level: Option<Level>,
    /// The workers asked for: with a level, the registry follows every cgroup (descendants
    /// are folded in whatever they match) and this picks the summaries.
    selection: Selection,
    /// Final counters of removed descendants, by the path of the cgroup at `level` holding
    /// them, until it ends too.
    subtrees: std::collections::HashMap<String, WorkerCounters>,
    /// Process workers, when asked for (`--processes`, `--process`).
    processes: Option<ProcessTracker>,
}

impl Watcher {
    /// Watches the workers `selection` picks, with programs already attached.
    pub fn new(collector: KernelCollector, selection: Selection) -> Self {
        let now = Timestamp::now();
        Self {
            collector,
            registry: WorkerRegistry::new(selection.clone()),
            memory: MemoryReader::new(),
            removed: VecDeque::new(),
            unwatched_removed: VecDeque::new(),
            gone: std::collections::HashSet::new(),
            last_vanished_check: None,
            vanished_checks: 0,
            events_dropped_at_check: 0,
            boot_offset_ns: i128::from(now.wall_unix_ns) - i128::from(now.monotonic_ns),
            read_memory: true,
            drop_warning: super::warn::DropWarning::new(super::loaded_max_workers()),
            defer_warning: false,
            deferred_warning: None,
            namer: EndpointNamer::default(),
            level: None,
            selection,
            subtrees: std::collections::HashMap::new(),
            processes: None,
        }
    }

    /// Makes the cgroups at `level` the workers: each one's exit summary sums its subtree,
    /// and the cgroups below it have none of their own.
    pub fn with_level(mut self, level: Option<Level>) -> Self {
        if level.is_some() {
            self.registry = WorkerRegistry::new(Selection::all());
        }
        self.level = level;
        self
    }

    /// Names endpoints in exit summaries by these rules (`--endpoint`).
    pub fn with_endpoint_namer(mut self, namer: EndpointNamer) -> Self {
        self.namer = namer;
        self
    }

    /// Names `max_workers` as the capacity in the drop warning (by default the one
    /// [`super::start_collector`] loaded the maps with).
    pub fn with_max_workers(mut self, max_workers: u32) -> Self {
        self.drop_warning.set_max_workers(max_workers);
        self
    }

    /// Keeps the drop warning for [`Watcher::take_warning`] instead of printing it.
    pub fn defer_warning(&mut self) {
        self.defer_warning = true;
    }

    /// The drop warning kept by [`Watcher::defer_warning`], if it was given.
    pub fn take_warning(&mut self) -> Option<String> {
        self.deferred_warning.take()
    }

    /// Skips reading memory at each sample (cheaper, for views that do not show it).
    pub fn without_memory(mut self) -> Self {
        self.read_memory = false;
        self
    }

    /// Reads the kernel's lifecycle events; returns the summaries of workers that have
    /// settled since.
    pub fn poll(&mut self) -> Vec<ExitSummary> {
        self.poll_with_counters()
            .into_iter()
            .map(|(summary, _)| summary)
            .collect()
    }

    /// Follows process workers with `tracker` (the programs must have been loaded for them),
    /// starting with the named trees already running.
    pub fn with_processes(mut self, mut tracker: ProcessTracker) -> Self {
        tracker.adopt_running(&crate::cgroup::running_processes());
        self.processes = Some(tracker);
        self
    }

    /// Processes and named trees that ended, each with its cgroup's path when known.
    pub fn poll_processes(&mut self) -> anyhow::Result<Vec<(ProcessEnd, Option<String>)>> {
        let Some(tracker) = self.processes.as_mut() else {
            return Ok(Vec::new());
        };
        let now = Instant::now();
        for event in self.collector.drain_process_events()? {
            tracker.apply(event, now, &crate::cgroup::command_line);
        }
        let collector = &mut self.collector;
        collector.begin_process_takes();
        let ends = tracker.take_due(now, &mut |pid, moved_bytes| {
            collector.take_process(pid, moved_bytes)
        });
        let cgroups = self.collector.cgroups();
        Ok(ends
            .into_iter()
            .map(|end| {
                let path = match &end {
                    ProcessEnd::Process(summary) => cgroups
                        .resolve(summary.cgroup_id)
                        .map(|path| path.to_string()),
                    ProcessEnd::Tree(_) => None,
                };
                (end, path)
            })
            .filter(|(end, path)| match end {
                // A process in a named tree is reported wherever it ran; others by --workers.
                ProcessEnd::Process(summary) => {
                    summary.tree.is_some()
                        || self.selection.is_all()
                        || path
                            .as_deref()
                            .is_some_and(|path| self.selection.matches(path))
                }
                ProcessEnd::Tree(_) => true,
            })
            .collect())
    }

    /// The named trees still running, with their CPU and bytes so far (none without process
    /// workers).
    pub fn live_trees(&self) -> Vec<crate::model::process::LiveTree> {
        self.processes.as_ref().map_or_else(Vec::new, |tracker| {
            tracker.live_trees(&crate::cgroup::read_process_threads_runtime_ns, &|pid| {
                self.collector.live_process_bytes(pid)
            })
        })
    }

    /// Like [`Watcher::poll`], each summary with the worker's final cumulative counters, for
    /// sinks that export counters (the Prometheus endpoint keeps them through a grace period).
    pub fn poll_with_counters(&mut self) -> Vec<(ExitSummary, WorkerCounters)> {
        for event in self.collector.drain_events() {
            if let Some(cgroup_id) = self.registry.apply(&event) {
                self.removed
                    .push_back((cgroup_id, event.at_monotonic_ns, Instant::now() + SETTLE));
            } else if !event.made && self.level.is_none() {
                // Not a worker here (a --depth level folds removed cgroups into their
                // holders instead).
                self.unwatched_removed
                    .push_back((event.cgroup_id, Instant::now() + SETTLE));
            }
        }
        while let Some(&(cgroup_id, due)) = self.unwatched_removed.front() {
            if due > Instant::now() {
                break;
            }
            self.unwatched_removed.pop_front();
            self.collector.discard(cgroup_id);
        }
        let mut summaries = Vec::new();
        while let Some(&(cgroup_id, removed_at_ns, due)) = self.removed.front() {
            if due > Instant::now() {
                break;
            }
            self.removed.pop_front();
            let record = self.registry.remove(cgroup_id);
            let (record, counters, subtree) = match (self.level, record) {
                (Some(level), Some(record)) => {
                    let Some(settled) = self.fold_removed(level, record) else {
                        continue;
                    };
                    settled
                }
                (_, record) => (record, self.collector.finish(cgroup_id), false),
            };
            // A cgroup that never ran a thread or moved a byte was not a worker.
            if let (Some(record), Some(counters)) = (record, counters) {
                let summary = ExitSummary::new(
                    &record,
                    &counters,
                    removed_at_ns,
                    self.boot_offset_ns,
                    self.collector.measured(),
                    &self.namer,
                    None,
                );
                let summary = ExitSummary {
                    scope: if subtree { "subtree" } else { "self" },
                    ..summary
                };
                summaries.push((summary, counters));
            }
        }
        summaries
    }

    /// A removed cgroup when workers are the cgroups at `level`: one below the level is added
    /// to the cgroup holding it (`None`: no summary of its own); one at the level gets its
    /// descendants' counters added to its own (`true`: a subtree), if the selection picks it.
    #[allow(clippy::type_complexity)]
    fn fold_removed(
        &mut self,
        level: Level,
        record: crate::model::registry::WorkerRecord,
    ) -> Option<(
        Option<crate::model::registry::WorkerRecord>,
        Option<WorkerCounters>,
        bool,
    )> {
        let cgroup_id = record.cgroup_id;
        let exit_memory = self.collector.take_exit_memory(cgroup_id);
        let own = self.collector.finish(cgroup_id);
        match level.holder(&record.path) {
            Some(holder) if holder != record.path => {
                // Its processes' memory peaks go up with its counters.
                let own = match (own, exit_memory) {
                    (Some(own), exit_memory) => Some(WorkerCounters { exit_memory, ..own }),
                    (None, Some(exit_memory)) => Some(WorkerCounters {
                        exit_memory: Some(exit_memory),
                        ..WorkerCounters::default()
                    }),
                    (None, None) => None,
                };
                if let Some(own) = own {
                    self.subtrees.entry(holder).or_default().absorb(&own);
                }
                None
            }
            Some(_) => {
                let descendants = self.subtrees.remove(&record.path);
                // A pod with no threads of its own still ends with its containers' figures
                // and its memory cgroup's peak.
                let counters = match (own, descendants) {
                    (None, None) => None,
                    (own, descendants) => {
                        let mut counters = own.unwrap_or_default();
                        counters.exit_memory = exit_memory;
                        if let Some(descendants) = descendants {
                            counters.absorb(&descendants);
                        }
                        Some(counters)
                    }
                };
                let picked = self
                    .selection
                    .matches_identity(&record.path, &record.identity);
                picked.then_some((Some(record), counters, true))
            }
            None => {
                let picked = self
                    .selection
                    .matches_identity(&record.path, &record.identity);
                let own = own.map(|mut own| {
                    own.exit_memory = exit_memory;
                    own
                });
                picked.then_some((Some(record), own, false))
            }
        }
    }

    /// True while removed workers wait out their settling time before their summaries, or
    /// events wait to be taken.
    pub fn settling(&self) -> bool {
        !self.removed.is_empty()
            || self.collector.events_waiting()
            || self.collector.process_events_waiting()
            || self
                .processes
                .as_ref()
                .is_some_and(ProcessTracker::settling)
    }

    /// Samples live workers: registers the ones made before the agent started, and keeps
    /// their latest memory and cpu.stat for their summaries. Returns the sample.
    pub fn sample(&mut self) -> anyhow::Result<Sample> {
        let sample = self.collector.sample()?;
        if let Some(warning) = self.drop_warning.check(&sample.drops) {
            if self.defer_warning {
                self.deferred_warning = Some(warning);
            } else {
                super::warn::tell(&warning);
            }
        }
        self.registry.observe(&sample);
        self.finish_vanished(&sample);
        if !self.read_memory {
            // The caller reads memory itself (`top`), the walk's reading included.
            return Ok(sample);
        }
        let walked = self.collector.take_walked_memory();
        let live: Vec<(u64, String)> = self
            .registry
            .records()
            .map(|record| (record.cgroup_id, record.path.clone()))
            .collect();
        for (cgroup_id, path) in live {
            let reading = self
                .memory
                .read_worker(cgroup_id, &path, &walked, &mut |path| {
                    self.collector.cgroups().dir_of(path)
                });
            if let Some(reading) = reading {
                self.registry.record_memory(cgroup_id, reading);
            }
        }
        Ok(sample)
    }

    /// Queues the workers whose cgroup directory has been gone for two checks in a row.
    /// Removal events normally finish workers well before, so this only catches what they
    /// missed, and costs a stat per live worker (4% of the agent's CPU at 1,000 workers when
    /// run every 5 s): every 5 s while events may have been missed (no lifecycle programs,
    /// the ring dropped some, the first checks after start, a directory found gone), else
    /// every 30 s.
    fn finish_vanished(&mut self, sample: &Sample) {
        const EVERY: Duration = Duration::from_secs(5);
        const EVERY_WHILE_TOLD: Duration = Duration::from_secs(30);
        let events_dropped = sample
            .drops
            .by_map
            .get(probe_common::drops::DROP_EVENTS as usize)
            .copied()
            .unwrap_or(0);
        let all_told = sample.measured.lifecycle
            && self.vanished_checks >= 2
            && self.gone.is_empty()
            && events_dropped == self.events_dropped_at_check;
        let every = if all_told { EVERY_WHILE_TOLD } else { EVERY };
        if self
            .last_vanished_check
            .is_some_and(|at| at.elapsed() < every)
        {
            return;
        }
        self.last_vanished_check = Some(Instant::now());
        self.vanished_checks = self.vanished_checks.saturating_add(1);
        self.events_dropped_at_check = events_dropped;
        let now_monotonic_ns = sample.taken_at.map_or(0, |at| at.monotonic_ns);
        let mut gone_now = std::collections::HashSet::new();
        for record in self.registry.records() {
            let dir = self.collector.cgroups().dir_of(&record.path);
            let exists = crate::cgroup::cgroup_id(&dir).is_ok_and(|id| id == record.cgroup_id);
            if !exists {
                gone_now.insert(record.cgroup_id);
            }
        }
        // Deepest first: a cgroup's children end before it, so its subtree is complete.
        let mut vanished: Vec<(usize, u64)> = gone_now
            .iter()
            .map(|&id| {
                let depth = self
                    .registry
                    .get(id)
                    .map_or(0, |record| crate::model::tree::depth_of(&record.path));
                (depth, id)
            })
            .collect();
        vanished.sort_unstable_by(|a, b| b.cmp(a));
        for (_, cgroup_id) in vanished {
            let queued = self.removed.iter().any(|&(id, _, _)| id == cgroup_id);
            if self.gone.contains(&cgroup_id) && !queued {
                self.removed
                    .push_back((cgroup_id, now_monotonic_ns, Instant::now()));
            }
        }
        self.gone = gone_now;
    }

    /// The registry: names, start times and latest memory of live workers.
    pub fn registry(&self) -> &WorkerRegistry {
        &self.registry
    }

    /// The offset from the monotonic clock to wall time (wall = monotonic + offset), ns.
    pub fn boot_offset_ns(&self) -> i128 {
        self.boot_offset_ns
    }

    /// Takes back a sample the caller is done with (see [`Source::recycle`]).
    pub fn recycle(&mut self, spent: Sample) {
        self.collector.recycle(spent);
    }

    /// The collector, e.g. for drops or the cgroup index.
    pub fn collector(&mut self) -> &mut KernelCollector {
        &mut self.collector
    }
}

/// `workerprobe watch`.
pub async fn watch(args: &WatchArgs) -> anyhow::Result<()> {
    let selection = Selection::new(&args.workers.patterns)?;
    let processes = args.processes || !args.process_rules.is_empty();
    if processes && args.probe.pin.is_some() {
        return Err(crate::error::UserError::BadInput(
            "--processes and --process cannot be used with --pin: drop --pin to follow processes"
                .into(),
        )
        .into());
    }
    let collector = super::start_collector_with(&args.probe, processes)?;
    let measured = collector.measured();
    if processes && !collector.measured().cpu {
        // Each thread's end is told by the sched_switch programs.
        return Err(crate::error::UserError::BadInput(
            "--processes needs the CPU programs, which this kernel or --programs leaves out: add cpu to --programs"
                .into(),
        )
        .into());
    }
    let mut watcher = Watcher::new(collector, selection)
        .with_endpoint_namer(args.probe.endpoint_namer())
        .with_level(args.tree.depth);
    if processes {
        watcher = watcher.with_processes(ProcessTracker::new(args.process_rules.clone()));
    }
    let mut stdout = std::io::stdout().lock();
    if args.json {
        let header = serde_json::json!({
            "type": "header",
            "schema_version": SCHEMA_VERSION,
            "node": NodeFacts::read().named(args.probe.node_name.as_deref()),
            "started": Timestamp::now().rfc3339(),
        });
        writeln!(stdout, "{header}").context("writing to stdout")?;
        stdout.flush().context("writing to stdout")?;
    }
    drop(stdout);
    let output = LineWriter::start();
    crate::say!("workerprobe: attached; watching for worker exits");
    let deadline = args.duration.map(|duration| Instant::now() + duration);
    // Ctrl-C (SIGINT) or SIGTERM ends the watch after the last exits settle.
    let mut interrupted = Box::pin(async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(term) => { term.recv().await; } None => std::future::pending::<()>().await } } => {}
        }
    });
    let mut next_sample = Instant::now();
    loop {
        if Instant::now() >= next_sample {
            let sample = watcher.sample()?;
            watcher.recycle(sample);
            next_sample = Instant::now() + args.interval;
        }
        let mut lines = Vec::new();
        for summary in watcher.poll() {
            lines.push(render(&summary, args.json)?);
        }
        lines.extend(render_processes(&mut watcher, args.json, measured)?);
        for line in lines {
            if !output.write(line) {
                return Ok(()); // the reader went away
            }
        }
        let stop = deadline.is_some_and(|deadline| Instant::now() >= deadline)
            || tokio::select! {
                _ = tokio::time::sleep(EVENT_POLL) => false,
                _ = &mut interrupted => true,
            };
        if stop {
            // Let removals already told settle, so none is lost at the end.
            tokio::time::sleep(SETTLE).await;
            // On a busy node something is always settling: what ended before the stop has
            // settled within a few rounds, so the wait is bounded.
            let give_up = Instant::now() + FINAL_WAIT;
            loop {
                for summary in watcher.poll() {
                    output.write(render(&summary, args.json)?);
                }
                for line in render_processes(&mut watcher, args.json, measured)? {
                    output.write(line);
                }
                if !watcher.settling() || Instant::now() >= give_up {
                    break;
                }
                tokio::time::sleep(EVENT_POLL).await;
            }
            output.finish();
            return Ok(());
        }
    }
}

/// The processes and named trees that ended, as lines (a Lithops call's record after its
/// tree's).
fn render_processes(
    watcher: &mut Watcher,
    json: bool,
    measured: crate::model::Measured,
) -> anyhow::Result<Vec<String>> {
    let boot_offset_ns = watcher.boot_offset_ns();
    let mut lines = Vec::new();
    for (end, path) in watcher.poll_processes()? {
        match end {
            ProcessEnd::Process(summary) if json => lines.push(
                process_sink::process_json(
                    &summary,
                    path.as_deref(),
                    boot_offset_ns,
                    measured,
                    &watcher.namer,
                )
                .to_string(),
            ),
            ProcessEnd::Process(summary) => {
                lines.push(process_sink::process_line(
                    &summary,
                    path.as_deref(),
                    measured,
                ));
            }
            ProcessEnd::Tree(tree) if json => {
                lines.push(
                    process_sink::tree_json(&tree, boot_offset_ns, measured, &watcher.namer)
                        .to_string(),
                );
                if let Some(call) = process_sink::lithops_call_json(&tree, boot_offset_ns, measured)
                {
                    lines.push(call.to_string());
                }
            }
            ProcessEnd::Tree(tree) => lines.push(process_sink::tree_line(&tree, measured)),
        }
    }
    Ok(lines)
}

/// Writes lines on stdout from its own thread, so a slow reader of the agent's output never
/// holds the agent up: removed workers keep being finished (their kernel map entries freed)
/// while their lines wait here.
struct LineWriter {
    lines: Option<std::sync::mpsc::SyncSender<String>>,
    /// Tells when the thread has written everything (or the reader went away).
    done: Option<std::sync::mpsc::Receiver<()>>,
    closed: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl LineWriter {
    fn start() -> Self {
        let (lines, queued) = std::sync::mpsc::sync_channel::<String>(QUEUED_LINES);
        let (finished, done) = std::sync::mpsc::channel();
        let closed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader_gone = std::sync::Arc::clone(&closed);
        let started = std::thread::Builder::new()
            .name("stdout".into())
            .spawn(move || {
                let mut stdout = std::io::stdout().lock();
                for line in queued {
                    if writeln!(stdout, "{line}")
                        .and_then(|()| stdout.flush())
                        .is_err()
                    {
                        reader_gone.store(true, std::sync::atomic::Ordering::Relaxed);
                        break;
                    }
                }
                let _ = finished.send(());
            })
            .is_ok();
        Self {
            lines: started.then_some(lines),
            done: started.then_some(done),
            closed,
        }
    }

    /// Queues a line; false once the reader of the output has gone away.
    fn write(&self, line: String) -> bool {
        if self.closed.load(std::sync::atomic::Ordering::Relaxed) {
            return false;
        }
        match &self.lines {
            Some(lines) => lines.send(line).is_ok(),
            // No thread could be started: write here.
            None => writeln!(std::io::stdout(), "{line}").is_ok(),
        }
    }

    /// Writes what is queued, giving a reader that takes nothing [`FINAL_WAIT`] more.
    fn finish(mut self) {
        self.lines = None;
        if let Some(done) = self.done.take() {
            let _ = done.recv_timeout(FINAL_WAIT * 5);
        }
    }
}

impl Drop for LineWriter {
    /// An early return (an error) still writes what was queued, within the same limit.
    fn drop(&mut self) {
        self.lines = None;
        if let Some(done) = self.done.take() {
            let _ = done.recv_timeout(FINAL_WAIT * 5);
        }
    }
}

/// One summary as a JSON line or a human line.
fn render(summary: &ExitSummary, json: bool) -> anyhow::Result<String> {
    Ok(if json {
        serde_json::to_string(summary).context("encoding a summary")?
    } else {
        human_line(summary)
    })
}
