//! Merging several nodes' recordings into one, on one wall-clock timeline.
//!
//! Each node's recording is on that node's monotonic clock; its header maps that clock to the
//! wall clock at the run's start (`run_started`). A line's place on the shared timeline is
//! its monotonic moment plus its run's offset (wall − monotonic at the start), so a wall
//! clock stepped during the run does not reorder the node's own lines, and nodes whose
//! clocks disagree are placed as far apart as their clocks say (each node's clock error is
//! carried along in its headers and clock lines, for the pictures to show).
//!
//! The merge streams: each input is read in its own order (a recording is in time order,
//! up to an exit line written a little after the tick that ended it), and the next line out
//! is always the input's whose next line is earliest. Every line but a header gains a
//! `node` field naming its node, which is how a reader routes it to that node's run.

use std::{
    collections::HashMap,
    io::{BufRead, Write},
};

use anyhow::Context as _;
use serde_json::Value;

use super::{
    line::HeaderLine,
    reader::{check_version, first_header, next_line},
};

/// One recording to merge, with the name messages give it.
pub struct MergeInput<R> {
    /// The file's name.
    pub name: String,
    /// Its lines.
    pub reader: R,
}

/// What a merge did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MergeSummary {
    /// Node names, in order of their first line on the timeline.
    pub nodes: Vec<String>,
    /// Lines written (headers included).
    pub lines: usize,
    /// Lines of the inputs skipped: not JSON, cut short, or without a moment.
    pub skipped_lines: usize,
}

/// The next line of one input, placed on the timeline.
struct Pending {
    /// Nanoseconds on the shared timeline (wall-clock scale), never before the input's
    /// previous line.
    at_ns: i128,
    node: String,
    /// For a header, the node's host name.
    host: Option<String>,
    text: Vec<u8>,
}

/// One input being read.
struct Stream<R> {
    name: String,
    reader: R,
    buffer: Vec<u8>,
    /// Per node, its current run's offset: wall − monotonic at the run's start, ns.
    offsets: HashMap<String, i128>,
    /// The node of the latest header (lines without a `node` field are its).
    node: String,
    last_at_ns: i128,
    next: Option<Pending>,
    skipped_lines: usize,
}

/// Merges `inputs` into `out`; the error is one sentence (an input that is no recording, a
/// node held by two inputs at once).
pub fn merge<R: BufRead>(
    inputs: Vec<MergeInput<R>>,
    out: &mut impl Write,
) -> anyhow::Result<MergeSummary> {
    let mut streams = Vec::with_capacity(inputs.len());
    for input in inputs {
        streams.push(Stream::open(input)?);
    }
    let mut summary = MergeSummary::default();
    // Per node: the input its lines last came from, and that input's host.
    let mut source_of: HashMap<String, usize> = HashMap::new();
    // (node, input) whose run of that node another input's run took over, by that input.
    let mut closed: HashMap<(String, usize), usize> = HashMap::new();
    let mut host_of: HashMap<String, (String, usize)> = HashMap::new();
    // The input whose next line is earliest (the first given, on a tie).
    let earliest = |streams: &[Stream<R>]| {
        streams
            .iter()
            .enumerate()
            .filter_map(|(index, stream)| Some((index, stream.next.as_ref()?.at_ns)))
            .min_by_key(|&(index, at_ns)| (at_ns, index))
            .map(|(index, _)| index)
    };
    while let Some(index) = earliest(&streams) {
        let pending = streams[index].next.take().expect("chosen for its line");
        // A node's run is one input's: once another input's run of that node has begun, a
        // further line of the earlier run means both ran at once (a reader could not tell
        // their lines apart). A new run (a header) may come from any input.
        let key = (pending.node.clone(), index);
        if pending.host.is_some() {
            closed.remove(&key);
        } else if let Some(&taker) = closed.get(&key) {
            return Err(node_twice(
                &pending.node,
                &streams[index].name,
                &streams[taker].name,
            ));
        }
        if let Some(previous) = source_of.insert(pending.node.clone(), index)
            && previous != index
        {
            closed.insert((pending.node.clone(), previous), index);
        }
        if let Some(host) = &pending.host {
            match host_of.get(&pending.node) {
                Some((known, first)) if known != host => {
                    return Err(node_twice(
                        &pending.node,
                        &streams[*first].name,
                        &streams[index].name,
                    ));
                }
                Some(_) => {}
                None => {
                    host_of.insert(pending.node.clone(), (host.clone(), index));
                }
            }
        }
        if !summary.nodes.contains(&pending.node) {
            summary.nodes.push(pending.node.clone());
        }
        out.write_all(&pending.text)
            .and_then(|()| out.write_all(b"\n"))
            .context("writing the merged recording")?;
        summary.lines += 1;
        streams[index].advance()?;
    }
    summary.skipped_lines = streams.iter().map(|stream| stream.skipped_lines).sum();
    Ok(summary)
}

fn node_twice(node: &str, first: &str, second: &str) -> anyhow::Error {
    crate::error::UserError::BadInput(format!(
        "{first} and {second} both hold node `{node}` at the same time: record each node with its own --node-name (two agents on one host both default to its host name)"
    ))
    .into()
}

impl<R: BufRead> Stream<R> {
    /// Reads the input's header (refusing a file that is no recording) as its first line.
    fn open(input: MergeInput<R>) -> anyhow::Result<Self> {
        let mut stream = Self {
            name: input.name,
            reader: input.reader,
            buffer: Vec::new(),
            offsets: HashMap::new(),
            node: String::new(),
            last_at_ns: i128::MIN,
            next: None,
            skipped_lines: 0,
        };
        // Blank lines before the header are skipped, as the reader skips them.
        let whole = loop {
            let whole = next_line(&mut stream.reader, &mut stream.buffer)
                .with_context(|| format!("reading the recording {}", stream.name))?;
            if whole.is_none() || !stream.buffer.trim_ascii().is_empty() {
                break whole;
            }
        };
        let text = stream.buffer.trim_ascii().to_vec();
        // An empty file is refused as the reader refuses it: not a recording.
        let header = first_header(&stream.name, &text, whole.unwrap_or(false))?;
        stream.next = Some(stream.place_header(&header, text));
        Ok(stream)
    }

    /// A header on the timeline: it starts its node's run.
    fn place_header(&mut self, header: &HeaderLine, text: Vec<u8>) -> Pending {
        let offset_ns = header.timeline_ns(0);
        let node = header.node.display_name().to_owned();
        self.offsets.insert(node.clone(), offset_ns);
        self.node = node.clone();
        let at_ns = (i128::from(header.started.monotonic_ns) + offset_ns).max(self.last_at_ns);
        self.last_at_ns = at_ns;
        Pending {
            at_ns,
            node,
            host: Some(header.node.hostname.clone()),
            text,
        }
    }

    /// Reads the input's next line that has a moment; `next` is `None` at its end.
    fn advance(&mut self) -> anyhow::Result<()> {
        loop {
            let Some(whole) = next_line(&mut self.reader, &mut self.buffer)
                .with_context(|| format!("reading the recording {}", self.name))?
            else {
                self.next = None;
                return Ok(());
            };
            let text = self.buffer.trim_ascii();
            if text.is_empty() {
                continue;
            }
            let parsed = if whole {
                serde_json::from_slice::<Value>(text).ok()
            } else {
                None
            };
            let Some(mut value) = parsed else {
                self.skipped_lines += 1;
                continue;
            };
            if value["type"] == "header" {
                check_version(
                    &self.name,
                    value["schema_version"].as_u64().unwrap_or(u64::MAX),
                )?;
                let Ok(header) = serde_json::from_value::<HeaderLine>(value) else {
                    self.skipped_lines += 1;
                    continue;
                };
                let text = text.to_vec();
                self.next = Some(self.place_header(&header, text));
                return Ok(());
            }
            let node = match value["node"].as_str() {
                Some(node) => node.to_owned(),
                None => self.node.clone(),
            };
            let (Some(monotonic_ns), Some(&offset_ns)) =
                (line_monotonic_ns(&value), self.offsets.get(&node))
            else {
                // No moment (a type this version does not know), or a node without a header.
                self.skipped_lines += 1;
                continue;
            };
            let at_ns = (i128::from(monotonic_ns) + offset_ns).max(self.last_at_ns);
            self.last_at_ns = at_ns;
            value["node"] = Value::String(node.clone());
            let text = serde_json::to_vec(&value).context("writing the merged recording")?;
            self.next = Some(Pending {
                at_ns,
                node,
                host: None,
                text,
            });
            return Ok(());
        }
    }
}

/// Where a line sits on its node's monotonic clock: a tick at its end, an exit at the
/// worker's end, a clock reading when it was taken.
fn line_monotonic_ns(value: &Value) -> Option<u64> {
    let moment = match value["type"].as_str()? {
        "tick" | "exit" => &value["end"],
        "clock" => &value["at"],
        _ => return None,
    };
    moment["monotonic_ns"].as_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header of `node` whose run started at monotonic `mono_s`, wall `wall_s`.
    fn header(node: &str, host: &str, mono_s: u64, wall_s: u64) -> String {
        let moment = |mono: u64, wall: u64| {
            format!(
                r#"{{"monotonic_ns":{},"wall_unix_ns":{},"time":"t"}}"#,
                mono * 1_000_000_000,
                wall * 1_000_000_000
            )
        };
        format!(
            r#"{{"type":"header","schema_version":3,"format":"workerprobe-recording","agent_version":"0.1.0","node":{{"name":"{node}","hostname":"{host}","kernel":"6.18","cpus":2,"cpu_model":"x","memory_bytes":1,"boot_time_epoch_secs":1}},"started":{},"run_started":{},"part":0,"interval_seconds":1.0,"worker_patterns":[],"programs":["cpu"]}}"#,
            moment(mono_s, wall_s),
            moment(mono_s, wall_s)
        )
    }

    fn tick(mono_s: u64, id: u64) -> String {
        format!(
            r#"{{"type":"tick","tick":1,"cgroup_id":{id},"end":{{"monotonic_ns":{}}}}}"#,
            mono_s * 1_000_000_000
        )
    }

    fn run(files: &[(&str, String)]) -> anyhow::Result<(MergeSummary, Vec<Value>)> {
        let inputs = files
            .iter()
            .map(|(name, text)| MergeInput {
                name: (*name).to_owned(),
                reader: std::io::Cursor::new(text.clone().into_bytes()),
            })
            .collect();
        let mut out = Vec::new();
        let summary = merge(inputs, &mut out)?;
        let lines = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        Ok((summary, lines))
    }

    #[test]
    fn lines_of_two_nodes_are_placed_by_their_own_clocks() {
        // Node a booted 1000 s before its run (wall 5000), node b 10 s before (wall 5002):
        // b's tick at its monotonic 13 s is wall 5005, after a's at 1003 (wall 5003).
        let a = [
            header("a", "h1", 1000, 5000),
            tick(1003, 7),
            tick(1006, 7),
            "not json".to_owned(),
        ]
        .join("\n");
        let b = [header("b", "h2", 10, 5002), tick(13, 7)].join("\n");
        let (summary, lines) = run(&[("a.jsonl", a), ("b.jsonl", b)]).unwrap();
        assert_eq!(summary.nodes, ["a", "b"]);
        assert_eq!((summary.lines, summary.skipped_lines), (5, 1));
        let order: Vec<(String, String)> = lines
            .iter()
            .map(|line| {
                let node = line["node"]
                    .as_str()
                    .or(line["node"]["name"].as_str())
                    .unwrap();
                (line["type"].as_str().unwrap().to_owned(), node.to_owned())
            })
            .collect();
        let expected = [
            ("header", "a"),
            ("header", "b"),
            ("tick", "a"),
            ("tick", "b"),
            ("tick", "a"),
        ];
        assert_eq!(
            order,
            expected.map(|(kind, node)| (kind.to_owned(), node.to_owned()))
        );
    }

    #[test]
    fn one_node_in_two_inputs_at_once_is_refused_and_in_turn_is_merged() {
        let first = [header("n", "h", 0, 100), tick(1, 1), tick(2, 1)].join("\n");
        let overlapping = [header("n", "h", 0, 101), tick(2, 1)].join("\n");
        let err = run(&[("x.jsonl", first.clone()), ("y.jsonl", overlapping)]).unwrap_err();
        assert!(
            err.to_string()
                .contains("x.jsonl and y.jsonl both hold node `n`"),
            "{err}"
        );
        let other_host = [header("n", "elsewhere", 500, 600), tick(501, 1)].join("\n");
        let err = run(&[("x.jsonl", first.clone()), ("z.jsonl", other_host)]).unwrap_err();
        assert!(err.to_string().contains("both hold node `n`"), "{err}");
        // Runs 1 and 3 in one file, run 2 in another: in turn, fine.
        let one_and_three = [
            header("n", "h", 0, 100),
            tick(1, 1),
            header("n", "h", 20, 140),
            tick(21, 1),
        ]
        .join("\n");
        let two = ["".to_owned(), header("n", "h", 10, 120), tick(11, 1)].join("\n");
        let (_, lines) = run(&[("odd.jsonl", one_and_three), ("even.jsonl", two)]).unwrap();
        let walls: Vec<i128> = lines
            .iter()
            .filter(|line| line["type"] == "header")
            .map(|line| i128::from(line["run_started"]["wall_unix_ns"].as_u64().unwrap()))
            .collect();
        assert_eq!(walls, [100, 120, 140].map(|s| s * 1_000_000_000));
        // The same node's next run, in another file (a rotated part, a restart): fine.
        let later = [header("n", "h", 10, 110), tick(11, 1)].join("\n");
        let (summary, lines) = run(&[("later.jsonl", later), ("x.jsonl", first)]).unwrap();
        assert_eq!(summary.nodes, ["n"]);
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[3]["type"], "header");
    }

    #[test]
    fn a_file_that_is_not_a_recording_is_refused() {
        let err = run(&[("x.txt", "hello".to_owned())]).unwrap_err();
        assert!(
            err.to_string()
                .contains("x.txt is not a workerprobe recording"),
            "{err}"
        );
    }
}
