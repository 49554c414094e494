//! Process and process-tree summaries as JSON lines or human lines, and the Lithops call
//! record (Lithops' own field names, true per-call values).

use serde_json::{Value, json};

use crate::model::{
    Measured,
    endpoints::{EndpointNamer, figures},
    process::{ProcessCounters, ProcessSummary, TreeSummary},
    summary::Moment,
};
use probe_common::wait::WAIT_NAMES;

/// One ended process as a JSON object (`type: process_exit`). `path` is its cgroup's;
/// what was not `measured` (socket bytes, wait reasons, endpoints) is null; endpoints are
/// named by `namer`.
pub fn process_json(
    summary: &ProcessSummary,
    path: Option<&str>,
    boot_offset_ns: i128,
    measured: Measured,
    namer: &EndpointNamer,
) -> Value {
    json!({
        "type": "process_exit",
        "pid": summary.pid,
        "parent_pid": summary.parent_pid,
        "command": summary.command,
        "comm": summary.comm,
        "cgroup_id": summary.cgroup_id,
        "path": path,
        "start": Moment::new(summary.started_ns, boot_offset_ns),
        "end": Moment::new(summary.ended_ns, boot_offset_ns),
        "lived_ns": summary.ended_ns.saturating_sub(summary.started_ns),
        "exit": summary.exit,
        "peak_rss_bytes": summary.peak_rss_bytes,
        "end_rss_bytes": end_rss(summary, measured),
        "counters": counters_json(&summary.counters, measured),
        "cpu_ns_per_cpu": summary.cpu_ns_per_cpu,
        "endpoints": figures(namer, &summary.endpoints, measured),
        "tree": summary.tree,
    })
}

/// One named tree that ended (`type: process_tree_exit`).
pub fn tree_json(
    tree: &TreeSummary,
    boot_offset_ns: i128,
    measured: Measured,
    namer: &EndpointNamer,
) -> Value {
    json!({
        "type": "process_tree_exit",
        "rule": tree.label.rule,
        "ids": tree.label.ids,
        "root_pid": tree.label.root_pid,
        "command": tree.command,
        "processes": tree.processes,
        "start": Moment::new(tree.started_ns, boot_offset_ns),
        "end": Moment::new(tree.ended_ns, boot_offset_ns),
        "lived_ns": tree.ended_ns.saturating_sub(tree.started_ns),
        "peak_rss_bytes": tree.peak_rss_bytes,
        "counters": counters_json(&tree.counters, measured),
        "cpu_ns_per_cpu": tree.cpu_ns_per_cpu,
        "endpoints": figures(namer, &tree.endpoints, measured),
    })
}

/// For a tree the `lithops` rule named, the call's record keyed as Lithops keys its calls.
/// Fields named as Lithops names them mean what they mean in Lithops, with the call's true
/// values (seconds, bytes): CPU and bytes of all the call's processes, and the peak and final
/// resident set of the function's own process (the process the runner forked to run it: the busiest that
/// did not exec). The `function_*` fields are workerprobe's: that process's pid, CPU, and
/// start and end (epoch seconds; Lithops' own `worker_func_*_tstamp` time the call inside
/// it). `None` for other trees.
pub fn lithops_call_json(
    tree: &TreeSummary,
    boot_offset_ns: i128,
    measured: Measured,
) -> Option<Value> {
    if tree.label.rule != "lithops" {
        return None;
    }
    let id = |name: &str| tree.label.ids.get(name).cloned();
    let seconds = |ns: u64| ns as f64 / 1e9;
    let epoch = |monotonic_ns: u64| (i128::from(monotonic_ns) + boot_offset_ns) as f64 / 1e9;
    let function = tree.busiest_fork.as_ref();
    let bytes = |value: u64| {
        if measured.net {
            json!(value)
        } else {
            Value::Null
        }
    };
    // Lithops' per-core busy % over the call, here the call's own use of each core.
    let wall_ns = tree.ended_ns.saturating_sub(tree.started_ns).max(1) as f64;
    let usage: Vec<f64> = tree
        .cpu_ns_per_cpu
        .iter()
        .map(|&ns| (ns as f64 / wall_ns * 1000.0).round() / 10.0)
        .collect();
    Some(json!({
        "type": "lithops_call",
        "executor_id": id("executor"),
        "job_id": id("job"),
        "call_id": id("call"),
        "worker_func_cpu_usage": if usage.is_empty() { Value::Null } else { json!(usage) },
        "worker_func_cpu_user_time": seconds(tree.counters.user_ns),
        "worker_func_cpu_system_time": seconds(tree.counters.system_ns),
        "worker_func_cpu_time": seconds(tree.counters.cpu_ns),
        "worker_func_sent_net_io": bytes(tree.counters.sent_bytes),
        "worker_func_recv_net_io": bytes(tree.counters.received_bytes),
        "worker_peak_memory_end": function.map(|f| f.peak_rss_bytes),
        "worker_func_rss": function.and_then(|f| end_rss(f, measured)),
        "function_pid": function.map(|f| f.pid),
        "function_cpu_time": function.map(|f| seconds(f.counters.cpu_ns)),
        "function_process_start_tstamp": function.map(|f| epoch(f.started_ns)),
        "function_process_end_tstamp": function.map(|f| epoch(f.ended_ns)),
        "processes": tree.processes,
    }))
}

/// A process's resident set as it ended; `None` (null) where the kernel does not tell it.
fn end_rss(summary: &ProcessSummary, measured: Measured) -> Option<u64> {
    summary.end_rss_bytes.filter(|_| measured.exit_rss)
}

/// Counters with their units in their names; bytes and wait reasons null when not measured.
fn counters_json(counters: &ProcessCounters, measured: Measured) -> Value {
    let mut value = serde_json::to_value(counters).unwrap_or(Value::Null);
    if let Some(object) = value.as_object_mut() {
        if !measured.net {
            object.insert("sent_bytes".into(), Value::Null);
            object.insert("received_bytes".into(), Value::Null);
        }
        object.insert("waiting_on_ns".into(), waiting_on(counters, measured));
    }
    value
}

/// Sleep time by what it waited on, `{"network": ns, …}`; null where the wait reasons were
/// not measured.
fn waiting_on(counters: &ProcessCounters, measured: Measured) -> Value {
    if !(measured.delays && measured.waits) {
        return Value::Null;
    }
    let reasons: serde_json::Map<String, Value> = WAIT_NAMES
        .iter()
        .zip(counters.wait_ns)
        .map(|(name, ns)| ((*name).to_owned(), json!(ns)))
        .collect();
    Value::Object(reasons)
}

/// The two reasons it slept longest for, e.g. ` waiting on timer 0.300s, network 0.120s`;
/// empty when not measured or it never slept.
fn waiting_text(counters: &ProcessCounters, measured: Measured) -> String {
    if !(measured.delays && measured.waits) {
        return String::new();
    }
    let mut reasons: Vec<(&str, u64)> = WAIT_NAMES
        .iter()
        .copied()
        .zip(counters.wait_ns)
        .filter(|&(_, ns)| ns > 0)
        .collect();
    reasons.sort_by_key(|&(_, ns)| std::cmp::Reverse(ns));
    let shown: Vec<String> = reasons
        .iter()
        .take(2)
        .map(|(name, ns)| format!("{name} {:.3}s", *ns as f64 / 1e9))
        .collect();
    if shown.is_empty() {
        String::new()
    } else {
        format!(" waiting on {}", shown.join(", "))
    }
}

/// Bytes as a human reads them: `n/a` when not measured.
fn bytes_text(bytes: u64, net: bool) -> String {
    if net {
        format!("{bytes} B")
    } else {
        "n/a".into()
    }
}

/// One ended process as a human line.
pub fn process_line(summary: &ProcessSummary, path: Option<&str>, measured: Measured) -> String {
    let counters = &summary.counters;
    let net = measured.net;
    format!(
        "process {} ({}) in {} lived {:.3}s cpu {:.3}s (user {:.3}s system {:.3}s){} sent {} received {} peak rss {:.1} MB{} exit {}{}",
        summary.pid,
        summary.command.as_deref().unwrap_or(&summary.comm),
        path.unwrap_or("?"),
        summary.ended_ns.saturating_sub(summary.started_ns) as f64 / 1e9,
        counters.cpu_ns as f64 / 1e9,
        counters.user_ns as f64 / 1e9,
        counters.system_ns as f64 / 1e9,
        waiting_text(counters, measured),
        bytes_text(counters.sent_bytes, net),
        bytes_text(counters.received_bytes, net),
        summary.peak_rss_bytes as f64 / 1e6,
        end_rss(summary, measured)
            .map(|bytes| format!(" ({:.1} MB at end)", bytes as f64 / 1e6))
            .unwrap_or_default(),
        match summary.exit {
            crate::model::process::ExitStatus::Code(code) => format!("code {code}"),
            crate::model::process::ExitStatus::Signal(signal) => format!("signal {signal}"),
        },
        summary
            .tree
            .as_ref()
            .map(|tree| format!(" [{} {:?}]", tree.rule, tree.ids))
            .unwrap_or_default(),
    )
}

/// One named tree as a human line.
pub fn tree_line(tree: &TreeSummary, measured: Measured) -> String {
    let net = measured.net;
    let ids: Vec<String> = tree
        .label
        .ids
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect();
    format!(
        "tree {} {} ({} processes) lived {:.3}s cpu {:.3}s (user {:.3}s system {:.3}s){} sent {} received {} peak rss {:.1} MB",
        tree.label.rule,
        ids.join(" "),
        tree.processes,
        tree.ended_ns.saturating_sub(tree.started_ns) as f64 / 1e9,
        tree.counters.cpu_ns as f64 / 1e9,
        tree.counters.user_ns as f64 / 1e9,
        tree.counters.system_ns as f64 / 1e9,
        waiting_text(&tree.counters, measured),
        bytes_text(tree.counters.sent_bytes, net),
        bytes_text(tree.counters.received_bytes, net),
        tree.peak_rss_bytes as f64 / 1e6,
    )
}
