//! Reading a recording: tolerant, line by line, into segments of ticks and exits.
//!
//! A line that is not JSON, or has a type this version does not know, is skipped and counted;
//! it never stops the reading. A file that is empty, or whose first line is not a recording
//! header, or that a newer workerprobe wrote, is refused with one sentence.

use std::{
    fs::File,
    io::{BufRead, BufReader},
    path::Path,
};

use anyhow::Context as _;

use super::line::{
    ClockLine, ExitLine, FORMAT, HeaderLine, Line, Moment, SCHEMA_VERSION, TickLine,
};
use crate::model::{Interval, Measured, Sample, diff};

/// Longest line kept; anything longer is no line a recorder writes (a foreign or damaged
/// file), and is skipped without holding it in memory.
const MAX_LINE_BYTES: usize = 4 << 20;

/// A whole recording file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recording {
    /// One per header line: a run, or a part of a run after a rotation.
    pub segments: Vec<Segment>,
    /// Lines skipped: not JSON, cut short, or of an unknown type.
    pub skipped_lines: usize,
}

/// What follows one header line, up to the next.
#[derive(Clone, Debug, PartialEq)]
pub struct Segment {
    /// The header.
    pub header: HeaderLine,
    /// Ticks with at least one active worker, in file order.
    pub ticks: Vec<Tick>,
    /// Workers that ended, in file order.
    pub exits: Vec<ExitLine>,
    /// The clock's quality as noted along the way (the header has it at the start).
    pub clocks: Vec<ClockLine>,
}

/// The lines of one tick.
#[derive(Clone, Debug, PartialEq)]
pub struct Tick {
    /// Tick number in the run.
    pub number: u64,
    /// Start of the interval.
    pub start: Moment,
    /// End of the interval.
    pub end: Moment,
    /// What the run measured (from its header).
    pub measured: Measured,
    /// One line per worker active in it.
    pub workers: Vec<TickLine>,
}

impl Tick {
    /// The cumulative samples at the start and end of the tick, as the recorder's collector
    /// read them, for the workers active in it.
    pub fn samples(&self) -> (Sample, Sample) {
        let mut before = Sample {
            taken_at: Some(self.start.timestamp()),
            measured: self.measured,
            ..Sample::default()
        };
        let mut after = Sample {
            taken_at: Some(self.end.timestamp()),
            measured: self.measured,
            ..Sample::default()
        };
        for line in &self.workers {
            before
                .workers
                .insert(line.cgroup_id, line.counters_before());
            after.workers.insert(line.cgroup_id, line.counters_after());
        }
        if let Some(line) = self.workers.first() {
            before.drops = line.drops_before();
            after.drops = line.drops_after();
        }
        (before, after)
    }

    /// What each worker did in the tick, through the same `model::diff` as `top`, with the
    /// memory the recorder read at its end.
    pub fn interval(&self) -> Interval {
        let (before, after) = self.samples();
        let mut interval = diff(Some(&before), &after);
        for worker in &mut interval.workers {
            worker.memory = self
                .workers
                .iter()
                .find(|line| line.cgroup_id == worker.cgroup_id)
                .and_then(|line| line.memory);
        }
        interval
    }
}

impl Recording {
    /// Every tick of every segment, in file order, with its segment.
    pub fn ticks(&self) -> impl Iterator<Item = (&Segment, &Tick)> {
        self.segments
            .iter()
            .flat_map(|segment| segment.ticks.iter().map(move |tick| (segment, tick)))
    }
}

/// Reads the recording at `path`.
pub fn read_recording(path: &Path) -> anyhow::Result<Recording> {
    let file = File::open(path)
        .with_context(|| format!("cannot open the recording {}", path.display()))?;
    parse_recording(&path.display().to_string(), BufReader::new(file))
}

/// Whether `record` may write to `path`: a missing or empty file always; a file with data only
/// with `append`, and only if it is a recording (its first line is a header this version
/// reads). Otherwise one sentence saying what to do.
pub fn check_writable_recording(path: &Path, append: bool) -> anyhow::Result<()> {
    let name = path.display().to_string();
    // Missing is fine; any other failure to open it the writer's own open says.
    let Ok(file) = File::open(path) else {
        return Ok(());
    };
    let mut reader = BufReader::new(file);
    let mut buffer = Vec::new();
    loop {
        let whole = match next_line(&mut reader, &mut buffer) {
            Ok(Some(whole)) => whole,
            // Empty, or unreadable (the writer's open then says why).
            Ok(None) | Err(_) => return Ok(()),
        };
        let text = buffer.trim_ascii();
        if text.is_empty() {
            continue;
        }
        let is_recording = first_header(&name, text, whole).is_ok();
        return match (is_recording, append) {
            (true, true) => Ok(()),
            (true, false) => Err(crate::error::UserError::BadInput(format!(
                "--out {name} already holds a recording: add --append to add this run to it, or give another --out"
            ))
            .into()),
            (false, _) => Err(crate::error::UserError::BadInput(format!(
                "--out {name} holds data that is not a workerprobe recording this version reads: give another --out"
            ))
            .into()),
        };
    }
}

/// Reads a recording from `reader`; `name` names it in messages.
pub fn parse_recording(name: &str, mut reader: impl BufRead) -> anyhow::Result<Recording> {
    let mut recording = Recording::default();
    let mut buffer = Vec::new();
    // Each node's latest segment, by its name.
    let mut latest_of_node: std::collections::HashMap<String, usize> = Default::default();
    loop {
        let Some(whole) = next_line(&mut reader, &mut buffer)
            .with_context(|| format!("reading the recording {name}"))?
        else {
            break;
        };
        let text = buffer.trim_ascii();
        if text.is_empty() {
            continue;
        }
        if recording.segments.is_empty() {
            let header = first_header(name, text, whole)?;
            latest_of_node.insert(header.node.display_name().to_owned(), 0);
            recording.segments.push(Segment::new(header));
            continue;
        }
        let line = if whole {
            serde_json::from_slice::<Line>(text).ok()
        } else {
            None
        };
        // A merged recording's line names its node: it is of that node's latest run.
        let node = match &line {
            Some(Line::Tick(tick)) => tick.node.as_deref(),
            Some(Line::Exit(exit)) => exit.node.as_deref(),
            Some(Line::Clock(clock)) => clock.node.as_deref(),
            _ => None,
        };
        let index = match node {
            Some(node) => match latest_of_node.get(node) {
                Some(&index) => index,
                None => {
                    recording.skipped_lines += 1;
                    continue;
                }
            },
            None => recording.segments.len() - 1,
        };
        let segment = &mut recording.segments[index];
        match line {
            Some(Line::Header(header)) => {
                check_version(name, u64::from(header.schema_version))?;
                latest_of_node.insert(
                    header.node.display_name().to_owned(),
                    recording.segments.len(),
                );
                recording.segments.push(Segment::new(*header));
            }
            Some(Line::Tick(tick)) => segment.push_tick(*tick),
            Some(Line::Exit(exit)) => segment.exits.push(*exit),
            Some(Line::Clock(clock)) => segment.clocks.push(*clock),
            Some(Line::Unknown) | None => recording.skipped_lines += 1,
        }
    }
    if recording.segments.is_empty() {
        return Err(crate::error::UserError::BadInput(format!("{name} is empty: it holds no recording; give a file that `workerprobe record --out FILE` wrote")).into());
    }
    Ok(recording)
}

/// Tells on stderr how many corrupt lines reading skipped, if any.
pub fn tell_skipped(recording: &Recording, name: &str) {
    let skipped = recording.skipped_lines;
    if skipped > 0 {
        crate::say!(
            "workerprobe: skipped {skipped} corrupt line{} in {name}",
            if skipped == 1 { "" } else { "s" }
        );
    }
}

impl Segment {
    fn new(header: HeaderLine) -> Self {
        Self {
            header,
            ticks: Vec::new(),
            exits: Vec::new(),
            clocks: Vec::new(),
        }
    }

    /// Adds a line to its tick: the lines of one tick are written together.
    fn push_tick(&mut self, line: TickLine) {
        match self.ticks.last_mut() {
            Some(tick) if tick.number == line.tick && tick.end == line.end => {
                tick.workers.push(line)
            }
            _ => self.ticks.push(Tick {
                number: line.tick,
                start: line.start.clone(),
                end: line.end.clone(),
                measured: self.header.measured,
                workers: vec![line],
            }),
        }
    }
}

/// The header a recording must start with.
pub(super) fn first_header(name: &str, text: &[u8], whole: bool) -> anyhow::Result<HeaderLine> {
    let not_a_recording = || {
        anyhow::Error::from(crate::error::UserError::BadInput(format!(
            "{name} is not a workerprobe recording (its first line is not a header): give a file that `workerprobe record --out FILE` wrote"
        )))
    };
    let value: serde_json::Value = if whole {
        serde_json::from_slice(text).map_err(|_| not_a_recording())?
    } else {
        return Err(not_a_recording());
    };
    if value["type"] != "header" || value["format"] != FORMAT {
        return Err(not_a_recording());
    }
    check_version(name, value["schema_version"].as_u64().unwrap_or(0))?;
    serde_json::from_value(value).map_err(|err| {
        anyhow::Error::from(crate::error::UserError::BadInput(format!(
            "{name} has a damaged header line ({err}): it cannot be replayed"
        )))
    })
}

pub(super) fn check_version(name: &str, version: u64) -> anyhow::Result<()> {
    if version > u64::from(SCHEMA_VERSION) {
        return Err(crate::error::UserError::BadInput(format!("{name} was recorded with schema version {version}, newer than the {SCHEMA_VERSION} this workerprobe reads: replay it with a newer workerprobe")).into());
    }
    Ok(())
}

/// Reads the next line into `buffer` (without its newline). Returns `None` at the end,
/// `Some(true)` for a line held whole, `Some(false)` for one longer than
/// [`MAX_LINE_BYTES`] (only its start is kept).
pub(super) fn next_line(
    reader: &mut impl BufRead,
    buffer: &mut Vec<u8>,
) -> std::io::Result<Option<bool>> {
    buffer.clear();
    let mut too_long = false;
    let mut read_any = false;
    loop {
        let available = match reader.fill_buf() {
            Ok(available) => available,
            Err(err) if err.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(err),
        };
        if available.is_empty() {
            // End of file. A last line without its newline may have been cut short by a
            // kill; parsing tells: an object cut short lacks its closing brace.
            return Ok(read_any.then_some(!too_long));
        }
        read_any = true;
        let (chunk, found) = match available.iter().position(|&b| b == b'\n') {
            Some(end) => (&available[..end], true),
            None => (available, false),
        };
        let room = MAX_LINE_BYTES.saturating_sub(buffer.len());
        if chunk.len() > room {
            too_long = true;
        }
        buffer.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let used = chunk.len() + usize::from(found);
        reader.consume(used);
        if found {
            return Ok(Some(!too_long));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = r#"{"type":"header","schema_version":1,"format":"workerprobe-recording","agent_version":"0.1.0","node":{"hostname":"vm","kernel":"6.18","cpus":2,"cpu_model":"x","memory_bytes":1,"boot_time_epoch_secs":1},"started":{"monotonic_ns":1,"wall_unix_ns":1,"time":"1970-01-01T00:00:00.000000001Z"},"run_started":{"monotonic_ns":1,"wall_unix_ns":1,"time":"1970-01-01T00:00:00.000000001Z"},"part":0,"interval_seconds":1.0,"worker_patterns":[],"programs":["cpu"]}"#;

    fn tick_line(tick: u64, id: u64, end_s: u64, total_ns: u64) -> String {
        let start_s = end_s - 1;
        format!(
            concat!(
                r#"{{"type":"tick","schema_version":1,"tick":{tick},"#,
                r#""start":{{"monotonic_ns":{start},"wall_unix_ns":{start},"time":"x"}},"#,
                r#""end":{{"monotonic_ns":{end},"wall_unix_ns":{end},"time":"y"}},"#,
                r#""interval_seconds":1.0,"cgroup_id":{id},"path":"/w{id}","name":"w","kind":"cgroup","#,
                r#""cpu":{{"seconds":0.5,"per_cpu_seconds":[0.5,0.0],"user_seconds":null,"system_seconds":null,"voluntary_switches":1,"involuntary_switches":0}},"#,
                r#""time":{{"on_cpu_seconds":0.5,"runqueue_wait_seconds":0.0,"blocked_io_seconds":0.0,"sleep_seconds":0.0,"wakeups":0,"runqueue_waits":0}},"#,
                r#""net":{{"sent_bytes":0,"received_bytes":0,"sent_calls":0,"received_calls":0}},"#,
                r#""memory":null,"#,
                r#""totals":{{"on_cpu_ns":{total},"on_cpu_ns_per_cpu":[{total},0],"voluntary_switches":5,"involuntary_switches":0,"runqueue_wait_ns":0,"blocked_io_ns":0,"sleep_ns":0,"wakeups":0,"sent_bytes":0,"received_bytes":0,"cpu_stat":null}},"#,
                r#""drops":{{}},"drops_total":{{}}}}"#
            ),
            tick = tick,
            id = id,
            start = start_s * 1_000_000_000,
            end = end_s * 1_000_000_000,
            total = total_ns,
        )
    }

    fn parse(text: &str) -> anyhow::Result<Recording> {
        parse_recording("rec.jsonl", text.as_bytes())
    }

    #[test]
    fn ticks_group_their_workers_and_rebuild_the_interval() {
        let text = [
            HEADER.to_string(),
            tick_line(1, 7, 10, 500_000_000),
            tick_line(1, 8, 10, 700_000_000),
            tick_line(2, 7, 11, 1_000_000_000),
        ]
        .join("\n")
            + "\n";
        let recording = parse(&text).expect("reads");
        assert_eq!(recording.skipped_lines, 0);
        let ticks: Vec<_> = recording.ticks().collect();
        assert_eq!(ticks.len(), 2);
        assert_eq!(ticks[0].1.workers.len(), 2);
        let interval = ticks[1].1.interval();
        assert_eq!(interval.duration_ns(), 1_000_000_000);
        let worker = &interval.workers[0];
        assert_eq!(worker.cpu_ns_per_cpu, vec![500_000_000, 0]);
        assert_eq!(worker.total_cpu_ns, 1_000_000_000);
        assert_eq!(worker.voluntary_switches, 1);
    }

    #[test]
    fn corrupt_and_unknown_lines_are_skipped_and_counted() {
        let mut cut = tick_line(3, 7, 12, 1_500_000_000);
        cut.truncate(cut.len() / 2);
        let text = [
            HEADER.to_string(),
            tick_line(1, 7, 10, 500_000_000),
            "{not json at all".to_string(),
            "\u{0}\u{1}binary".to_string(),
            r#"{"type":"plot","schema_version":1}"#.to_string(),
            r#"{"type":"tick","schema_version":1}"#.to_string(),
            String::new(),
            tick_line(2, 7, 11, 1_000_000_000),
            cut,
        ]
        .join("\n");
        let recording = parse(&text).expect("reads");
        assert_eq!(recording.skipped_lines, 5);
        assert_eq!(recording.ticks().count(), 2);
    }

    #[test]
    fn clock_lines_are_kept_with_their_segment() {
        let clock = r#"{"type":"clock","schema_version":3,"at":{"monotonic_ns":2,"wall_unix_ns":2,"time":"1970-01-01T00:00:00.000000002Z"},"clock":{"synchronized":false,"estimated_error_seconds":0.016,"max_error_seconds":16.0}}"#;
        let text = [
            HEADER.to_string(),
            clock.to_string(),
            tick_line(1, 7, 10, 500_000_000),
        ]
        .join("\n");
        let recording = parse(&text).expect("reads");
        assert_eq!(recording.skipped_lines, 0);
        let clocks = &recording.segments[0].clocks;
        assert_eq!(clocks.len(), 1);
        assert!(!clocks[0].clock.synchronized);
        assert_eq!(clocks[0].clock.max_error_seconds, 16.0);
        // The header's node has no name or clock in a recording made before they were kept.
        assert_eq!(recording.segments[0].header.node.display_name(), "vm");
        assert_eq!(recording.segments[0].header.node.clock, None);
    }

    #[test]
    fn an_unterminated_last_line_that_is_whole_is_kept() {
        let text = format!("{HEADER}\n{}", tick_line(1, 7, 10, 500_000_000));
        let recording = parse(&text).expect("reads");
        assert_eq!(recording.skipped_lines, 0);
        assert_eq!(recording.ticks().count(), 1);
    }

    #[test]
    fn several_headers_make_several_segments() {
        let text = [
            HEADER.to_string(),
            tick_line(1, 7, 10, 500_000_000),
            HEADER.to_string(),
            tick_line(1, 7, 20, 400_000_000),
        ]
        .join("\n");
        let recording = parse(&text).expect("reads");
        assert_eq!(recording.segments.len(), 2);
        assert_eq!(recording.ticks().count(), 2);
    }

    #[test]
    fn empty_foreign_and_newer_files_are_refused_with_a_sentence() {
        let message = |text: &str| format!("{:#}", parse(text).expect_err("refused"));
        assert!(message("").contains("rec.jsonl is empty"));
        assert!(message("\n  \n").contains("is empty"));
        let foreign = message("[package]\nname = \"x\"\n");
        assert!(
            foreign.contains(
                "rec.jsonl is not a workerprobe recording (its first line is not a header)"
            ),
            "{foreign}"
        );
        assert!(message(r#"{"type":"header","schema_version":1}"#).contains("not a workerprobe"));
        assert!(message(r#"{"type":"exit"}"#).contains("not a workerprobe"));
        let newer = HEADER.replace(r#""schema_version":1"#, r#""schema_version":9"#);
        assert!(message(&newer).contains("schema version 9, newer than the 4"));
        let mut cut = HEADER.to_string();
        cut.truncate(40);
        assert!(message(&cut).contains("not a workerprobe"));
    }

    #[test]
    fn overlong_lines_are_skipped_without_being_kept() {
        let long = format!(
            "{{\"type\":\"tick\",\"x\":\"{}\"}}",
            "a".repeat(MAX_LINE_BYTES + 10)
        );
        let text = format!("{HEADER}\n{long}\n{}\n", tick_line(1, 7, 10, 1));
        let recording = parse(&text).expect("reads");
        assert_eq!(recording.skipped_lines, 1);
        assert_eq!(recording.ticks().count(), 1);
    }
}
