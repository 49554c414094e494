//! `workerprobe replay`: a recording shown as `top` showed it live.
//!
//! Each tick of the recording is turned back into the two cumulative samples it was
//! measured between (`recording::Tick::samples`) and goes through the same `model::diff`
//! and the same sinks as live output: `sink::table` for tables, `sink::json` for `--json`.

use std::io::Write as _;

use anyhow::Context as _;

use crate::{
    cli::ReplayArgs,
    model::endpoints::EndpointNamer,
    model::selection::Selection,
    recording::{
        Segment, Tick,
        at::{find_tick, parse_at},
        read_recording,
    },
    sink::{json::SnapshotDocument, table},
};

/// Rows per table, as `top` shows by default.
const TABLE_LIMIT: usize = 40;

/// `workerprobe replay`.
pub fn replay(args: &ReplayArgs) -> anyhow::Result<()> {
    let selection = Selection::new(&args.patterns)?;
    let at = args
        .at
        .as_deref()
        .map(parse_at)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let recording = read_recording(&args.file)?;
    let name = args.file.display();
    crate::recording::reader::tell_skipped(&recording, &name.to_string());
    let mut ticks: Vec<(&Segment, &Tick)> = recording.ticks().collect();
    // A merged recording's nodes take turns, in the order of the shared timeline.
    let mut nodes: Vec<&str> = recording
        .segments
        .iter()
        .map(|segment| segment.header.node.display_name())
        .collect();
    nodes.dedup();
    nodes.sort_unstable();
    nodes.dedup();
    let several_nodes = nodes.len() > 1;
    if several_nodes {
        ticks.sort_by_key(|(segment, tick)| segment.header.timeline_ns(tick.end.monotonic_ns));
    }
    // A pattern that matches no worker of the whole recording is a mistake, not an answer.
    if !selection.is_all()
        && !ticks.iter().any(|(_, tick)| {
            tick.workers
                .iter()
                .any(|w| selection.matches_worker(w.path.as_deref(), w.name.as_deref(), &w.ids))
        })
    {
        return Err(crate::error::UserError::BadInput(format!(
            "no worker in {name} matches --workers {}: list the recorded workers with `workerprobe replay {name}`",
            args.patterns.join(" --workers ")
        ))
        .into());
    }
    if ticks.is_empty() {
        anyhow::bail!("{name} holds no ticks: no selected worker was active while it was recorded");
    }
    let shown = match (at, args.at.as_deref()) {
        (Some(at), Some(text)) => {
            let index = find_tick(&ticks, at, text).map_err(crate::error::UserError::BadInput)?;
            &ticks[index..=index]
        }
        _ => &ticks[..],
    };
    let origin_ns = ticks[0].1.start.wall_unix_ns;
    let mut out = std::io::stdout().lock();
    let mut previous_segment: Option<&Segment> = None;
    for &(segment, tick) in shown {
        let mut interval = tick.interval();
        interval.retain_selected(&selection);
        let text = if args.json {
            let mut document = SnapshotDocument::new(
                &interval,
                segment.header.node.clone(),
                &EndpointNamer::default(),
            );
            // Endpoints were named when recorded: take them from the tick's lines.
            for worker in &mut document.workers {
                let line = tick
                    .workers
                    .iter()
                    .find(|l| l.cgroup_id == worker.cgroup_id);
                worker.endpoints = line.and_then(|line| line.endpoints.clone());
            }
            serde_json::to_string(&document).context("encoding a tick as JSON")? + "\n"
        } else {
            let mut text = String::new();
            if previous_segment.is_some() {
                text.push('\n');
            }
            let new_run = !several_nodes
                && previous_segment.is_some_and(|previous| !std::ptr::eq(previous, segment))
                && segment.header.part == 0;
            if new_run {
                text += &format!(
                    "a new run started at {} on {}\n\n",
                    segment.header.run_started.time,
                    segment.header.node.display_name()
                );
            }
            text += &format!(
                "at {} (+{:.2}s)",
                tick.end.time,
                tick.end.wall_unix_ns.saturating_sub(origin_ns) as f64 / 1e9
            );
            if several_nodes {
                text += &format!(" on {}", segment.header.node.display_name());
            }
            text.push('\n');
            text + &table::render(&interval, TABLE_LIMIT)
        };
        previous_segment = Some(segment);
        if out
            .write_all(text.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            return Ok(()); // the reader went away (e.g. `| head`)
        }
    }
    Ok(())
}
