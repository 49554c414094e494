//! `workerprobe record`: every worker's numbers, tick by tick, appended to a JSON Lines file
//! (the format is `crate::recording`'s; docs/recording.md describes it).
//!
//! Each tick: sample the counters, diff them with the previous sample, write one line per
//! active selected worker and one per worker that ended, as one write. The lifecycle events
//! are read right after the sample, so a worker that is removed is still in the sample of
//! the tick it was removed in (its map entries are freed only when its exit is summarised,
//! a tick later): its last moments are in a tick line as well as in its exit line.

use std::time::Duration;

use anyhow::Context as _;
use clap::ValueEnum as _;

use super::watch::Watcher;
use crate::{
    cli::RecordArgs,
    clock::Timestamp,
    model::{
        self, Interval, Measured, MemoryReading, Sample,
        endpoints::{EndpointNamer, figures},
        selection::Selection,
        summary::ExitSummary,
    },
    node::NodeFacts,
    recording::{
        FORMAT, RecordingWriter, SCHEMA_VERSION,
        line::{CLOCK_EVERY_SECONDS, ClockLine, ExitOut, HeaderLine, Line, TickContext, TickLine},
    },
};

/// How long the last tick waits for workers removed just before the stop to settle, so their
/// exit lines are written (the watcher waits 100 ms after a removal).
const FINAL_SETTLE: Duration = Duration::from_millis(150);

/// `workerprobe record`.
pub async fn record(args: &RecordArgs) -> anyhow::Result<()> {
    let selection = Selection::new(&args.workers.patterns)?;
    let rotate_bytes = args.rotate_mb.map(|mb| mb.saturating_mul(1024 * 1024));
    // Checked and opened before the programs are loaded, so a path that cannot be written is
    // told first.
    crate::recording::reader::check_writable_recording(&args.out, args.append)?;
    let mut writer = RecordingWriter::open(&args.out, rotate_bytes)?;
    let collector = super::start_collector(&args.probe)?;
    let namer = args.probe.endpoint_namer();
    let mut watcher = Watcher::new(collector, selection.clone()).with_endpoint_namer(namer.clone());
    let mut previous = watcher.sample()?;
    let run_started = previous.taken_at.unwrap_or_else(Timestamp::now);
    writer.begin(header(args, run_started, previous.measured))?;
    // On stderr: tells scripts (and the tests) that the recording has begun.
    crate::say!("workerprobe: attached; recording to {}", args.out.display());

    let deadline = args
        .duration
        .map(|duration| tokio::time::Instant::now() + duration);
    let mut ticker = tokio::time::interval(args.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await; // the first tick is immediate
    let mut stopped = Box::pin(stop_signal());
    let mut tick = 0;
    // The last tick's interval, its buffer reused for the next.
    let mut spent = Interval::default();
    let mut clock_noted = (Timestamp::now(), crate::clock::ClockQuality::read());
    loop {
        let stop = tokio::select! {
            _ = ticker.tick() => false,
            _ = &mut stopped => true,
            _ = until(deadline) => true,
        };
        // Interrupted or not, the tick under way is finished: its lines are written whole.
        tick += 1;
        let current = watcher.sample()?;
        let mut exits = watcher.poll();
        // A tick takes every event the agent had heard of by its start, however many workers
        // came and went (bounded: events go on arriving meanwhile).
        for _ in 0..64 {
            if !watcher.collector().events_waiting() {
                break;
            }
            exits.extend(watcher.poll());
        }
        let mut lines = encode_tick(
            tick,
            (&previous, &current),
            &mut spent,
            &watcher,
            &selection,
            &namer,
        )?;
        encode_exits(&mut lines, &exits)?;
        note_clock(&mut lines, &mut clock_noted)?;
        writer.write_tick(&lines)?;
        watcher.recycle(std::mem::replace(&mut previous, current));
        if stop {
            tokio::time::sleep(FINAL_SETTLE).await;
            let give_up = std::time::Instant::now() + super::watch::FINAL_WAIT;
            loop {
                let mut lines = Vec::new();
                encode_exits(&mut lines, &watcher.poll())?;
                writer.write_tick(&lines)?;
                if !watcher.settling() || std::time::Instant::now() >= give_up {
                    break;
                }
                tokio::time::sleep(FINAL_SETTLE / 4).await;
            }
            writer.finish()?;
            return Ok(());
        }
    }
}

/// Adds a clock line when the last was [`CLOCK_EVERY_SECONDS`] ago or the clock gained or
/// lost synchronisation since.
fn note_clock(
    lines: &mut Vec<u8>,
    noted: &mut (Timestamp, Option<crate::clock::ClockQuality>),
) -> anyhow::Result<()> {
    let now = Timestamp::now();
    let Some(clock) = crate::clock::ClockQuality::read() else {
        return Ok(());
    };
    let due = now.monotonic_ns.saturating_sub(noted.0.monotonic_ns)
        >= CLOCK_EVERY_SECONDS * 1_000_000_000;
    let changed = noted
        .1
        .is_none_or(|before| before.synchronized != clock.synchronized);
    if due || changed {
        let line = Line::Clock(Box::new(ClockLine {
            schema_version: SCHEMA_VERSION,
            at: now.into(),
            clock,
            node: None,
        }));
        serde_json::to_writer(&mut *lines, &line).context("encoding a clock line")?;
        lines.push(b'\n');
        *noted = (now, Some(clock));
    }
    Ok(())
}

/// The header of this run.
fn header(args: &RecordArgs, run_started: Timestamp, measured: Measured) -> HeaderLine {
    HeaderLine {
        schema_version: SCHEMA_VERSION,
        format: FORMAT.into(),
        agent_version: env!("CARGO_PKG_VERSION").into(),
        node: NodeFacts::read().named(args.probe.node_name.as_deref()),
        started: run_started.into(),
        run_started: run_started.into(),
        part: 0,
        interval_seconds: args.interval.as_secs_f64(),
        worker_patterns: args.workers.patterns.clone(),
        programs: args
            .probe
            .programs
            .iter()
            .filter_map(|choice| choice.to_possible_value())
            .map(|value| value.get_name().to_string())
            .collect(),
        measured,
    }
}

/// One line per active, selected worker of the tick from `previous` to `current`.
/// `spent` is the last tick's interval, its buffer reused and this tick's left in its place.
fn encode_tick(
    tick: u64,
    (previous, current): (&Sample, &Sample),
    spent: &mut Interval,
    watcher: &Watcher,
    selection: &Selection,
    namer: &EndpointNamer,
) -> anyhow::Result<Vec<u8>> {
    let interval = model::diff_reusing(Some(previous), current, std::mem::take(spent));
    let end = interval.end.unwrap_or_else(Timestamp::now);
    let context = TickContext {
        tick,
        start: interval.start.unwrap_or(end),
        end,
        drops: interval.drops.clone(),
        drops_total: interval.total_drops.clone(),
    };
    let mut lines = Vec::new();
    for stats in interval.active_workers() {
        let record = watcher.registry().get(stats.cgroup_id);
        // A cgroup removed before the sample has no path there; the registry remembers it.
        let path = stats
            .path
            .as_deref()
            .map(str::to_owned)
            .or_else(|| record.map(|record| record.path.clone()));
        let identity = stats
            .identity
            .as_deref()
            .or(record.map(|record| &record.identity));
        let selected = match (&path, identity) {
            (Some(path), Some(identity)) => selection.matches_identity(path, identity),
            (Some(path), None) => selection.matches(path),
            (None, _) => selection.is_all(),
        };
        let Some(counters) = current.workers.get(&stats.cgroup_id) else {
            continue;
        };
        if !selected {
            continue;
        }
        let memory = record.and_then(|record| {
            record.memory.map(|reading| MemoryReading {
                peak_bytes: reading.peak_bytes.max(record.memory_peak_bytes),
                ..reading
            })
        });
        let endpoints = figures(namer, &stats.endpoints, interval.measured);
        let line = TickLine::new(&context, stats, counters, path, identity, memory, endpoints);
        serde_json::to_writer(&mut lines, &Line::Tick(Box::new(line)))
            .context("encoding a tick line")?;
        lines.push(b'\n');
    }
    *spent = interval;
    Ok(lines)
}

/// One line per exit summary.
fn encode_exits(lines: &mut Vec<u8>, exits: &[ExitSummary]) -> anyhow::Result<()> {
    for summary in exits {
        let line = ExitOut {
            schema_version: SCHEMA_VERSION,
            summary,
        };
        serde_json::to_writer(&mut *lines, &line).context("encoding an exit line")?;
        lines.push(b'\n');
    }
    Ok(())
}

/// Resolves at Ctrl-C (SIGINT) or SIGTERM.
async fn stop_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = async {
            match term.as_mut() {
                Some(term) => { term.recv().await; }
                None => std::future::pending::<()>().await,
            }
        } => {}
    }
}

/// Resolves at `deadline`, or never without one.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
