//! The commands, wiring the stages: load → collect → model → sink.

pub mod check;
pub mod exec;
pub mod merge;
pub mod plot;
pub mod record;
pub mod replay;
pub mod report;
pub mod serve;
pub mod trace;
pub mod unpin;
pub mod warn;
pub mod watch;

use std::io::{IsTerminal as _, Write as _};

use anyhow::Context as _;

use crate::{
    cgroup::{self, CgroupIndex},
    cli::{ProbeArgs, SnapshotArgs, TopArgs},
    collect::{KernelCollector, Source as _},
    loader,
    model::{self, Interval, selection::Selection},
    node::NodeFacts,
    sink::{json::SnapshotDocument, table},
};

/// The map capacity (`--max-workers`) the programs were last loaded with, for the drop
/// warning (see [`warn::DropWarning`]); one agent loads them once.
static LOADED_MAX_WORKERS: std::sync::atomic::AtomicU32 =
    std::sync::atomic::AtomicU32::new(probe_common::DEFAULT_MAX_WORKERS);

/// The capacity [`start_collector`] loaded the maps with.
pub fn loaded_max_workers() -> u32 {
    LOADED_MAX_WORKERS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Loads and attaches the programs and returns a collector over their maps.
pub fn start_collector(probe_args: &ProbeArgs) -> anyhow::Result<KernelCollector> {
    start_collector_with(probe_args, false)
}

/// [`start_collector`], with the process programs telling of every process when `processes`.
pub fn start_collector_with(
    probe_args: &ProbeArgs,
    processes: bool,
) -> anyhow::Result<KernelCollector> {
    let probe = probe_args;
    LOADED_MAX_WORKERS.store(probe.max_workers, std::sync::atomic::Ordering::Relaxed);
    // Find cgroup2 first: without it no number can be attributed to a worker.
    let mount = cgroup::find_cgroup2_mount()?;
    // Look the user up before loading anything: a typo should cost nothing.
    let account = probe_user_account(probe_args.user.as_deref())?;
    let options = crate::loader::LoadOptions {
        processes,
        ..probe.load_options()
    };
    // Maps, programs and the memory files kept open take a descriptor each.
    crate::collect::kept_files::raise_fd_limit();
    let probe = loader::open(&options, probe_args.pin.as_deref())?;
    tell_notes(&probe);
    let collector = KernelCollector::new(probe, CgroupIndex::new(mount))?
        .with_runtimes(crate::runtimes::Runtimes::probe());
    if let Some(account) = account {
        crate::privileges::drop_to(account)?;
    }
    Ok(collector)
}

/// Folds the interval's workers to the tree level `--depth` asks for, if it asks.
fn fold(
    interval: &mut model::Interval,
    tree: &crate::cli::TreeArgs,
    collector: &mut KernelCollector,
) {
    if let Some(level) = tree.depth {
        interval.fold(level, |path| collector.holder(path));
    }
}

/// Says, once and one sentence each, which asked-for measurements this kernel cannot make.
pub fn tell_notes(probe: &loader::Probe) {
    for note in probe.notes() {
        crate::say!("workerprobe: {note}");
    }
}

/// The account `--user` names, looked up while the agent can still read everything.
fn probe_user_account(name: Option<&str>) -> anyhow::Result<Option<crate::privileges::Account>> {
    Ok(match name {
        Some(name) => Some(crate::privileges::lookup(name)?),
        None => None,
    })
}

/// `workerprobe top`: an interactive screen on a terminal; plain tables with `--once` or when
/// stdout is not a terminal, so the output can be piped.
pub async fn top(args: &TopArgs) -> anyhow::Result<()> {
    use crossterm::event::Event;
    use tokio::signal::unix::{SignalKind, signal};

    use crate::sink::tui::{self, Action, Screen, TopView};

    let selection = Selection::new(&args.workers.patterns)?;
    let processes = !args.process_rules.is_empty();
    if processes && args.probe.pin.is_some() {
        return Err(crate::error::UserError::BadInput(
            "--process cannot be used with --pin: drop --pin to follow process trees".into(),
        )
        .into());
    }
    // The watcher frees removed workers' map entries (their summaries are not shown here).
    let mut collector = watch::Watcher::new(
        start_collector_with(&args.probe, processes)?,
        selection.clone(),
    )
    .without_memory();
    if processes {
        if !collector.collector().measured().cpu {
            return Err(crate::error::UserError::BadInput(
                "--process needs the CPU programs, which this kernel or --programs leaves out: add cpu to --programs"
                    .into(),
            )
            .into());
        }
        collector = collector.with_processes(crate::model::process::ProcessTracker::new(
            args.process_rules.clone(),
        ));
    }
    let mut trees = TreeRows::default();
    // The trees already running: the first table's CPU is what they used in its interval.
    let _ = trees.update(collector.live_trees(), Vec::new());
    let mut previous = collector.sample()?;
    // Only the active workers' memory is read, each tick (idle ones are not shown).
    let mut memory = crate::collect::memory::MemoryReader::new();
    let mut ticker = tokio::time::interval(args.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await; // the first tick is immediate
    if std::io::stdout().is_terminal() && !args.once && !processes {
        // The screen owns the terminal: a drop warning is printed once it is restored.
        collector.defer_warning();
        let result: anyhow::Result<()> = async {
            // Made once, so a signal arriving while the screen is drawn is not missed.
            let mut interrupt = signal(SignalKind::interrupt()).context("listening for SIGINT")?;
            let mut terminate = signal(SignalKind::terminate()).context("listening for SIGTERM")?;
            let mut view = TopView::new(args.limit, NodeFacts::read().cpus);
            view.endpoint_namer = args.probe.endpoint_namer();
            let mut shown = Interval::default();
            // The interval last replaced on the screen, its buffer reused for the next.
            let mut spent = Interval::default();
            // Data flows one way: this loop samples and hands each interval to the screen.
            // Dropping `screen` (on quit, a signal, or an error returned by `?`) restores the
            // terminal.
            let mut screen = Screen::start().context("taking over the terminal")?;
            loop {
                view.sync(&shown);
                screen.draw(&shown, &view).context("drawing the screen")?;
                tokio::select! {
                    _ = ticker.tick() => {
                        let _ = collector.poll();
                        let current = collector.sample()?;
                        let mut interval = model::diff_reusing(
                            Some(&previous),
                            &current,
                            std::mem::take(&mut spent),
                        );
                        fold(&mut interval, &args.tree, collector.collector());
                        interval.retain_selected(&selection);
                        let walked = collector.collector().take_walked_memory();
                        memory.read_active(&mut interval, &walked, |path| collector.collector().cgroups().dir_of(path));
                        collector.recycle(std::mem::replace(&mut previous, current));
                        // Sampling goes on while paused, so the first interval after resuming is
                        // one tick long.
                        spent = if view.paused {
                            interval
                        } else {
                            std::mem::replace(&mut shown, interval)
                        };
                    }
                    event = screen.next_event() => match event {
                        Some(Event::Key(key)) => {
                            if tui::handle_key(&mut view, key) == Action::Quit {
                                return Ok(());
                            }
                        }
                        Some(_) => {} // a resize: the next draw fits the new size
                        None => return Ok(()), // the terminal can no longer be read
                    },
                    _ = interrupt.recv() => return Ok(()),
                    _ = terminate.recv() => return Ok(()),
                }
            }
        }
        .await;
        if let Some(warning) = collector.take_warning() {
            warn::tell(&warning);
        }
        return result;
    }
    // Trees that ended between tables; the process ring is read every 50 ms meanwhile, as
    // watch and serve read it, so a long --interval does not let it fill.
    let mut ended = Vec::new();
    // The last table's interval, its buffer reused for the next.
    let mut spent = Interval::default();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = tokio::time::sleep(std::time::Duration::from_millis(50)), if processes => {
                ended.extend(collector.poll_processes()?);
                continue;
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
        let _ = collector.poll();
        ended.extend(collector.poll_processes()?);
        let ended = std::mem::take(&mut ended);
        let current = collector.sample()?;
        let mut interval =
            model::diff_reusing(Some(&previous), &current, std::mem::take(&mut spent));
        fold(&mut interval, &args.tree, collector.collector());
        interval.retain_selected(&selection);
        let walked = collector.collector().take_walked_memory();
        memory.read_active(&mut interval, &walked, |path| {
            collector.collector().cgroups().dir_of(path)
        });
        let mut text = table::render(&interval, args.limit);
        spent = interval;
        if processes {
            let rows = trees.update(collector.live_trees(), ended);
            text.push_str(&table::render_trees(&rows, trees.elapsed));
        }
        let mut stdout = std::io::stdout().lock();
        if write!(stdout, "{text}")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return Ok(()); // the reader went away (e.g. `| head`)
        }
        if args.once {
            return Ok(());
        }
        let _ = writeln!(stdout);
        collector.recycle(std::mem::replace(&mut previous, current));
    }
}

/// Named trees between two of top's tables: each one's CPU in the interval, from its total
/// now and at the last table.
#[derive(Default)]
struct TreeRows {
    last_cpu_ns: std::collections::HashMap<u64, u64>,
    /// When the last rows were made, and the time since the one before.
    last_at: Option<std::time::Instant>,
    elapsed: std::time::Duration,
}

impl TreeRows {
    /// The rows for this table: running trees, and those that ended since the last.
    fn update(
        &mut self,
        live: Vec<model::process::LiveTree>,
        ended: Vec<(model::process::ProcessEnd, Option<String>)>,
    ) -> Vec<table::TreeRow> {
        let mut rows = Vec::new();
        let mut seen = std::collections::HashMap::new();
        let mut row =
            |id: u64, label: &model::process::TreeLabel, processes, cpu_ns: u64, running| {
                let before = self.last_cpu_ns.get(&id).copied().unwrap_or(0);
                let cpu_ns = cpu_ns.max(before);
                if running {
                    seen.insert(id, cpu_ns);
                }
                rows.push(table::TreeRow {
                    rule: label.rule.clone(),
                    ids: label
                        .ids
                        .iter()
                        .map(|(name, value)| format!("{name}={value}"))
                        .collect::<Vec<_>>()
                        .join(" "),
                    processes,
                    interval_cpu_ns: cpu_ns - before,
                    total_cpu_ns: cpu_ns,
                    running,
                });
            };
        for tree in &live {
            row(tree.id, &tree.label, tree.processes, tree.cpu_ns, true);
        }
        for (end, _) in &ended {
            if let model::process::ProcessEnd::Tree(tree) = end {
                row(
                    tree.id,
                    &tree.label,
                    tree.processes,
                    tree.counters.cpu_ns,
                    false,
                );
            }
        }
        self.last_cpu_ns = seen;
        let now = std::time::Instant::now();
        self.elapsed = self
            .last_at
            .map_or(std::time::Duration::ZERO, |at| now - at);
        self.last_at = Some(now);
        rows.sort_by_key(|row| std::cmp::Reverse(row.interval_cpu_ns));
        rows
    }
}

/// `workerprobe snapshot`.
pub async fn snapshot(args: &SnapshotArgs) -> anyhow::Result<()> {
    let selection = Selection::new(&args.workers.patterns)?;
    let mut collector = start_collector(&args.probe)?;
    let start = collector.sample()?;
    // On stderr, so stdout stays one clean document; also tells scripts the window has begun.
    crate::say!(
        "workerprobe: attached; measuring for {}",
        humantime::format_duration(args.duration)
    );
    tokio::time::sleep(args.duration).await;
    let end = collector.sample()?;
    if let Some(warning) = warn::DropWarning::new(args.probe.max_workers).check(&end.drops) {
        warn::tell(&warning);
    }
    let mut interval = model::diff(Some(&start), &end);
    fold(&mut interval, &args.tree, &mut collector);
    interval.retain_selected(&selection);
    let walked = collector.take_walked_memory();
    crate::collect::memory::MemoryReader::new().read_active(&mut interval, &walked, |path| {
        collector.cgroups().dir_of(path)
    });
    let text = if args.json {
        let node = NodeFacts::read().named(args.probe.node_name.as_deref());
        let document = SnapshotDocument::new(&interval, node, &args.probe.endpoint_namer());
        serde_json::to_string_pretty(&document).context("encoding the snapshot as JSON")? + "\n"
    } else {
        table::render(&interval, usize::MAX)
    };
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
    Ok(())
}
