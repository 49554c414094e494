//! The pure model behind every picture: a recording turned into series per worker, on one
//! time axis.
//!
//! Time is the node's monotonic clock (the one every worker shares), in seconds from the
//! start of the recording's first tick; `--from`/`--to` pick a window of it. A merged
//! recording of several nodes puts each node's clock on one wall-clock timeline through
//! its run's offset; its workers are grouped under their node. Each tick a
//! worker was active in becomes one [`TickPoint`] (rates over the tick's interval, memory at
//! its end); its life span comes from its exit line when there is one, else from its first
//! and last ticks. Nothing here reads a file or the kernel: tests build recordings from text.

use std::collections::HashMap;

use crate::{
    clock::rfc3339_from_unix_ns,
    model::selection::Selection,
    node::NodeFacts,
    recording::{Recording, Segment, at::At, line::ExitLine},
};

/// Two ticks closer than this (seconds) are one continuous stretch: consecutive samples
/// share their moment exactly, so this only absorbs rounding.
const CONTIGUOUS_SECONDS: f64 = 1e-6;

/// What to draw: which workers and which stretch of time.
#[derive(Clone, Debug)]
pub struct Choice {
    /// The workers asked for (`--workers`).
    pub selection: Selection,
    /// Start of the window (`--from`); default: the start of the first tick.
    pub from: Option<At>,
    /// End of the window (`--to`); default: the end of the last tick or exit.
    pub to: Option<At>,
}

/// A tick's wait shares by reason (see [`TickPoint::wait_shares`]).
fn wait_shares(
    time: &crate::recording::line::TickTime,
    share: &dyn Fn(f64) -> f64,
) -> [f64; probe_common::wait::WAIT_REASONS] {
    use probe_common::wait::{WAIT_DISK, WAIT_NAMES, WAIT_OTHER};
    let mut shares = [0.0; probe_common::wait::WAIT_REASONS];
    if time.waits.is_empty() {
        shares[WAIT_DISK as usize] = share(time.blocked_io_seconds);
        shares[WAIT_OTHER as usize] = share(time.sleep_seconds);
        return shares;
    }
    for (slot, name) in WAIT_NAMES.iter().enumerate() {
        shares[slot] = time
            .waits
            .get(*name)
            .map_or(0.0, |wait| share(wait.seconds));
    }
    shares
}

/// One node of a recording, as the pictures name it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeView {
    /// Its facts, from its first header.
    pub facts: NodeFacts,
    /// Its wall clock at its worst in the recording (headers and clock lines): unsynchronised
    /// if it ever was, and the largest error it allowed; `None` where never measured.
    pub worst_clock: Option<crate::clock::ClockQuality>,
    /// Stretches (seconds from time 0) between its agent's runs, when nothing was recorded.
    pub unrecorded: Vec<(f64, f64)>,
}

impl NodeView {
    /// Its name.
    pub fn name(&self) -> &str {
        self.facts.display_name()
    }

    /// Its clock in words, at its worst over the recording (not only as its header found
    /// it).
    pub fn clock_text(&self) -> String {
        NodeFacts {
            clock: self.worst_clock,
            ..self.facts.clone()
        }
        .clock_text()
    }

    /// What a picture of several nodes says beside its axis about this node's times, when
    /// its clock may be off by more than a tick against the others' (or was never measured,
    /// or lost synchronisation), e.g. `node-b ± 40 ms`; `None` when within a tick.
    pub fn clock_caveat(&self, tick_seconds: f64) -> Option<String> {
        let name = self.name();
        match self.worst_clock {
            None => Some(format!("{name}: clock error not measured")),
            Some(clock) if !clock.synchronized => Some(format!(
                "{name} ± {} (clock not synchronised)",
                format_error(clock.max_error_seconds)
            )),
            Some(clock) if clock.max_error_seconds > tick_seconds => Some(format!(
                "{name} ± {}",
                format_error(clock.max_error_seconds)
            )),
            Some(_) => None,
        }
    }
}

/// A clock error in a unit that suits it (`40 ms`, `1.5 s`).
fn format_error(seconds: f64) -> String {
    if seconds >= 1.0 {
        format!("{seconds:.1} s")
    } else {
        format!("{:.0} ms", (seconds * 1e3).max(1.0))
    }
}

/// A recording ready to draw.
#[derive(Clone, Debug, PartialEq)]
pub struct Picture {
    /// The node, from the first header (the first of [`Picture::nodes`]).
    pub node: NodeFacts,
    /// Every node, in the order their runs appear (one, unless the recording is merged).
    pub nodes: Vec<NodeView>,
    /// The workerprobe that recorded it.
    pub agent_version: String,
    /// The tick length asked for, seconds.
    pub interval_seconds: f64,
    /// Wall time (RFC 3339) of time 0: the start of the first tick.
    pub origin_time: String,
    /// Time 0 on the first node's monotonic clock, ns.
    pub origin_monotonic_ns: u64,
    /// The window shown, seconds from time 0.
    pub from_seconds: f64,
    /// End of the window, seconds from time 0.
    pub to_seconds: f64,
    /// Every selected worker alive in the window, ordered by start (then path).
    pub workers: Vec<WorkerSeries>,
    /// Lines the reader skipped (damaged or unknown).
    pub skipped_lines: usize,
    /// What every run in the recording measured (a panel of anything else says so).
    pub measured: crate::model::Measured,
}

/// One worker's series in the window.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerSeries {
    /// The node it ran on (its name).
    pub node: String,
    /// cgroup v2 id.
    pub cgroup_id: u64,
    /// Path under the cgroup2 mount (unique: what marks its series in a picture).
    pub path: String,
    /// What a picture calls it: its short name, or its path when another worker of its node
    /// shares the name; with several nodes, `node: name`.
    pub label: String,
    /// Its kind (`cgroup`, `docker`, …), as the recording names it.
    pub kind: String,
    /// Start of its life in the window, seconds from time 0.
    pub start_seconds: f64,
    /// End of its life in the window, seconds from time 0.
    pub end_seconds: f64,
    /// Its exit summary, when it ended during the recording.
    pub exit: Option<ExitRow>,
    /// One per tick it was active in, in time order.
    pub points: Vec<TickPoint>,
    /// On-CPU seconds in the window (from its ticks, or its exit line when it has none).
    pub cpu_seconds: f64,
    /// Bytes sent in the window.
    pub sent_bytes: u64,
    /// Bytes received in the window.
    pub received_bytes: u64,
    /// Highest memory reading in the window, bytes.
    pub peak_memory_bytes: Option<u64>,
}

/// What one worker did in one tick.
#[derive(Clone, Debug, PartialEq)]
pub struct TickPoint {
    /// Start of the tick (clipped to the window), seconds from time 0.
    pub start_seconds: f64,
    /// End of the tick (clipped to the window), seconds from time 0.
    pub end_seconds: f64,
    /// CPUs kept busy on average (1.0 = one core all the time).
    pub cores: f64,
    /// The same per CPU, indexed by CPU number.
    pub cores_per_cpu: Vec<f64>,
    /// Share of the threads' time on a CPU, 0..=1 (the four shares sum to 1, or are all 0).
    pub on_cpu_share: f64,
    /// Share waiting for a CPU.
    pub runqueue_wait_share: f64,
    /// Share blocked on I/O (D state).
    pub blocked_io_share: f64,
    /// Share asleep (S state).
    pub sleep_share: f64,
    /// Blocked plus asleep, by wait reason (`probe_common::wait::WAIT_NAMES` order); sums to
    /// `blocked_io_share + sleep_share`. A recording without reasons has blocked time under
    /// disk and sleep under other.
    pub wait_shares: [f64; probe_common::wait::WAIT_REASONS],
    /// Socket payload sent, bytes per second.
    pub send_bytes_per_second: f64,
    /// Socket payload received, bytes per second.
    pub receive_bytes_per_second: f64,
    /// Memory at the end of the tick, bytes; `None` when no source had it.
    pub memory_bytes: Option<u64>,
}

/// A worker's exit summary, the fields the report's table shows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExitRow {
    /// The node it ran on.
    pub node: String,
    /// Short name.
    pub name: String,
    /// Path under the cgroup2 mount.
    pub path: String,
    /// Kind of worker.
    pub kind: String,
    /// Start, seconds from time 0 (not clipped).
    pub start_seconds: f64,
    /// End, seconds from time 0 (not clipped).
    pub end_seconds: f64,
    /// Wall time of its life, seconds.
    pub wall_seconds: Option<f64>,
    /// On-CPU seconds.
    pub cpu_seconds: Option<f64>,
    /// Average cores used over its life.
    pub cores: Option<f64>,
    /// User-mode seconds (cpu.stat).
    pub user_seconds: Option<f64>,
    /// Kernel-mode seconds (cpu.stat).
    pub system_seconds: Option<f64>,
    /// Run-queue wait, thread-seconds.
    pub runqueue_wait_seconds: Option<f64>,
    /// Blocked on I/O, thread-seconds.
    pub blocked_io_seconds: Option<f64>,
    /// Asleep, thread-seconds.
    pub sleep_seconds: Option<f64>,
    /// Bytes sent.
    pub sent_bytes: Option<u64>,
    /// Bytes received.
    pub received_bytes: Option<u64>,
    /// Peak memory, bytes.
    pub peak_memory_bytes: Option<u64>,
    /// The whole summary as recorded, for the trace's event arguments.
    pub summary: serde_json::Map<String, serde_json::Value>,
}

impl WorkerSeries {
    /// Average cores used over its life in the window: what shades its Gantt bar.
    pub fn average_cores(&self) -> f64 {
        let life_seconds = self.end_seconds - self.start_seconds;
        // A worker too short to be in a tick has only its exit line to go by.
        if self.points.is_empty()
            && let Some(cores) = self.exit.as_ref().and_then(|exit| exit.cores)
        {
            return cores;
        }
        if life_seconds > 0.0 {
            self.cpu_seconds / life_seconds
        } else {
            0.0
        }
    }

    /// Seconds of its threads' time (as a share of each tick, times the tick) spent waiting
    /// on the network or the disk.
    pub fn io_wait_thread_seconds(&self) -> f64 {
        use probe_common::wait::{WAIT_DISK, WAIT_NETWORK};
        self.points
            .iter()
            .map(|point| {
                (point.wait_shares[WAIT_NETWORK as usize] + point.wait_shares[WAIT_DISK as usize])
                    * (point.end_seconds - point.start_seconds)
            })
            .sum()
    }
}

impl Picture {
    /// The `count` busiest workers, busiest first: the ones given their own series when
    /// there are too many to tell apart. A worker's score is its largest share of the
    /// busiest worker's CPU time, bytes, or time waiting on network and disk, so a worker
    /// that only moves bytes or only waits on a store ranks beside the CPU-bound ones.
    pub fn busiest(&self, count: usize) -> Vec<&WorkerSeries> {
        let bytes = |w: &WorkerSeries| (w.sent_bytes + w.received_bytes) as f64;
        let io_wait = |w: &WorkerSeries| w.io_wait_thread_seconds();
        let most = |measure: &dyn Fn(&WorkerSeries) -> f64| {
            self.workers.iter().map(measure).fold(0.0, f64::max)
        };
        let (most_cpu, most_bytes, most_io_wait) =
            (most(&|w| w.cpu_seconds), most(&bytes), most(&io_wait));
        let share = |value: f64, most: f64| if most > 0.0 { value / most } else { 0.0 };
        let score = |w: &WorkerSeries| {
            share(w.cpu_seconds, most_cpu)
                .max(share(bytes(w), most_bytes))
                .max(share(io_wait(w), most_io_wait))
        };
        let mut workers: Vec<&WorkerSeries> = self.workers.iter().collect();
        workers.sort_by(|a, b| {
            score(b)
                .total_cmp(&score(a))
                .then(b.cpu_seconds.total_cmp(&a.cpu_seconds))
                .then(bytes(b).total_cmp(&bytes(a)))
                .then(a.path.cmp(&b.path))
        });
        workers.truncate(count);
        workers
    }

    /// Exit summaries of the workers shown, in order of their end.
    pub fn exits(&self) -> Vec<&ExitRow> {
        let mut exits: Vec<&ExitRow> = self
            .workers
            .iter()
            .filter_map(|worker| worker.exit.as_ref())
            .collect();
        exits.sort_by(|a, b| a.end_seconds.total_cmp(&b.end_seconds));
        exits
    }

    /// What the pictures say beside the axis about nodes whose clocks may be off by more
    /// than a tick against the others'; empty for one node (its own times share one clock).
    pub fn clock_caveats(&self) -> Vec<String> {
        if self.nodes.len() < 2 {
            return Vec::new();
        }
        self.nodes
            .iter()
            .filter_map(|node| node.clock_caveat(self.interval_seconds))
            .collect()
    }

    /// The stretches of `worker`'s node when nothing was recorded.
    pub fn unrecorded_of(&self, worker: &WorkerSeries) -> &[(f64, f64)] {
        self.nodes
            .iter()
            .find(|node| node.name() == worker.node)
            .map_or(&[], |node| &node.unrecorded)
    }

    /// Every node's unrecorded stretches in words (`node-a 3.0s–5.5s`), for a caption.
    pub fn unrecorded_text(&self) -> Option<String> {
        let several = self.nodes.len() > 1;
        let parts: Vec<String> = self
            .nodes
            .iter()
            .flat_map(|node| {
                node.unrecorded.iter().map(move |&(from, to)| {
                    let span = format!(
                        "{}s–{}s",
                        super::format_seconds(from),
                        super::format_seconds(to)
                    );
                    if several {
                        format!("{} {span}", node.name())
                    } else {
                        span
                    }
                })
            })
            .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    /// The node names, joined for a title.
    pub fn node_names(&self) -> String {
        self.nodes
            .iter()
            .map(NodeView::name)
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The highest CPU number any worker used, plus one (at least the node's count).
    pub fn cpu_count(&self) -> usize {
        self.workers
            .iter()
            .flat_map(|worker| &worker.points)
            .map(|point| point.cores_per_cpu.len())
            .max()
            .unwrap_or(0)
            .max(self.node.cpus)
            .max(1)
    }
}

/// Builds the picture of `recording`; the error is one sentence (no ticks, a window outside
/// the recording, no worker matched).
pub fn build(recording: &Recording, choice: &Choice, name: &str) -> Result<Picture, String> {
    // One timeline for every node (see `HeaderLine::timeline_ns`).
    let timeline_ns =
        |segment: &Segment, monotonic_ns: u64| segment.header.timeline_ns(monotonic_ns);
    let Some((first_segment, first_tick)) = recording
        .ticks()
        .min_by_key(|(segment, tick)| timeline_ns(segment, tick.start.monotonic_ns))
    else {
        return Err(format!(
            "{name} holds no ticks: no worker was active while it was recorded"
        ));
    };
    let origin_ns = timeline_ns(first_segment, first_tick.start.monotonic_ns);
    let origin_time = rfc3339_from_unix_ns(u64::try_from(origin_ns).unwrap_or(0));
    let seconds_in = |segment: &Segment, monotonic_ns: u64| {
        (timeline_ns(segment, monotonic_ns) - origin_ns) as f64 / 1e9
    };
    let end_seconds = recording
        .ticks()
        .map(|(segment, tick)| seconds_in(segment, tick.end.monotonic_ns))
        .chain(recording.segments.iter().flat_map(|segment| {
            segment
                .exits
                .iter()
                .filter_map(|exit| moment_ns(exit, "end").map(|ns| seconds_in(segment, ns)))
        }))
        .fold(0.0_f64, f64::max);
    let resolve = |at: At| match at {
        At::FromStart(offset) => offset.as_secs_f64(),
        At::Wall { unix_ns } => (i128::from(unix_ns) - origin_ns) as f64 / 1e9,
    };
    let from_seconds = choice.from.map_or(0.0, resolve);
    let to_seconds = choice.to.map_or(end_seconds, resolve);
    let range =
        || format!("the recording runs from {origin_time} (0s) to {end_seconds:.1}s after it");
    if from_seconds < 0.0 || from_seconds >= end_seconds {
        return Err(format!("--from is outside the recording: {}", range()));
    }
    if to_seconds <= 0.0 || to_seconds > end_seconds + CONTIGUOUS_SECONDS {
        return Err(format!("--to is outside the recording: {}", range()));
    }
    if to_seconds <= from_seconds {
        return Err(format!(
            "--to ({to_seconds:.1}s) must come after --from ({from_seconds:.1}s)"
        ));
    }

    let mut builders = Workers::default();
    let mut points_of: Vec<(usize, TickPoint, f64, u64, u64)> = Vec::new();
    for (segment, tick) in recording.ticks() {
        let node = segment.header.node.display_name();
        let start = seconds_in(segment, tick.start.monotonic_ns);
        let end = seconds_in(segment, tick.end.monotonic_ns);
        if end <= from_seconds || start >= to_seconds {
            continue;
        }
        let clipped = (start.max(from_seconds), end.min(to_seconds));
        // The part of the tick inside the window, for totals over the window.
        let inside = if end > start {
            (clipped.1 - clipped.0) / (end - start)
        } else {
            1.0
        };
        for line in &tick.workers {
            let path = line
                .path
                .clone()
                .unwrap_or_else(|| format!("cgroup {}", line.cgroup_id));
            if !choice
                .selection
                .matches_worker(Some(&path), line.name.as_deref(), &line.ids)
            {
                continue;
            }
            let kind = line
                .kind
                .and_then(|kind| serde_json::to_value(kind).ok())
                .and_then(|value| value.as_str().map(str::to_string));
            let index = builders.index(node, line.cgroup_id, &path, line.name.as_deref(), kind);
            let interval_seconds = if line.interval_seconds > 0.0 {
                line.interval_seconds
            } else {
                (end - start).max(CONTIGUOUS_SECONDS)
            };
            let time = &line.time;
            let thread_seconds = time.on_cpu_seconds
                + time.runqueue_wait_seconds
                + time.blocked_io_seconds
                + time.sleep_seconds;
            let share = |seconds: f64| {
                if thread_seconds > 0.0 {
                    seconds / thread_seconds
                } else {
                    0.0
                }
            };
            let point = TickPoint {
                start_seconds: clipped.0,
                end_seconds: clipped.1,
                cores: line.cpu.seconds / interval_seconds,
                cores_per_cpu: line
                    .cpu
                    .per_cpu_seconds
                    .iter()
                    .map(|seconds| seconds / interval_seconds)
                    .collect(),
                on_cpu_share: share(time.on_cpu_seconds),
                runqueue_wait_share: share(time.runqueue_wait_seconds),
                blocked_io_share: share(time.blocked_io_seconds),
                sleep_share: share(time.sleep_seconds),
                wait_shares: wait_shares(time, &share),
                send_bytes_per_second: line.net.sent_bytes as f64 / interval_seconds,
                receive_bytes_per_second: line.net.received_bytes as f64 / interval_seconds,
                memory_bytes: line.memory.map(|memory| memory.current_bytes),
            };
            points_of.push((
                index,
                point,
                line.cpu.seconds * inside,
                (line.net.sent_bytes as f64 * inside).round() as u64,
                (line.net.received_bytes as f64 * inside).round() as u64,
            ));
        }
    }
    for (index, point, cpu_seconds, sent, received) in points_of {
        let series = &mut builders.series[index];
        series.start_seconds = series.start_seconds.min(point.start_seconds);
        series.end_seconds = series.end_seconds.max(point.end_seconds);
        series.cpu_seconds += cpu_seconds;
        series.sent_bytes += sent;
        series.received_bytes += received;
        if let Some(bytes) = point.memory_bytes {
            series.peak_memory_bytes = Some(series.peak_memory_bytes.unwrap_or(0).max(bytes));
        }
        series.points.push(point);
    }
    for (segment, exit) in recording
        .segments
        .iter()
        .flat_map(|segment| segment.exits.iter().map(move |exit| (segment, exit)))
    {
        let node = segment.header.node.display_name();
        if !choice
            .selection
            .matches_worker(Some(&exit.path), exit.name(), &exit.ids())
        {
            continue;
        }
        let row = exit_row(node, exit, |ns| seconds_in(segment, ns));
        let life = (
            row.start_seconds.max(from_seconds),
            row.end_seconds.min(to_seconds),
        );
        let had_ticks = builders
            .index_of
            .contains_key(&(node.to_owned(), exit.cgroup_id));
        if !had_ticks && life.1 <= life.0 {
            continue; // it lived outside the window
        }
        let name = row.name.clone();
        let kind = row.kind.clone();
        let index = builders.index(
            node,
            exit.cgroup_id,
            &exit.path,
            (!name.is_empty()).then_some(name.as_str()),
            (!kind.is_empty()).then_some(kind),
        );
        let series = &mut builders.series[index];
        if life.1 > life.0 {
            series.start_seconds = life.0;
            series.end_seconds = life.1;
        }
        if !had_ticks {
            series.cpu_seconds = row.cpu_seconds.unwrap_or(0.0);
            series.sent_bytes = row.sent_bytes.unwrap_or(0);
            series.received_bytes = row.received_bytes.unwrap_or(0);
            series.peak_memory_bytes = row.peak_memory_bytes;
        }
        // A worker that ended after the window was alive at its end: no exit there.
        if row.end_seconds <= to_seconds {
            series.exit = Some(row);
        }
    }
    let mut builders = builders.series;
    if builders.is_empty() {
        return Err(if choice.selection.is_all() {
            format!("{name} holds no worker active between {from_seconds:.1}s and {to_seconds:.1}s")
        } else {
            format!(
                "no worker in {name} matches --workers {} between {from_seconds:.1}s and {to_seconds:.1}s",
                choice.selection.patterns().join(" --workers ")
            )
        });
    }
    for series in &mut builders {
        series
            .points
            .sort_by(|a, b| a.start_seconds.total_cmp(&b.start_seconds));
    }
    let mut nodes = node_views(recording);
    for node in &mut nodes {
        node.unrecorded = unrecorded_of(recording, node.facts.display_name(), seconds_in)
            .into_iter()
            .filter(|&(from, to)| to > from_seconds && from < to_seconds)
            .collect();
    }
    disambiguate_labels(&mut builders, nodes.len() > 1);
    // Grouped under their node, in the nodes' order; by start within each.
    let rank = |node: &str| nodes.iter().position(|view| view.name() == node);
    builders.sort_by(|a, b| {
        rank(&a.node)
            .cmp(&rank(&b.node))
            .then(a.start_seconds.total_cmp(&b.start_seconds))
            .then(a.path.cmp(&b.path))
    });
    let header = &recording.segments[0].header;
    let origin_offset_ns = timeline_ns(&recording.segments[0], 0);
    Ok(Picture {
        node: header.node.clone(),
        nodes,
        agent_version: header.agent_version.clone(),
        interval_seconds: header.interval_seconds,
        origin_time,
        origin_monotonic_ns: u64::try_from(origin_ns - origin_offset_ns).unwrap_or(0),
        from_seconds,
        to_seconds,
        workers: builders,
        skipped_lines: recording.skipped_lines,
        measured: recording.segments.iter().fold(
            crate::model::Measured::default(),
            |all, segment| {
                let run = segment.header.measured;
                crate::model::Measured {
                    cpu: all.cpu && run.cpu,
                    switches: all.switches && run.switches,
                    delays: all.delays && run.delays,
                    net: all.net && run.net,
                    lifecycle: all.lifecycle && run.lifecycle,
                    endpoints: all.endpoints && run.endpoints,
                    waits: all.waits && run.waits,
                    splice_reads: all.splice_reads && run.splice_reads,
                    exit_rss: all.exit_rss && run.exit_rss,
                }
            },
        ),
    })
}

/// Every node of the recording, in the order their first runs appear, each at its clock's
/// worst.
fn node_views(recording: &Recording) -> Vec<NodeView> {
    let mut views: Vec<NodeView> = Vec::new();
    for segment in &recording.segments {
        let facts = &segment.header.node;
        let index = match views
            .iter()
            .position(|view| view.name() == facts.display_name())
        {
            Some(index) => index,
            None => {
                views.push(NodeView {
                    facts: facts.clone(),
                    worst_clock: None,
                    unrecorded: Vec::new(),
                });
                views.len() - 1
            }
        };
        let readings = facts
            .clock
            .into_iter()
            .chain(segment.clocks.iter().map(|line| line.clock));
        for clock in readings {
            let worst = &mut views[index].worst_clock;
            *worst = Some(match *worst {
                None => clock,
                Some(seen) => crate::clock::ClockQuality {
                    synchronized: seen.synchronized && clock.synchronized,
                    estimated_error_seconds: seen
                        .estimated_error_seconds
                        .max(clock.estimated_error_seconds),
                    max_error_seconds: seen.max_error_seconds.max(clock.max_error_seconds),
                },
            });
        }
    }
    views
}

/// The workers met so far, in the order they were met.
#[derive(Default)]
struct Workers {
    series: Vec<WorkerSeries>,
    /// By node and cgroup id: ids are only unique on one node.
    index_of: HashMap<(String, u64), usize>,
}

impl Workers {
    /// The index of worker `id` of `node`, added with what its first line says if it is new.
    fn index(
        &mut self,
        node: &str,
        id: u64,
        path: &str,
        name: Option<&str>,
        kind: Option<String>,
    ) -> usize {
        let key = (node.to_owned(), id);
        if let Some(&index) = self.index_of.get(&key) {
            return index;
        }
        self.series.push(WorkerSeries {
            node: node.to_owned(),
            cgroup_id: id,
            path: path.to_string(),
            label: name.unwrap_or(path).to_string(),
            kind: kind.unwrap_or_else(|| "cgroup".into()),
            start_seconds: f64::INFINITY,
            end_seconds: f64::NEG_INFINITY,
            exit: None,
            points: Vec::new(),
            cpu_seconds: 0.0,
            sent_bytes: 0,
            received_bytes: 0,
            peak_memory_bytes: None,
        });
        self.index_of.insert(key, self.series.len() - 1);
        self.series.len() - 1
    }
}

/// Labels shared by several workers of one node become their paths, so every label names
/// one worker; with several nodes each label starts with its node's name.
fn disambiguate_labels(workers: &mut [WorkerSeries], several_nodes: bool) {
    let mut count: HashMap<(String, String), usize> = HashMap::new();
    for worker in workers.iter() {
        *count
            .entry((worker.node.clone(), worker.label.clone()))
            .or_default() += 1;
    }
    for worker in workers.iter_mut() {
        if count[&(worker.node.clone(), worker.label.clone())] > 1 {
            worker.label = worker.path.clone();
        }
        if several_nodes {
            worker.label = format!("{}: {}", worker.node, worker.label);
        }
    }
}

/// `exit[field].monotonic_ns`.
fn moment_ns(exit: &ExitLine, field: &str) -> Option<u64> {
    exit.summary.get(field)?.get("monotonic_ns")?.as_u64()
}

/// The table row of an exit line; fields a damaged line lacks are `None`.
fn exit_row(node: &str, exit: &ExitLine, seconds_of: impl Fn(u64) -> f64) -> ExitRow {
    let summary = &exit.summary;
    let number = |outer: &str, inner: &str| summary.get(outer)?.get(inner)?.as_f64();
    let bytes = |outer: &str, inner: &str| summary.get(outer)?.get(inner)?.as_u64();
    let text = |field: &str| {
        summary
            .get(field)
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let start_seconds = moment_ns(exit, "start").map_or(0.0, &seconds_of);
    let end_seconds = moment_ns(exit, "end").map_or(start_seconds, &seconds_of);
    ExitRow {
        node: node.to_owned(),
        name: text("name"),
        path: exit.path.clone(),
        kind: text("kind"),
        start_seconds,
        end_seconds,
        wall_seconds: summary
            .get("wall_seconds")
            .and_then(serde_json::Value::as_f64),
        cpu_seconds: number("cpu", "total_seconds"),
        cores: number("cpu", "cores"),
        user_seconds: number("cpu", "user_seconds"),
        system_seconds: number("cpu", "system_seconds"),
        runqueue_wait_seconds: number("time", "runqueue_wait_seconds"),
        blocked_io_seconds: number("time", "blocked_io_seconds"),
        sleep_seconds: number("time", "sleep_seconds"),
        sent_bytes: bytes("net", "sent_bytes"),
        received_bytes: bytes("net", "received_bytes"),
        peak_memory_bytes: bytes("memory", "peak_bytes"),
        summary: summary.clone(),
    }
}

/// A per-tick value as staircases of (seconds, value) points: level over each tick,
/// dropping to 0 across a gap in the worker's ticks (ticks it was not active in, when it did
/// nothing), and broken, not dropped, across a stretch of `unrecorded` time (no agent ran:
/// nothing is known there).
pub fn steps(
    points: &[TickPoint],
    unrecorded: &[(f64, f64)],
    value: impl Fn(&TickPoint) -> f64,
) -> Vec<Vec<(f64, f64)>> {
    let mut lines = Vec::new();
    let mut out = Vec::with_capacity(points.len() * 2 + 2);
    let mut previous_end: Option<f64> = None;
    for point in points {
        let level = value(point);
        let stretch = previous_end.and_then(|end| {
            unrecorded.iter().copied().find(|&(from, to)| {
                from >= end - CONTIGUOUS_SECONDS && to <= point.start_seconds + CONTIGUOUS_SECONDS
            })
        });
        match (previous_end, stretch) {
            (Some(end), Some((from, to))) => {
                // Recorded idle time on either side of the stretch is 0; the stretch itself
                // is unknown.
                if from - end > CONTIGUOUS_SECONDS {
                    out.push((end, 0.0));
                    out.push((from, 0.0));
                }
                lines.push(std::mem::take(&mut out));
                if point.start_seconds - to > CONTIGUOUS_SECONDS {
                    out.push((to, 0.0));
                    out.push((point.start_seconds, 0.0));
                }
            }
            (Some(end), None) if point.start_seconds - end > CONTIGUOUS_SECONDS => {
                out.push((end, 0.0));
                out.push((point.start_seconds, 0.0));
            }
            (None, _) => out.push((point.start_seconds, 0.0)),
            (Some(_), None) => {}
        }
        out.push((point.start_seconds, level));
        out.push((point.end_seconds, level));
        previous_end = Some(point.end_seconds);
    }
    if let Some(end) = previous_end {
        out.push((end, 0.0));
        lines.push(out);
    }
    lines
}

/// The stretches (seconds from time 0) between one run of a node's agent and its next, where
/// nothing was recorded: an agent restart, or runs appended to one file.
fn unrecorded_of(
    recording: &Recording,
    node: &str,
    seconds_in: impl Fn(&Segment, u64) -> f64,
) -> Vec<(f64, f64)> {
    // Each run's span: from its start (its header's; a tick's start where the first tick
    // came earlier) to the last moment it wrote anything (a tick's end, a clock reading, an
    // exit). An idle agent writes no ticks, so a run may have lasted longer than its span
    // says: the unrecorded stretch is where nothing shows it ran. Rotated parts continue it.
    let mut spans: Vec<((u64, u64), f64, f64)> = Vec::new();
    for segment in recording
        .segments
        .iter()
        .filter(|segment| segment.header.node.display_name() == node)
    {
        let started = seconds_in(segment, segment.header.started.monotonic_ns);
        let first = segment
            .ticks
            .first()
            .map_or(started, |tick| seconds_in(segment, tick.start.monotonic_ns));
        let last = segment
            .ticks
            .iter()
            .map(|tick| tick.end.monotonic_ns)
            .chain(segment.clocks.iter().map(|line| line.at.monotonic_ns))
            .chain(
                segment
                    .exits
                    .iter()
                    .filter_map(|exit| moment_ns(exit, "end")),
            )
            .max()
            .map_or(started, |ns| seconds_in(segment, ns));
        let span = (started.min(first), last.max(started));
        let run = &segment.header.run_started;
        let run = (run.monotonic_ns, run.wall_unix_ns);
        match spans.iter_mut().find(|(known, _, _)| *known == run) {
            Some((_, from, to)) => {
                *from = from.min(span.0);
                *to = to.max(span.1);
            }
            None => spans.push((run, span.0, span.1)),
        }
    }
    spans.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut gaps = Vec::new();
    let mut covered_to = f64::NEG_INFINITY;
    for (_, from, to) in spans {
        if covered_to.is_finite() && from - covered_to > CONTIGUOUS_SECONDS {
            gaps.push((covered_to, from));
        }
        covered_to = covered_to.max(to);
    }
    gaps
}

/// Memory readings as lines of (seconds, bytes) at each tick's end, broken where a reading
/// is missing and across `unrecorded` stretches.
pub fn memory_lines(points: &[TickPoint], unrecorded: &[(f64, f64)]) -> Vec<Vec<(f64, f64)>> {
    let mut lines: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
    let mut previous_end: Option<f64> = None;
    for point in points {
        if let Some(end) = previous_end
            && unrecorded.iter().any(|&(from, to)| {
                from >= end - CONTIGUOUS_SECONDS && to <= point.start_seconds + CONTIGUOUS_SECONDS
            })
        {
            lines.push(Vec::new());
        }
        previous_end = Some(point.end_seconds);
        match point.memory_bytes {
            Some(bytes) => {
                if let Some(line) = lines.last_mut() {
                    line.push((point.end_seconds, bytes as f64));
                }
            }
            None => lines.push(Vec::new()),
        }
    }
    lines.retain(|line| !line.is_empty());
    lines
}

#[cfg(test)]
pub(crate) mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::recording::reader::parse_recording;

    /// A header line as `record` writes it.
    pub(crate) fn header() -> String {
        json!({
            "type": "header", "schema_version": 1, "format": "workerprobe-recording",
            "agent_version": "0.1.0",
            "node": {"hostname": "vm", "kernel": "6.18", "cpus": 2, "cpu_model": "x",
                     "memory_bytes": 1_u64 << 30, "boot_time_epoch_secs": 1},
            "started": {"monotonic_ns": 1_000_000_000_u64, "wall_unix_ns": 5_000_000_000_u64, "time": "t0"},
            "run_started": {"monotonic_ns": 1_000_000_000_u64, "wall_unix_ns": 5_000_000_000_u64, "time": "t0"},
            "part": 0, "interval_seconds": 1.0, "worker_patterns": [], "programs": ["cpu"]
        })
        .to_string()
    }

    /// Worker `id` (path `/w{id}`) in the tick ending `end_s` seconds after time 0 of the
    /// node's clock (1 s), using `cpu_s` CPU seconds and sending `sent` bytes.
    pub(crate) fn tick(number: u64, id: u64, end_s: u64, cpu_s: f64, sent: u64) -> String {
        let moment = |s: u64| json!({"monotonic_ns": (s + 1) * 1_000_000_000, "wall_unix_ns": (s + 5) * 1_000_000_000, "time": format!("t{s}")});
        json!({
            "type": "tick", "schema_version": 1, "tick": number,
            "start": moment(end_s - 1), "end": moment(end_s), "interval_seconds": 1.0,
            "cgroup_id": id, "path": format!("/w{id}"), "name": format!("w{id}"), "kind": "cgroup",
            "cpu": {"seconds": cpu_s, "per_cpu_seconds": [cpu_s, 0.0], "user_seconds": null,
                    "system_seconds": null, "voluntary_switches": 1, "involuntary_switches": 0},
            "time": {"on_cpu_seconds": cpu_s, "runqueue_wait_seconds": 0.0, "blocked_io_seconds": 0.0,
                     "sleep_seconds": 1.0 - cpu_s, "wakeups": 0, "runqueue_waits": 0},
            "net": {"sent_bytes": sent, "received_bytes": 0, "sent_calls": 1, "received_calls": 0},
            "memory": {"current_bytes": 1000 * id, "peak_bytes": 1000 * id, "source": "rss"},
            "totals": {"on_cpu_ns": 0, "on_cpu_ns_per_cpu": [0, 0], "voluntary_switches": 0,
                       "involuntary_switches": 0, "runqueue_wait_ns": 0, "blocked_io_ns": 0,
                       "sleep_ns": 0, "wakeups": 0, "sent_bytes": 0, "received_bytes": 0, "cpu_stat": null},
            "drops": {}, "drops_total": {}
        })
        .to_string()
    }

    /// The exit line of worker `id`, alive from `start_s` to `end_s` on the node's clock.
    pub(crate) fn exit(id: u64, start_s: f64, end_s: f64) -> String {
        let ns = |s: f64| ((s + 1.0) * 1e9) as u64;
        json!({
            "schema_version": 1, "type": "exit", "cgroup_id": id, "path": format!("/w{id}"),
            "name": format!("w{id}"), "kind": "cgroup", "ids": {},
            "start": {"monotonic_ns": ns(start_s), "time": "s"}, "start_observed": true,
            "end": {"monotonic_ns": ns(end_s), "time": "e"}, "wall_seconds": end_s - start_s,
            "cpu": {"total_seconds": 0.25, "user_seconds": 0.2, "system_seconds": 0.05,
                    "per_cpu_seconds": [0.25], "cores": 0.5},
            "time": {"on_cpu_seconds": 0.25, "runqueue_wait_seconds": 0.01, "blocked_io_seconds": 0.0,
                     "sleep_seconds": 0.2, "wakeups": 1},
            "net": {"sent_bytes": 7, "received_bytes": 9, "sent_calls": 1, "received_calls": 1, "families": {}},
            "memory": {"peak_bytes": 4096, "last_bytes": 2048, "source": "rss"},
            "context_switches": {"voluntary": 1, "involuntary": 0}, "lithops": {}
        })
        .to_string()
    }

    pub(crate) fn recording(lines: &[String]) -> Recording {
        parse_recording("rec.jsonl", lines.join("\n").as_bytes()).expect("parses")
    }

    #[test]
    fn busiest_keeps_a_worker_that_only_moves_bytes() {
        // Three CPU-bound workers and one that only sends: two places, one for the sender.
        let mut lines = vec![header()];
        for id in 1..=3 {
            lines.push(tick(1, id, 2, 0.5 + 0.1 * id as f64, 0));
        }
        lines.push(tick(1, 9, 2, 0.0, 50_000_000));
        let picture = build(&recording(&lines), &everything(), "rec.jsonl").expect("builds");
        let paths: Vec<&str> = picture
            .busiest(2)
            .iter()
            .map(|worker| worker.path.as_str())
            .collect();
        assert_eq!(paths, ["/w3", "/w9"]);
    }

    pub(crate) fn everything() -> Choice {
        Choice {
            selection: Selection::all(),
            from: None,
            to: None,
        }
    }

    /// Three workers: w1 busy throughout, w2 sending in ticks 2 and 4 only, w3 ending
    /// between ticks (exit line only).
    pub(crate) fn sample() -> Recording {
        recording(&[
            header(),
            tick(1, 1, 1, 1.0, 0),
            tick(2, 1, 2, 0.5, 0),
            tick(2, 2, 2, 0.1, 1000),
            tick(3, 1, 3, 0.5, 0),
            tick(4, 1, 4, 0.5, 0),
            tick(4, 2, 4, 0.1, 3000),
            exit(3, 1.5, 2.0),
        ])
    }

    #[test]
    fn workers_get_their_points_lives_and_totals() {
        let picture = build(&sample(), &everything(), "rec.jsonl").expect("builds");
        assert_eq!(picture.from_seconds, 0.0);
        assert_eq!(picture.to_seconds, 4.0);
        let paths: Vec<&str> = picture.workers.iter().map(|w| w.path.as_str()).collect();
        assert_eq!(paths, ["/w1", "/w2", "/w3"], "ordered by start");
        let w1 = &picture.workers[0];
        assert_eq!((w1.start_seconds, w1.end_seconds), (0.0, 4.0));
        assert_eq!(w1.points.len(), 4);
        assert!((w1.cpu_seconds - 2.5).abs() < 1e-9);
        assert!((w1.average_cores() - 0.625).abs() < 1e-9);
        assert_eq!(w1.points[0].cores_per_cpu, vec![1.0, 0.0]);
        assert!((w1.points[1].sleep_share - 0.5).abs() < 1e-9);
        let w2 = &picture.workers[1];
        assert_eq!(w2.sent_bytes, 4000);
        assert_eq!(w2.points[1].send_bytes_per_second, 3000.0);
        assert_eq!(w2.peak_memory_bytes, Some(2000));
        let w3 = &picture.workers[2];
        assert!(w3.points.is_empty());
        assert_eq!((w3.start_seconds, w3.end_seconds), (1.5, 2.0));
        assert_eq!(w3.average_cores(), 0.5);
        assert_eq!(w3.exit.as_ref().and_then(|e| e.sent_bytes), Some(7));
        assert_eq!(picture.exits().len(), 1);
        assert_eq!(picture.busiest(1)[0].path, "/w1");
        assert_eq!(picture.cpu_count(), 2);
    }

    #[test]
    fn a_worker_alive_at_the_windows_end_has_no_exit_in_it() {
        let choice = Choice {
            to: Some(At::FromStart(Duration::from_millis(1800))),
            ..everything()
        };
        let picture = build(&sample(), &choice, "rec.jsonl").expect("builds");
        let w3 = picture
            .workers
            .iter()
            .find(|worker| worker.path == "/w3")
            .expect("w3 lived in the window");
        assert_eq!((w3.start_seconds, w3.end_seconds), (1.5, 1.8));
        assert!(
            w3.exit.is_none(),
            "an exit mark for a worker alive at the end"
        );
        assert!(picture.exits().is_empty());
    }

    #[test]
    fn the_window_clips_ticks_and_lives() {
        let choice = Choice {
            from: Some(At::FromStart(Duration::from_millis(1500))),
            to: Some(At::Wall {
                unix_ns: 8_000_000_000, // 3 s after time 0 on the wall clock
            }),
            ..everything()
        };
        let picture = build(&sample(), &choice, "rec.jsonl").expect("builds");
        assert_eq!((picture.from_seconds, picture.to_seconds), (1.5, 3.0));
        let w1 = &picture.workers[0];
        assert_eq!(w1.points.len(), 2);
        assert_eq!(w1.points[0].start_seconds, 1.5);
        assert!((w1.cpu_seconds - 0.75).abs() < 1e-9, "{}", w1.cpu_seconds);
        assert_eq!(picture.workers.len(), 3);
    }

    #[test]
    fn selection_keeps_matching_workers() {
        let choice = Choice {
            selection: Selection::new(&["/w2".into(), "/w3".into()]).expect("patterns"),
            ..everything()
        };
        let picture = build(&sample(), &choice, "rec.jsonl").expect("builds");
        let paths: Vec<&str> = picture.workers.iter().map(|w| w.path.as_str()).collect();
        assert_eq!(paths, ["/w2", "/w3"]);
        let none = Choice {
            selection: Selection::new(&["/nothing".into()]).expect("pattern"),
            ..everything()
        };
        let message = build(&sample(), &none, "rec.jsonl").expect_err("no worker");
        assert!(
            message.contains("no worker in rec.jsonl matches"),
            "{message}"
        );
    }

    #[test]
    fn bad_windows_and_empty_recordings_are_one_sentence() {
        let at = |s: u64| Some(At::FromStart(Duration::from_secs(s)));
        let window = |from, to| Choice {
            from,
            to,
            ..everything()
        };
        let message = build(&sample(), &window(at(9), None), "r").expect_err("outside");
        assert!(
            message.starts_with("--from is outside the recording"),
            "{message}"
        );
        let message = build(&sample(), &window(None, at(99)), "r").expect_err("outside");
        assert!(message.contains("to 4.0s after it"), "{message}");
        let message = build(&sample(), &window(at(3), at(2)), "r").expect_err("reversed");
        assert!(message.contains("must come after --from"), "{message}");
        let message = build(&recording(&[header()]), &everything(), "r").expect_err("empty");
        assert!(message.starts_with("r holds no ticks"), "{message}");
    }

    #[test]
    fn shared_names_become_paths() {
        let mut picture = build(&sample(), &everything(), "r").expect("builds");
        picture.workers[1].label = "w1".into();
        disambiguate_labels(&mut picture.workers, false);
        assert_eq!(picture.workers[0].label, "/w1");
        assert_eq!(picture.workers[1].label, "/w2");
        assert_eq!(picture.workers[2].label, "w3");
    }

    #[test]
    fn steps_drop_to_zero_across_gaps() {
        let picture = build(&sample(), &everything(), "r").expect("builds");
        let w2 = &picture.workers[1];
        let lines = steps(&w2.points, &[], |p| p.send_bytes_per_second);
        assert_eq!(lines.len(), 1, "one line across a worker's own gap");
        assert_eq!(
            lines[0],
            vec![
                (1.0, 0.0),
                (1.0, 1000.0),
                (2.0, 1000.0),
                (2.0, 0.0),
                (3.0, 0.0),
                (3.0, 3000.0),
                (4.0, 3000.0),
                (4.0, 0.0),
            ]
        );
        let mut points = w2.points.clone();
        points[0].memory_bytes = None;
        assert_eq!(memory_lines(&points, &[]), vec![vec![(4.0, 2000.0)]]);
    }

    /// `line` as node `node`'s: a header renamed (its run `wall_shift_s` later on the wall
    /// clock, its clock as given), any other line tagged as a merge tags it.
    fn of_node(
        line: &str,
        node: &str,
        wall_shift_s: u64,
        clock: Option<serde_json::Value>,
    ) -> String {
        let mut value: serde_json::Value = serde_json::from_str(line).unwrap();
        if value["type"] == "header" {
            value["node"]["name"] = json!(node);
            value["node"]["clock"] = clock.unwrap_or(serde_json::Value::Null);
            for moment in ["started", "run_started"] {
                let wall = value[moment]["wall_unix_ns"].as_u64().unwrap();
                value[moment]["wall_unix_ns"] = json!(wall + wall_shift_s * 1_000_000_000);
            }
        } else {
            value["node"] = json!(node);
        }
        value.to_string()
    }

    #[test]
    fn a_merged_recording_keeps_each_nodes_workers_apart_on_one_timeline() {
        let synced = json!({"synchronized": true, "estimated_error_seconds": 0.0001, "max_error_seconds": 0.002});
        let unsynced = json!({"synchronized": false, "estimated_error_seconds": 0.0, "max_error_seconds": 16.0});
        // Both nodes have a worker with cgroup id 1 (ids are per node); b's run is 2 s
        // later on the wall clock, with the same monotonic readings.
        let lines = vec![
            of_node(&header(), "a", 0, Some(synced)),
            of_node(&header(), "b", 2, Some(unsynced)),
            of_node(&tick(1, 1, 1, 0.5, 0), "a", 0, None),
            of_node(&tick(1, 1, 1, 0.25, 0), "b", 0, None),
            of_node(&tick(2, 1, 2, 0.5, 0), "a", 0, None),
            of_node(&exit(1, 0.0, 1.5), "b", 0, None),
        ];
        let picture = build(&recording(&lines), &everything(), "fleet.jsonl").expect("builds");
        let names: Vec<&str> = picture.nodes.iter().map(NodeView::name).collect();
        assert_eq!(names, ["a", "b"]);
        let rows: Vec<(&str, &str, f64, f64)> = picture
            .workers
            .iter()
            .map(|w| {
                (
                    w.node.as_str(),
                    w.label.as_str(),
                    w.start_seconds,
                    w.cpu_seconds,
                )
            })
            .collect();
        // a's ticks at 0–1 and 1–2 s; b's tick is 2 s later on the shared timeline.
        assert_eq!(rows, [("a", "a: w1", 0.0, 1.0), ("b", "b: w1", 2.0, 0.25)]);
        let b_exit = picture.workers[1].exit.as_ref().expect("b's worker ended");
        assert_eq!((b_exit.node.as_str(), b_exit.end_seconds), ("b", 3.5));
        assert_eq!(
            picture.clock_caveats(),
            ["b ± 16.0 s (clock not synchronised)"]
        );
        // One node's own recording has no caveat: its times share one clock.
        let alone = build(
            &recording(&[header(), tick(1, 1, 1, 0.5, 0)]),
            &everything(),
            "r",
        )
        .expect("builds");
        assert!(alone.clock_caveats().is_empty());
        assert_eq!(alone.workers[0].label, "w1");
    }

    #[test]
    fn time_between_two_runs_is_not_recorded_and_breaks_the_lines() {
        // A run of ticks 1–2 (0–2 s), then the agent is gone until a second run's ticks at
        // 5–6 s (appended to the same file: a header with a later run start).
        let second_run = {
            let mut value: serde_json::Value = serde_json::from_str(&header()).unwrap();
            for moment in ["started", "run_started"] {
                value[moment]["monotonic_ns"] = json!(5_000_000_000_u64);
                value[moment]["wall_unix_ns"] = json!(9_000_000_000_u64);
                value[moment]["time"] = json!("t4");
            }
            value.to_string()
        };
        let lines = vec![
            header(),
            tick(1, 1, 1, 0.5, 0),
            tick(2, 1, 2, 0.5, 0),
            second_run,
            tick(1, 1, 5, 0.25, 0),
            tick(2, 1, 6, 0.25, 0),
        ];
        let picture = build(&recording(&lines), &everything(), "r").expect("builds");
        assert_eq!(picture.nodes[0].unrecorded, [(2.0, 4.0)]);
        assert_eq!(picture.unrecorded_text().as_deref(), Some("2s–4s"));
        let worker = &picture.workers[0];
        let lines = steps(&worker.points, picture.unrecorded_of(worker), |p| p.cores);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert_eq!(
            lines[0].last(),
            Some(&(2.0, 0.5)),
            "the first run's line ends in the air"
        );
        assert_eq!(
            lines[1].first(),
            Some(&(4.0, 0.25)),
            "the second starts where it resumed"
        );
        assert_eq!(
            memory_lines(&worker.points, picture.unrecorded_of(worker)).len(),
            2
        );
        // Idle recorded time on either side of the stretch is drawn at 0 up to it.
        let idle_around = vec![
            lines_of_one_run()[0].clone(),
            tick(1, 1, 1, 0.5, 0),
            tick(2, 2, 2, 0.5, 0),
            lines_of_one_run()[0]
                .replace("\"monotonic_ns\":1000000000", "\"monotonic_ns\":5000000000")
                .replace("\"wall_unix_ns\":5000000000", "\"wall_unix_ns\":9000000000"),
            tick(1, 2, 5, 0.25, 0),
            tick(2, 1, 6, 0.25, 0),
        ];
        let picture = build(&recording(&idle_around), &everything(), "r").expect("builds");
        assert_eq!(picture.nodes[0].unrecorded, [(2.0, 4.0)]);
        let w1 = picture
            .workers
            .iter()
            .find(|w| w.cgroup_id == 1)
            .expect("w1");
        let lines = steps(&w1.points, picture.unrecorded_of(w1), |p| p.cores);
        assert_eq!(
            lines[0][lines[0].len() - 2..],
            [(1.0, 0.0), (2.0, 0.0)],
            "{lines:?}"
        );
        assert_eq!(lines[1][..2], [(4.0, 0.0), (5.0, 0.0)], "{lines:?}");
        // Without the second run, nothing is missing.
        let one_run = build(&recording(&lines_of_one_run()), &everything(), "r").expect("builds");
        assert!(one_run.unrecorded_text().is_none());
    }

    fn lines_of_one_run() -> Vec<String> {
        vec![header(), tick(1, 1, 1, 0.5, 0), tick(2, 1, 2, 0.5, 0)]
    }
}
