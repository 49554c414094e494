//! `workerprobe trace`: a [`Picture`] as Chrome / Perfetto trace-event JSON (the "JSON object
//! format": `{"traceEvents": [...], "displayTimeUnit": "ms"}`), which ui.perfetto.dev and
//! chrome://tracing open.
//!
//! Layout: process 1 + n, "workerprobe node NAME" for the recording's n-th node (one, unless
//! it is merged; with several, the name says how far its clock may be off when that is more
//! than a tick), holds one thread per worker of the node (ordered by start) with one complete
//! event (`"ph":"X"`) spanning its life, and an instant event `exit` (with the exit summary
//! as arguments) when it ended: together, a Gantt of the workers. Each worker's counters
//! are in a process of their own (after the nodes', one per row), named "LABEL counters",
//! so its tracks stay together: `cores`, `time shares %` (on CPU /
//! run-queue / blocked I/O / sleep), `net bytes/s` (send / receive) and `memory bytes`.
//! A counter holds its value until the next event, so a rate is set at its tick's start and
//! put back to 0 where the worker's ticks stop. Timestamps are µs on the node's monotonic
//! clock from the start of the first tick; events are sorted by `ts`, metadata first.

use serde_json::{Value, json};

use super::series::{Picture, TickPoint, WorkerSeries};

/// The first node's process, holding its workers' life spans (node n's is `NODE_PID + n`).
const NODE_PID: usize = 1;
/// Shortest span written, µs: a worker seen for no measurable time still gets a visible one.
const MIN_DURATION_US: f64 = 1.0;

/// µs from time 0, kept to the ns.
fn micros(seconds: f64) -> f64 {
    (seconds * 1e9).round() / 1e3
}

/// The trace document of `picture`.
pub fn render(picture: &Picture) -> Value {
    let mut metadata = Vec::new();
    for (index, node) in picture.nodes.iter().enumerate() {
        let caveat = (picture.nodes.len() > 1)
            .then(|| node.clock_caveat(picture.interval_seconds))
            .flatten()
            .map_or_else(String::new, |caveat| format!(" (times {caveat})"));
        metadata.push(meta(
            "process_name",
            NODE_PID + index,
            0,
            json!({"name": format!("workerprobe node {}{caveat}", node.name())}),
        ));
        metadata.push(meta(
            "process_sort_index",
            NODE_PID + index,
            0,
            json!({"sort_index": index}),
        ));
    }
    let node_pid = |worker: &WorkerSeries| {
        NODE_PID
            + picture
                .nodes
                .iter()
                .position(|node| node.name() == worker.node)
                .unwrap_or(0)
    };
    let counter_pid_base = NODE_PID + picture.nodes.len().max(1);
    let mut events = Vec::new();
    for (row, worker) in picture.workers.iter().enumerate() {
        let tid = row + 1;
        let (life_pid, counter_pid) = (node_pid(worker), counter_pid_base + row);
        metadata.push(meta(
            "thread_name",
            life_pid,
            tid,
            json!({"name": worker.label}),
        ));
        metadata.push(meta(
            "thread_sort_index",
            life_pid,
            tid,
            json!({"sort_index": row}),
        ));
        metadata.push(meta(
            "process_name",
            counter_pid,
            tid,
            json!({"name": format!("{} counters", worker.label)}),
        ));
        metadata.push(meta(
            "process_sort_index",
            counter_pid,
            tid,
            json!({"sort_index": picture.nodes.len() + row}),
        ));
        events.push(life_span(worker, life_pid, tid));
        if let Some(exit) = &worker.exit {
            events.push(json!({
                "name": "exit", "cat": "worker", "ph": "i", "s": "t",
                "ts": micros(worker.end_seconds), "pid": life_pid, "tid": tid,
                "args": Value::Object(exit.summary.clone()),
            }));
        }
        counters(
            &worker.points,
            picture.measured,
            counter_pid,
            tid,
            &mut events,
        );
    }
    // Stable: events at one moment keep the order they were made in (a 0 before a value).
    events.sort_by(|a, b| {
        a["ts"]
            .as_f64()
            .unwrap_or(0.0)
            .total_cmp(&b["ts"].as_f64().unwrap_or(0.0))
    });
    metadata.extend(events);
    let node = &picture.node;
    json!({
        "traceEvents": metadata,
        "displayTimeUnit": "ms",
        "otherData": {
            "source": "workerprobe trace",
            "node": node.display_name(),
            "nodes": picture.nodes.iter().map(|view| json!({
                "node": view.name(),
                "hostname": view.facts.hostname,
                "worst_clock": view.worst_clock,
            })).collect::<Vec<_>>(),
            "hostname": node.hostname,
            "clock": node.clock,
            "kernel": node.kernel,
            "cpus": node.cpus,
            "time_zero": picture.origin_time,
            "time_zero_monotonic_ns": picture.origin_monotonic_ns,
            "agent_version": picture.agent_version,
        },
    })
}

/// A metadata event (`"ph":"M"`).
fn meta(name: &str, pid: usize, tid: usize, args: Value) -> Value {
    json!({"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args})
}

/// The complete event spanning a worker's life.
fn life_span(worker: &WorkerSeries, pid: usize, tid: usize) -> Value {
    let start = micros(worker.start_seconds);
    let duration = (micros(worker.end_seconds) - start).max(MIN_DURATION_US);
    json!({
        "name": worker.label, "cat": "worker", "ph": "X", "ts": start, "dur": duration,
        "pid": pid, "tid": tid,
        "args": {
            "node": worker.node,
            "path": worker.path,
            "kind": worker.kind,
            "cgroup_id": worker.cgroup_id,
            "average_cores": worker.average_cores(),
            "cpu_seconds": worker.cpu_seconds,
            "sent_bytes": worker.sent_bytes,
            "received_bytes": worker.received_bytes,
            "peak_memory_bytes": worker.peak_memory_bytes,
            "ended": worker.exit.is_some(),
        },
    })
}

/// A counter event (`"ph":"C"`).
fn counter(name: &str, seconds: f64, pid: usize, tid: usize, args: Value) -> Value {
    json!({"name": name, "cat": "worker", "ph": "C", "ts": micros(seconds), "pid": pid, "tid": tid, "args": args})
}

/// The counter events of one worker's ticks; no track for what was not measured.
fn counters(
    points: &[TickPoint],
    measured: crate::model::Measured,
    pid: usize,
    tid: usize,
    events: &mut Vec<Value>,
) {
    let percent = |share: f64| (share * 1e4).round() / 100.0;
    // A track of zeros would read as measured: leave out what was not.
    let mut push = |event: Value| {
        let name = event["name"].as_str().unwrap_or("");
        let unmeasured = (name == "time shares %" && !measured.delays)
            || (name == "net bytes/s" && !measured.net);
        if !unmeasured {
            events.push(event);
        }
    };
    for (index, point) in points.iter().enumerate() {
        let at = point.start_seconds;
        push(counter(
            "cores",
            at,
            pid,
            tid,
            json!({"cores": point.cores}),
        ));
        push(counter(
            "time shares %",
            at,
            pid,
            tid,
            json!({
                "on_cpu": percent(point.on_cpu_share),
                "runqueue_wait": percent(point.runqueue_wait_share),
                "blocked_io": percent(point.blocked_io_share),
                "sleep": percent(point.sleep_share),
            }),
        ));
        push(counter(
            "net bytes/s",
            at,
            pid,
            tid,
            json!({"send": point.send_bytes_per_second, "receive": point.receive_bytes_per_second}),
        ));
        if let Some(bytes) = point.memory_bytes {
            push(counter(
                "memory bytes",
                point.end_seconds,
                pid,
                tid,
                json!({"current": bytes}),
            ));
        }
        let continues = points
            .get(index + 1)
            .is_some_and(|next| next.start_seconds - point.end_seconds <= 1e-6);
        if !continues {
            let at = point.end_seconds;
            push(counter("cores", at, pid, tid, json!({"cores": 0.0})));
            push(counter(
                "time shares %",
                at,
                pid,
                tid,
                json!({"on_cpu": 0.0, "runqueue_wait": 0.0, "blocked_io": 0.0, "sleep": 0.0}),
            ));
            push(counter(
                "net bytes/s",
                at,
                pid,
                tid,
                json!({"send": 0.0, "receive": 0.0}),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::picture::series::{build, tests as data};

    fn trace() -> Value {
        let picture = build(&data::sample(), &data::everything(), "r").expect("builds");
        render(&picture)
    }

    #[test]
    fn events_have_the_required_fields_in_time_order() {
        let document = trace();
        assert_eq!(document["displayTimeUnit"], "ms");
        let events = document["traceEvents"].as_array().expect("events");
        let mut last = f64::NEG_INFINITY;
        let mut seen_data = false;
        for event in events {
            for field in ["name", "ph", "ts", "pid", "tid"] {
                assert!(!event[field].is_null(), "{field} missing in {event}");
            }
            let ts = event["ts"].as_f64().expect("number");
            assert!(ts >= last, "{event} goes back in time");
            last = ts;
            let metadata = event["ph"] == "M";
            assert!(!(metadata && seen_data), "metadata after data: {event}");
            seen_data |= !metadata;
        }
        let spans: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(spans.len(), 3);
        for span in &spans {
            assert!(span["dur"].as_f64().expect("dur") > 0.0, "{span}");
        }
        assert_eq!(spans[0]["name"], "w1");
        assert_eq!(spans[0]["dur"], 4e6);
        let exits: Vec<&Value> = events.iter().filter(|e| e["ph"] == "i").collect();
        assert_eq!(exits.len(), 1);
        assert_eq!(exits[0]["args"]["net"]["sent_bytes"], 7);
        let names: Vec<&Value> = events
            .iter()
            .filter(|e| e["name"] == "thread_name")
            .collect();
        assert_eq!(names.len(), 3);
    }

    #[test]
    fn counters_drop_to_zero_where_ticks_stop() {
        let document = trace();
        let events = document["traceEvents"].as_array().expect("events");
        // w2 (row 1, counters in pid 3) sends in ticks 2 and 4 only.
        let sends: Vec<(f64, f64)> = events
            .iter()
            .filter(|e| e["name"] == "net bytes/s" && e["pid"] == 3)
            .map(|e| {
                (
                    e["ts"].as_f64().expect("ts"),
                    e["args"]["send"].as_f64().expect("send"),
                )
            })
            .collect();
        assert_eq!(
            sends,
            vec![(1e6, 1000.0), (2e6, 0.0), (3e6, 3000.0), (4e6, 0.0)]
        );
    }
}
