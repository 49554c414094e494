//! The Prometheus exposition: every worker's cumulative counters and the agent's own cost.
//!
//! This module owns the metric names, labels, help texts and their encoding. Rendering is a
//! pure function of an [`Exposition`], a plain struct the serve command fills from samples, so
//! every line can be checked in a unit test without a kernel.
//!
//! The values are the kernel's cumulative counters as they are, never reset: exactly what a
//! Prometheus counter is. `prometheus-client` encodes them through a [`Collector`], one
//! collection per scrape; its `Histogram` observes values one by one, which does not fit the
//! kernel's pre-aggregated log2 buckets, so the run-queue histogram is encoded from them
//! directly. The crate writes OpenMetrics text; for clients that do not ask for it (a browser,
//! `curl`, `promtool check metrics`) [`Format::Text`] rewrites it into the classic text format
//! 0.0.4, which differs only in counter family names (`_total`), the info type and `# EOF`.

use std::{borrow::Cow, fmt, sync::Arc};

use probe_common::{
    cpu::{RUNQ_BUCKETS, runq_bucket_upper_ns},
    net::FAMILY_NAMES,
    wait::WAIT_NAMES,
};
use prometheus_client::{
    collector::Collector,
    encoding::{
        DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabel as _, EncodeLabelSet,
        EncodeLabelValue, LabelSetEncoder, LabelValueEncoder, MetricEncoder, NoLabelSet,
    },
    metrics::MetricType,
    registry::Registry,
};

use crate::model::{
    AgentCost, Measured, ProgramCost, WorkerCounters,
    endpoints::{EndpointNamer, add_stats},
    series::WorkerSeries,
};

/// Identity ids that become labels of `workerprobe_worker_info`: few, and each names the
/// worker in another system (a container runtime, Kubernetes, systemd) to join on.
const INFO_ID_LABELS: [&str; 11] = [
    "container_id",
    "container_name",
    "image",
    "role",
    "pod_name",
    "namespace",
    "pod_uid",
    "qos",
    "runtime",
    "unit",
    "exec",
];

/// Everything one scrape shows.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Exposition {
    /// Which families carry measurements.
    pub measured: Measured,
    /// Live workers and exited ones still in their grace period, one per path.
    pub workers: Vec<WorkerSeries>,
    /// Workers alive now.
    pub live_workers: u64,
    /// Workers that exited since the agent started.
    pub worker_exits: u64,
    /// Failed map inserts per map, cumulative.
    pub drops: Vec<(String, u64)>,
    /// The agent's own cost.
    pub agent: AgentCost,
    /// How endpoint series are labelled.
    pub endpoint_labels: EndpointLabels,
    /// The node: its name (`--node-name`), host name and kernel, for a fleet's dashboards.
    pub node: Option<crate::node::NodeFacts>,
    /// The wall clock's quality now, as the kernel sees it.
    pub clock: Option<crate::clock::ClockQuality>,
    /// Named process trees (`serve --process`): running ones, and ended ones in their grace
    /// period.
    pub process_trees: Vec<crate::model::process::TreeSeries>,
}

/// How endpoint series are labelled: by the `--endpoint` groups, with peers no rule names
/// summed as `unnamed` (or, when asked, each by its address).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EndpointLabels {
    /// The rules.
    pub namer: EndpointNamer,
    /// Label unnamed peers by `ip:port` instead of `unnamed`.
    pub raw_addresses: bool,
}

/// The two text formats a scraper can get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text, as `prometheus-client` writes it (Prometheus asks for it).
    OpenMetrics,
    /// The classic Prometheus text format 0.0.4 (browsers, curl, promtool).
    Text,
}

impl Format {
    /// The format an HTTP `Accept` header asks for: OpenMetrics only when it is named, as the
    /// Prometheus server does; anything else gets the classic text format.
    pub fn negotiate(accept: Option<&str>) -> Self {
        match accept {
            Some(accept) if accept.contains("application/openmetrics-text") => Self::OpenMetrics,
            _ => Self::Text,
        }
    }

    /// The `Content-Type` of a response in this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
            Self::Text => "text/plain; version=0.0.4; charset=utf-8",
        }
    }
}

/// Renders an exposition in a format.
pub fn render(exposition: &Arc<Exposition>, format: Format) -> Result<String, fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ExpositionCollector(Arc::clone(exposition))));
    let mut openmetrics = String::with_capacity(16 * 1024);
    prometheus_client::encoding::text::encode(&mut openmetrics, &registry)?;
    Ok(match format {
        Format::OpenMetrics => openmetrics,
        Format::Text => openmetrics_to_text(&openmetrics),
    })
}

/// Rewrites OpenMetrics text into the classic text format 0.0.4: a counter family is named
/// after its `_total` samples, an info family becomes a gauge named after its `_info`
/// samples, and `# EOF` goes. Samples are the same in both.
pub fn openmetrics_to_text(openmetrics: &str) -> String {
    let mut text = String::with_capacity(openmetrics.len());
    // HELP comes before TYPE, but the name depends on the type: hold it until TYPE.
    let mut pending_help: Option<(&str, &str)> = None;
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            pending_help = Some((name, help));
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "untyped"));
            let (suffix, kind) = match kind {
                "counter" => ("_total", "counter"),
                "info" => ("_info", "gauge"),
                "unknown" => ("", "untyped"),
                other => ("", other),
            };
            if let Some((help_name, help)) = pending_help.take() {
                text.push_str(&format!("# HELP {help_name}{suffix} {help}\n"));
            }
            text.push_str(&format!("# TYPE {name}{suffix} {kind}\n"));
            continue;
        }
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// Encodes one exposition per scrape.
#[derive(Debug)]
struct ExpositionCollector(Arc<Exposition>);

impl Collector for ExpositionCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        encode_exposition(&self.0, &mut encoder)
    }
}

/// Label pairs of one sample.
type LabelPairs<'a> = Vec<(&'static str, Cow<'a, str>)>;

fn encode_exposition(e: &Exposition, encoder: &mut DescriptorEncoder) -> fmt::Result {
    let workers = &e.workers;

    gauge_family(
        encoder,
        "workerprobe_workers",
        "Workers (cgroups) alive now.",
        vec![(vec![], e.live_workers)],
    )?;
    counter_family(
        encoder,
        "workerprobe_worker_exits",
        "Workers that exited (their cgroup was removed) since the agent started.",
        vec![(vec![], e.worker_exits)],
    )?;
    info_family(
        encoder,
        "workerprobe_worker",
        "Who each worker is: name, kind and the ids its cgroup path names (join on worker).",
        workers.iter().map(info_labels).collect(),
    )?;
    if let Some(node) = &e.node {
        info_family(
            encoder,
            "workerprobe_node",
            "The node this agent runs on: its name (--node-name), host name and kernel.",
            vec![vec![
                ("node", Cow::from(node.display_name())),
                ("hostname", Cow::from(node.hostname.as_str())),
                ("kernel", Cow::from(node.kernel.as_str())),
            ]],
        )?;
    }
    if let Some(clock) = e.clock {
        gauge_family(
            encoder,
            "workerprobe_clock_synchronized",
            "1 while a time service keeps the wall clock synchronised (adjtimex), else 0.",
            vec![(vec![], u64::from(clock.synchronized))],
        )?;
        gauge_family(
            encoder,
            "workerprobe_clock_max_error_seconds",
            "The most the wall clock may be off (adjtimex maxerror).",
            vec![(vec![], clock.max_error_seconds)],
        )?;
        gauge_family(
            encoder,
            "workerprobe_clock_estimated_error_seconds",
            "The time service's estimate of the wall clock's error (adjtimex esterror).",
            vec![(vec![], clock.estimated_error_seconds)],
        )?;
    }

    if !e.process_trees.is_empty() {
        encode_process_trees(&e.process_trees, e.measured.net, encoder)?;
    }
    if e.measured.cpu {
        let mut per_cpu = Vec::new();
        for w in workers {
            for (cpu, &on_cpu_ns) in w.counters.on_cpu_ns_per_cpu.iter().enumerate() {
                let mut labels = worker(w);
                labels.push(("cpu", Cow::Owned(cpu.to_string())));
                per_cpu.push((labels, seconds(on_cpu_ns)));
            }
        }
        counter_family(
            encoder,
            "workerprobe_cpu_seconds",
            "Time the worker's own threads ran, per CPU, counted at each context switch.",
            per_cpu,
        )?;
    }
    if e.measured.cpu {
        let split = |w: &WorkerSeries| {
            let sched = &w.counters.sched;
            crate::model::split_user_system(
                w.counters.on_cpu_ns(),
                sched.user_tick_ns,
                sched.system_tick_ns,
            )
        };
        counter_family(
            encoder,
            "workerprobe_cpu_user_seconds",
            "User-mode part of the worker's own threads' CPU time (the kernel's tick-sampled split, scaled to workerprobe_cpu_seconds_total).",
            workers
                .iter()
                .map(|w| (worker(w), seconds(split(w).0)))
                .collect(),
        )?;
        counter_family(
            encoder,
            "workerprobe_cpu_system_seconds",
            "Kernel-mode part of the worker's own threads' CPU time (user + system = workerprobe_cpu_seconds_total).",
            workers
                .iter()
                .map(|w| (worker(w), seconds(split(w).1)))
                .collect(),
        )?;
    }
    if e.measured.cpu && e.measured.switches {
        let mut switches = Vec::new();
        for w in workers {
            let sched = &w.counters.sched;
            for (kind, value) in [
                ("voluntary", sched.voluntary_switches),
                ("involuntary", sched.involuntary_switches),
            ] {
                let mut labels = worker(w);
                labels.push(("kind", Cow::Borrowed(kind)));
                switches.push((labels, value));
            }
        }
        counter_family(
            encoder,
            "workerprobe_context_switches",
            "Context switches of the worker's threads: voluntary (blocked or slept) or involuntary (preempted).",
            switches,
        )?;
    }

    if e.measured.delays {
        if !workers.is_empty() {
            let mut metric = encoder.encode_descriptor(
                "workerprobe_runqueue_wait_seconds",
                "Time the worker's threads waited runnable for a CPU, per wait.",
                None,
                MetricType::Histogram,
            )?;
            for w in workers {
                let (sum_s, count, buckets) = runqueue_histogram(&w.counters);
                let labels = worker(w);
                metric
                    .encode_family(&Labels(&labels))?
                    .encode_histogram::<NoLabelSet>(sum_s, count, &buckets, None)?;
            }
        }
        let mut blocked = Vec::new();
        for w in workers {
            let sched = &w.counters.sched;
            for (state, ns) in [("io", sched.blocked_io_ns), ("sleep", sched.sleep_ns)] {
                let mut labels = worker(w);
                labels.push(("state", Cow::Borrowed(state)));
                blocked.push((labels, seconds(ns)));
            }
        }
        counter_family(
            encoder,
            "workerprobe_blocked_seconds",
            "Time the worker's threads were off CPU and not runnable: io (uninterruptible, D state) or sleep (S state).",
            blocked,
        )?;
        let mut waits = Vec::new();
        for w in workers.iter().filter(|_| e.measured.waits) {
            for (reason, name) in WAIT_NAMES.iter().enumerate() {
                let ns = w.counters.sched.wait_ns[reason];
                if ns == 0 {
                    continue;
                }
                let mut labels = worker(w);
                labels.push(("reason", Cow::Borrowed(*name)));
                waits.push((labels, seconds(ns)));
            }
        }
        counter_family(
            encoder,
            "workerprobe_wait_seconds",
            "Blocked and sleep time of the worker's threads by what they waited on: network, disk, lock, timer, child, pipe, poll, other.",
            waits,
        )?;
    }

    if e.measured.endpoints {
        let mut bytes = Vec::new();
        let mut waits = Vec::new();
        for w in workers {
            let mut by_label: Vec<(String, probe_common::net::EndpointStats)> = Vec::new();
            for endpoint in &w.counters.endpoints {
                let name = e.endpoint_labels.namer.name(&endpoint.key);
                let label = match (&name.group, e.endpoint_labels.raw_addresses) {
                    (Some(group), _) => group.clone(),
                    (None, true) => name.address.clone(),
                    (None, false) => "unnamed".to_owned(),
                };
                match by_label.iter_mut().find(|(l, _)| *l == label) {
                    Some((_, sum)) => add_stats(sum, &endpoint.stats),
                    None => by_label.push((label, endpoint.stats)),
                }
            }
            for (label, stats) in by_label {
                for (direction, count) in [
                    ("sent", stats.sent_bytes),
                    ("received", stats.received_bytes),
                ] {
                    let mut labels = worker(w);
                    labels.push(("endpoint", Cow::Owned(label.clone())));
                    labels.push(("direction", Cow::Borrowed(direction)));
                    bytes.push((labels, count));
                }
                if e.measured.delays {
                    let mut labels = worker(w);
                    labels.push(("endpoint", Cow::Owned(label)));
                    waits.push((labels, seconds(stats.wait_ns)));
                }
            }
        }
        counter_family(
            encoder,
            "workerprobe_endpoint_bytes",
            "Socket payload bytes per remote endpoint group (--endpoint rules; local, other, unconnected, unnamed).",
            bytes,
        )?;
        counter_family(
            encoder,
            "workerprobe_endpoint_wait_seconds",
            "Time the worker's socket calls slept before returning, per remote endpoint group.",
            waits,
        )?;
    }

    if e.measured.net {
        let mut bytes = Vec::new();
        let mut calls = Vec::new();
        for w in workers {
            for (family, name) in w.counters.net.families.iter().zip(FAMILY_NAMES) {
                // Only families with traffic: most workers use one or two.
                if family.sent_calls + family.received_calls == 0 {
                    continue;
                }
                for (direction, byte_count, call_count) in [
                    ("sent", family.sent_bytes, family.sent_calls),
                    ("received", family.received_bytes, family.received_calls),
                ] {
                    let mut labels = worker(w);
                    labels.push(("direction", Cow::Borrowed(direction)));
                    labels.push(("family", Cow::Borrowed(name)));
                    bytes.push((labels.clone(), byte_count));
                    calls.push((labels, call_count));
                }
            }
        }
        counter_family(
            encoder,
            "workerprobe_network_bytes",
            "Socket payload bytes the worker's threads sent and received, per address family.",
            bytes,
        )?;
        counter_family(
            encoder,
            "workerprobe_network_calls",
            "Successful socket send and receive calls of the worker's threads, per address family.",
            calls,
        )?;
    }

    gauge_family(
        encoder,
        "workerprobe_memory_bytes",
        "Memory the worker uses now (cgroup memory.current, or the best source the host has).",
        workers
            .iter()
            .filter_map(|w| Some((worker(w), w.memory_bytes?)))
            .collect(),
    )?;
    gauge_family(
        encoder,
        "workerprobe_memory_peak_bytes",
        "Highest memory use of the worker known (cgroup memory.peak, or the highest sample).",
        workers
            .iter()
            .filter_map(|w| Some((worker(w), w.memory_peak_bytes?)))
            .collect(),
    )?;

    counter_family(
        encoder,
        "workerprobe_map_drops",
        "Events lost because a kernel map was full or busy, per map (0 means none).",
        e.drops
            .iter()
            .map(|(map, total)| (vec![("map", Cow::from(map.as_str()))], *total))
            .collect(),
    )?;
    if let Some(enabled) = e.agent.bpf_stats_enabled {
        gauge_family(
            encoder,
            "workerprobe_bpf_stats_enabled",
            "Whether the kernel counts program runs (sysctl kernel.bpf_stats_enabled); the program families need it.",
            vec![(vec![], u64::from(enabled))],
        )?;
    }
    counter_family(
        encoder,
        "workerprobe_program_runs",
        "Times each of the agent's eBPF programs ran (events handled), from bpf_stats.",
        e.agent
            .programs
            .iter()
            .map(|cost| (program(cost), cost.runs))
            .collect(),
    )?;
    counter_family(
        encoder,
        "workerprobe_program_run_seconds",
        "Time each of the agent's eBPF programs ran in the kernel, from bpf_stats.",
        e.agent
            .programs
            .iter()
            .map(|cost| (program(cost), seconds(cost.run_time_ns)))
            .collect(),
    )?;
    gauge_family(
        encoder,
        "workerprobe_collection_duration_seconds",
        "How long the last collection (kernel maps, cpu.stat and memory reads) took.",
        vec![(vec![], e.agent.collection_duration_seconds)],
    )?;
    counter_family(
        encoder,
        "workerprobe_agent_cpu_seconds",
        "CPU time of the agent process itself (user and system).",
        vec![(vec![], e.agent.cpu_seconds)],
    )?;
    gauge_family(
        encoder,
        "workerprobe_agent_resident_memory_bytes",
        "Resident memory of the agent process itself.",
        e.agent
            .resident_memory_bytes
            .map(|bytes| (vec![], bytes))
            .into_iter()
            .collect(),
    )?;
    Ok(())
}

/// The `worker` label of a worker's samples.
fn worker(w: &WorkerSeries) -> LabelPairs<'_> {
    vec![("worker", Cow::from(w.path.as_str()))]
}

/// The `program` label of a program's samples.
fn program(cost: &ProgramCost) -> LabelPairs<'_> {
    vec![("program", Cow::from(cost.program.as_str()))]
}

/// The labels of a worker's info sample: worker, name, kind and the ids present.
fn info_labels(w: &WorkerSeries) -> LabelPairs<'_> {
    let mut labels = vec![
        ("worker", Cow::from(w.path.as_str())),
        ("name", Cow::from(w.identity.name.as_str())),
        ("kind", Cow::Borrowed(w.identity.kind.as_str())),
    ];
    for key in INFO_ID_LABELS {
        if let Some(value) = w.identity.ids.get(key) {
            labels.push((key, Cow::from(value.as_str())));
        }
    }
    labels
}

/// The run-queue histogram of a worker as (sum seconds, count, per-bucket counts with their
/// upper edges in seconds; the last edge is `f64::MAX`, which the encoder writes `+Inf`).
fn runqueue_histogram(counters: &WorkerCounters) -> (f64, u64, Vec<(f64, u64)>) {
    let mut buckets: Vec<(f64, u64)> = (0..RUNQ_BUCKETS)
        .map(|bucket| {
            let upper_ns = runq_bucket_upper_ns(bucket);
            let upper_s = if upper_ns == u64::MAX {
                f64::MAX
            } else {
                seconds(upper_ns)
            };
            (upper_s, 0)
        })
        .collect();
    let sched = &counters.sched;
    let wait_ns = sched.runqueue_wait_ns;
    for (bucket, &count) in buckets.iter_mut().zip(&sched.runqueue_wait_hist) {
        bucket.1 += count;
    }
    // The count is the buckets' sum
    // so that `_count` always equals the `+Inf` bucket, as the format requires.
    let count = buckets.iter().map(|(_, count)| count).sum();
    (seconds(wait_ns), count, buckets)
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// A counter family; nothing at all when it has no samples.
fn counter_family<V: EncodeCounterValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: Vec<(LabelPairs<'_>, V)>,
) -> fmt::Result {
    if samples.is_empty() {
        return Ok(());
    }
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in &samples {
        with_labels(&mut metric, labels, |m| {
            m.encode_counter::<NoLabelSet, V, f64>(value, None)
        })?;
    }
    Ok(())
}

/// A gauge family; nothing at all when it has no samples.
fn gauge_family<V: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: Vec<(LabelPairs<'_>, V)>,
) -> fmt::Result {
    if samples.is_empty() {
        return Ok(());
    }
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in &samples {
        with_labels(&mut metric, labels, |m| m.encode_gauge(value))?;
    }
    Ok(())
}

/// An info family (`<name>_info{…} 1`); nothing at all when it has no samples.
fn info_family(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: Vec<LabelPairs<'_>>,
) -> fmt::Result {
    if samples.is_empty() {
        return Ok(());
    }
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Info)?;
    for labels in &samples {
        metric.encode_info(&Labels(labels))?;
    }
    Ok(())
}

/// Encodes one sample with its labels (none: no braces at all).
fn with_labels(
    metric: &mut MetricEncoder,
    labels: &LabelPairs<'_>,
    encode: impl FnOnce(&mut MetricEncoder) -> fmt::Result,
) -> fmt::Result {
    if labels.is_empty() {
        encode(metric)
    } else {
        encode(&mut metric.encode_family(&Labels(labels))?)
    }
}

/// Named process trees: labelled by rule, root process and the rule's captures (`id_NAME`).
fn encode_process_trees(
    trees: &[crate::model::process::TreeSeries],
    net: bool,
    encoder: &mut DescriptorEncoder,
) -> fmt::Result {
    let labels = |tree: &crate::model::process::TreeSeries| -> LabelPairs<'static> {
        let mut labels: LabelPairs<'static> = vec![
            ("rule", Cow::Owned(tree.label.rule.clone())),
            ("root_pid", Cow::Owned(tree.label.root_pid.to_string())),
        ];
        // Prefixed, so no capture collides with another label or a target's (`job`).
        for (name, value) in &tree.label.ids {
            labels.push((capture_label(name), Cow::Owned(value.clone())));
        }
        labels
    };
    counter_family(
        encoder,
        "workerprobe_process_tree_cpu_seconds",
        "CPU time of a named process tree (--process): its ended processes' and its running ones' so far.",
        trees
            .iter()
            .map(|tree| (labels(tree), seconds(tree.cpu_ns)))
            .collect(),
    )?;
    if net {
        counter_family(
            encoder,
            "workerprobe_process_tree_sent_bytes",
            "Socket payload a named process tree (--process) sent: its ended processes' and its running ones' so far.",
            trees
                .iter()
                .map(|tree| (labels(tree), tree.sent_bytes))
                .collect(),
        )?;
        counter_family(
            encoder,
            "workerprobe_process_tree_received_bytes",
            "Socket payload a named process tree (--process) received: its ended processes' and its running ones' so far.",
            trees
                .iter()
                .map(|tree| (labels(tree), tree.received_bytes))
                .collect(),
        )?;
    }
    gauge_family(
        encoder,
        "workerprobe_process_tree_processes",
        "Processes a named process tree has had so far.",
        trees
            .iter()
            .map(|tree| (labels(tree), tree.processes))
            .collect(),
    )?;
    gauge_family(
        encoder,
        "workerprobe_process_tree_running",
        "1 while a named process tree runs, 0 in its grace period after its last process ended.",
        trees
            .iter()
            .map(|tree| (labels(tree), u64::from(tree.running)))
            .collect(),
    )
}

/// A rule's capture name as a label name (`id_` and the name, which `parse_rule` checked),
/// kept for the agent's life: the names come from the rules given at start, so there are few.
fn capture_label(name: &str) -> &'static str {
    static NAMES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let label = format!("id_{name}");
    let mut names = NAMES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(known) = names.iter().find(|known| **known == label) {
        return known;
    }
    let leaked: &'static str = Box::leak(label.into_boxed_str());
    names.push(leaked);
    leaked
}

/// A label set whose values are escaped: cgroup paths may hold any byte but `/` and NUL.
struct Labels<'a, 'b>(&'a LabelPairs<'b>);

impl EncodeLabelSet for Labels<'_, '_> {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> fmt::Result {
        for (key, value) in self.0 {
            (*key, Escaped(value)).encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

/// A label value with `\`, `"` and newlines escaped, as both text formats require
/// (`prometheus-client` writes values verbatim).
struct Escaped<'a>(&'a str);

impl EncodeLabelValue for Escaped<'_> {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> fmt::Result {
        use fmt::Write as _;
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use probe_common::{
        cpu::CpuStats,
        net::{FAMILY_IPV4, NetStats},
    };

    use super::*;
    use crate::model::{CpuStatUsec, identity::identify};

    fn worker(path: &str) -> WorkerSeries {
        let mut cpu0 = CpuStats {
            on_cpu_ns: 1_500_000_000,
            voluntary_switches: 3,
            involuntary_switches: 4,
            runqueue_wait_ns: 2_500,
            blocked_io_ns: 7_000_000,
            sleep_ns: 2_000_000_000,
            // Ticks 34:1: the 1.75 s split 1.7 s user, 0.05 s system.
            user_tick_ns: 136_000_000,
            system_tick_ns: 4_000_000,
            ..CpuStats::default()
        };
        cpu0.runqueue_wait_hist[0] = 1; // 500 ns
        cpu0.runqueue_wait_hist[2] = 1; // 2 µs
        let cpu1 = CpuStats {
            on_cpu_ns: 250_000_000,
            ..CpuStats::default()
        };
        let mut net = NetStats::default();
        net.families[FAMILY_IPV4].sent_bytes = 5_000_000;
        net.families[FAMILY_IPV4].sent_calls = 153;
        WorkerSeries {
            path: path.into(),
            identity: identify(path),
            counters: WorkerCounters {
                path: Some(path.into()),
                on_cpu_ns_per_cpu: vec![cpu0.on_cpu_ns, cpu1.on_cpu_ns],
                sched: Box::new(CpuStats {
                    on_cpu_ns: 0,
                    ..cpu0
                }),
                net,
                cpu_stat: Some(CpuStatUsec {
                    usage_usec: 1_750_000,
                    user_usec: 1_700_000,
                    system_usec: 50_000,
                }),
                ..WorkerCounters::default()
            },
            memory_bytes: Some(4096),
            memory_peak_bytes: Some(8192),
        }
    }

    fn exposition() -> Arc<Exposition> {
        Arc::new(Exposition {
            process_trees: Vec::new(),
            measured: Measured::default(),
            endpoint_labels: EndpointLabels::default(),
            node: Some(crate::node::NodeFacts {
                name: "node-a".into(),
                hostname: "h1".into(),
                kernel: "6.18.44".into(),
                cpus: 2,
                cpu_model: "m".into(),
                memory_bytes: 1,
                boot_time_epoch_secs: 1,
                clock: None,
            }),
            clock: Some(crate::clock::ClockQuality {
                synchronized: false,
                estimated_error_seconds: 0.016,
                max_error_seconds: 16.0,
            }),
            workers: vec![
                worker("/system.slice/nginx.service"),
                worker("/odd \"name\"\\x"),
            ],
            live_workers: 2,
            worker_exits: 1,
            drops: vec![("cpu_stats".into(), 0), ("net_stats".into(), 2)],
            agent: AgentCost {
                cpu_seconds: 0.25,
                resident_memory_bytes: Some(10 << 20),
                collection_duration_seconds: 0.002,
                bpf_stats_enabled: Some(true),
                programs: vec![ProgramCost {
                    program: "switch_full".into(),
                    runs: 1000,
                    run_time_ns: 54_000,
                }],
            },
        })
    }

    /// Every sample line of a text exposition as (name, labels, value).
    fn samples(text: &str) -> Vec<(String, BTreeMap<String, String>, f64)> {
        text.lines()
            .filter(|line| !line.starts_with('#') && !line.is_empty())
            .map(|line| {
                let (series, value) = line.rsplit_once(' ').expect("value");
                let (name, labels) = match series.split_once('{') {
                    Some((name, rest)) => (name, parse_labels(rest.trim_end_matches('}'))),
                    None => (series, BTreeMap::new()),
                };
                let value = match value {
                    "+Inf" => f64::INFINITY,
                    v => v.parse().expect("number"),
                };
                (name.to_string(), labels, value)
            })
            .collect()
    }

    fn parse_labels(text: &str) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::new();
        let mut chars = text.chars().peekable();
        while chars.peek().is_some() {
            let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
            assert_eq!(chars.next(), Some('"'), "label {key} is quoted in {text}");
            let mut value = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => match chars.next() {
                        Some('n') => value.push('\n'),
                        Some(other) => value.push(other),
                        None => panic!("dangling escape in {text}"),
                    },
                    '"' => break,
                    c => value.push(c),
                }
            }
            if chars.peek() == Some(&',') {
                chars.next();
            }
            labels.insert(key, value);
        }
        labels
    }

    fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
        let wanted: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        let found: Vec<f64> = samples(text)
            .into_iter()
            .filter(|(n, l, _)| n == name && wanted.iter().all(|(k, v)| l.get(k) == Some(v)))
            .map(|(_, _, v)| v)
            .collect();
        assert_eq!(found.len(), 1, "{name}{labels:?} in\n{text}");
        found[0]
    }

    /// What `promtool check metrics` checks, for the classic text format: each family has
    /// HELP then TYPE once, every sample belongs to the family declared just before it, with
    /// the suffixes its type allows, counters end in `_total`, base units, no duplicates.
    fn lint(text: &str) {
        let mut families = BTreeSet::new();
        let mut current: Option<(String, String)> = None;
        let mut help: Option<String> = None;
        let mut series = BTreeSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, text) = rest.split_once(' ').expect("help text");
                assert!(!text.is_empty(), "{name} has empty help");
                help = Some(name.to_string());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("type");
                assert_eq!(
                    help.take().as_deref(),
                    Some(name),
                    "HELP before TYPE {name}"
                );
                assert!(families.insert(name.to_string()), "{name} declared twice");
                assert!(name.starts_with("workerprobe_"), "{name} has the prefix");
                assert!(
                    ["counter", "gauge", "histogram"].contains(&kind),
                    "{name}: type {kind}"
                );
                if kind == "counter" {
                    assert!(name.ends_with("_total"), "counter {name} ends in _total");
                } else {
                    assert!(
                        !name.ends_with("_total"),
                        "{kind} {name} must not end in _total"
                    );
                }
                for bad in [
                    "_milliseconds",
                    "_microseconds",
                    "_nanoseconds",
                    "_kilobytes",
                ] {
                    assert!(!name.contains(bad), "{name}: use base units");
                }
                current = Some((name.to_string(), kind.to_string()));
            } else {
                assert!(!line.starts_with('#'), "stray comment {line}");
                let (family, kind) = current.clone().expect("a sample before any TYPE");
                let name = line.split(['{', ' ']).next().expect("name");
                let allowed = if kind == "histogram" {
                    ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|suffix| name == format!("{family}{suffix}"))
                } else {
                    name == family
                };
                assert!(allowed, "sample {name} under family {family} ({kind})");
                let (series_key, _) = line.rsplit_once(' ').expect("value");
                assert!(
                    series.insert(series_key.to_string()),
                    "duplicate {series_key}"
                );
            }
        }
        assert!(help.is_none(), "HELP without TYPE");
    }

    #[test]
    fn classic_text_passes_the_lint_and_has_every_family() {
        let text = render(&exposition(), Format::Text).expect("render");
        lint(&text);
        for family in [
            "workerprobe_workers",
            "workerprobe_worker_exits_total",
            "workerprobe_worker_info",
            "workerprobe_cpu_seconds_total",
            "workerprobe_cpu_user_seconds_total",
            "workerprobe_cpu_system_seconds_total",
            "workerprobe_context_switches_total",
            "workerprobe_runqueue_wait_seconds",
            "workerprobe_blocked_seconds_total",
            "workerprobe_network_bytes_total",
            "workerprobe_network_calls_total",
            "workerprobe_memory_bytes",
            "workerprobe_memory_peak_bytes",
            "workerprobe_map_drops_total",
            "workerprobe_bpf_stats_enabled",
            "workerprobe_program_runs_total",
            "workerprobe_program_run_seconds_total",
            "workerprobe_collection_duration_seconds",
            "workerprobe_agent_cpu_seconds_total",
            "workerprobe_agent_resident_memory_bytes",
        ] {
            assert!(
                text.contains(&format!("# TYPE {family} ")),
                "{family} missing in\n{text}"
            );
        }
    }

    #[test]
    fn waits_by_reason_and_endpoints_by_group() {
        use probe_common::{
            net::{AF_INET, EndpointKey, EndpointStats},
            wait::WAIT_NETWORK,
        };
        let mut series = worker("/job");
        series.counters.sched.wait_ns[WAIT_NETWORK as usize] = 250_000_000;
        let peer = |last: u8, sent_bytes| crate::model::endpoints::EndpointDelta {
            key: EndpointKey {
                addr: [10, 0, 0, last, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                port: 9000,
                family: AF_INET,
                ..EndpointKey::default()
            },
            stats: EndpointStats {
                sent_bytes,
                wait_ns: 1_000_000_000,
                ..EndpointStats::default()
            },
        };
        series.counters.endpoints = vec![peer(1, 10), peer(2, 20), peer(3, 5)];
        let labels = |raw_addresses| EndpointLabels {
            namer: crate::model::endpoints::EndpointNamer::new(vec![
                crate::model::endpoints::parse_rule("store=10.0.0.0/31").unwrap(),
            ]),
            raw_addresses,
        };
        let mut e = Exposition {
            process_trees: Vec::new(),
            measured: Measured::default(),
            workers: vec![series],
            endpoint_labels: labels(false),
            ..Exposition::default()
        };
        let text = render(&Arc::new(e.clone()), Format::Text).expect("render");
        lint(&text);
        let job = ("worker", "/job");
        assert_eq!(
            value(
                &text,
                "workerprobe_wait_seconds_total",
                &[job, ("reason", "network")]
            ),
            0.25
        );
        let sent = |text: &str, endpoint| {
            value(
                text,
                "workerprobe_endpoint_bytes_total",
                &[job, ("endpoint", endpoint), ("direction", "sent")],
            )
        };
        // 10.0.0.1 is in the store's /31 (10.0.0.0–1); the others are unnamed, summed.
        assert_eq!(sent(&text, "store"), 10.0);
        assert_eq!(sent(&text, "unnamed"), 25.0);
        assert_eq!(
            value(
                &text,
                "workerprobe_endpoint_wait_seconds_total",
                &[job, ("endpoint", "unnamed")]
            ),
            2.0
        );
        e.endpoint_labels = labels(true);
        let raw = render(&Arc::new(e), Format::Text).expect("render");
        assert_eq!(sent(&raw, "10.0.0.2:9000"), 20.0);
    }

    #[test]
    fn values_are_cumulative_counters_in_base_units() {
        let text = render(&exposition(), Format::Text).expect("render");
        let nginx = ("worker", "/system.slice/nginx.service");
        let v = |name: &str, extra: &[(&str, &str)]| {
            let mut labels = vec![nginx];
            labels.extend_from_slice(extra);
            value(&text, name, &labels)
        };
        assert_eq!(v("workerprobe_cpu_seconds_total", &[("cpu", "0")]), 1.5);
        assert_eq!(v("workerprobe_cpu_seconds_total", &[("cpu", "1")]), 0.25);
        assert_eq!(v("workerprobe_cpu_user_seconds_total", &[]), 1.7);
        assert_eq!(v("workerprobe_cpu_system_seconds_total", &[]), 0.05);
        assert_eq!(
            v(
                "workerprobe_context_switches_total",
                &[("kind", "voluntary")]
            ),
            3.0
        );
        assert_eq!(
            v(
                "workerprobe_context_switches_total",
                &[("kind", "involuntary")]
            ),
            4.0
        );
        assert_eq!(
            v("workerprobe_blocked_seconds_total", &[("state", "io")]),
            0.007
        );
        assert_eq!(
            v("workerprobe_blocked_seconds_total", &[("state", "sleep")]),
            2.0
        );
        let sent = [("direction", "sent"), ("family", "ipv4")];
        assert_eq!(v("workerprobe_network_bytes_total", &sent), 5e6);
        assert_eq!(v("workerprobe_network_calls_total", &sent), 153.0);
        let received = [("direction", "received"), ("family", "ipv4")];
        assert_eq!(v("workerprobe_network_bytes_total", &received), 0.0);
        // Families without traffic are left out.
        assert!(!text.contains("family=\"ipv6\""));
        assert_eq!(v("workerprobe_memory_bytes", &[]), 4096.0);
        assert_eq!(v("workerprobe_memory_peak_bytes", &[]), 8192.0);
        let info = v(
            "workerprobe_worker_info",
            &[
                ("name", "nginx"),
                ("kind", "systemd_service"),
                ("unit", "nginx.service"),
            ],
        );
        assert_eq!(info, 1.0);
        assert_eq!(value(&text, "workerprobe_workers", &[]), 2.0);
        assert_eq!(
            value(
                &text,
                "workerprobe_node_info",
                &[
                    ("node", "node-a"),
                    ("hostname", "h1"),
                    ("kernel", "6.18.44")
                ]
            ),
            1.0
        );
        assert_eq!(value(&text, "workerprobe_clock_synchronized", &[]), 0.0);
        assert_eq!(
            value(&text, "workerprobe_clock_max_error_seconds", &[]),
            16.0
        );
        assert_eq!(
            value(&text, "workerprobe_clock_estimated_error_seconds", &[]),
            0.016
        );
        assert_eq!(value(&text, "workerprobe_worker_exits_total", &[]), 1.0);
        assert_eq!(
            value(
                &text,
                "workerprobe_map_drops_total",
                &[("map", "net_stats")]
            ),
            2.0
        );
        assert_eq!(
            value(
                &text,
                "workerprobe_program_run_seconds_total",
                &[("program", "switch_full")]
            ),
            54e-6
        );
        assert_eq!(
            value(&text, "workerprobe_agent_cpu_seconds_total", &[]),
            0.25
        );
    }

    #[test]
    fn histogram_comes_from_the_kernel_buckets() {
        let text = render(&exposition(), Format::Text).expect("render");
        let nginx = ("worker", "/system.slice/nginx.service");
        let bucket = |le: &str| {
            value(
                &text,
                "workerprobe_runqueue_wait_seconds_bucket",
                &[nginx, ("le", le)],
            )
        };
        assert_eq!(bucket("0.000001"), 1.0, "under 1 µs");
        assert_eq!(bucket("0.000002"), 1.0);
        assert_eq!(bucket("0.000004"), 2.0, "[2, 4) µs");
        assert_eq!(bucket("+Inf"), 2.0);
        assert_eq!(
            value(&text, "workerprobe_runqueue_wait_seconds_count", &[nginx]),
            2.0
        );
        assert_eq!(
            value(&text, "workerprobe_runqueue_wait_seconds_sum", &[nginx]),
            2.5e-6
        );
        let buckets = samples(&text)
            .into_iter()
            .filter(|(n, l, _)| {
                n == "workerprobe_runqueue_wait_seconds_bucket"
                    && l.get("worker").map(String::as_str) == Some(nginx.1)
            })
            .collect::<Vec<_>>();
        assert_eq!(buckets.len(), RUNQ_BUCKETS);
        // Cumulative, and the edges ascend.
        for pair in buckets.windows(2) {
            assert!(pair[0].2 <= pair[1].2);
            let le = |l: &BTreeMap<String, String>| -> f64 {
                match l["le"].as_str() {
                    "+Inf" => f64::INFINITY,
                    v => v.parse().expect("le"),
                }
            };
            assert!(le(&pair[0].1) < le(&pair[1].1));
        }
    }

    #[test]
    fn label_values_are_escaped() {
        let text = render(&exposition(), Format::Text).expect("render");
        assert!(text.contains(r#"worker="/odd \"name\"\\x""#), "{text}");
        assert_eq!(
            value(
                &text,
                "workerprobe_memory_bytes",
                &[("worker", "/odd \"name\"\\x")]
            ),
            4096.0
        );
    }

    #[test]
    fn openmetrics_keeps_family_names_and_ends_with_eof() {
        let text = render(&exposition(), Format::OpenMetrics).expect("render");
        assert!(text.ends_with("# EOF\n"));
        assert!(text.contains("# TYPE workerprobe_cpu_seconds counter\n"));
        assert!(text.contains("# TYPE workerprobe_worker info\n"));
        assert!(text.contains("\nworkerprobe_cpu_seconds_total{"));
        assert!(text.contains("\nworkerprobe_worker_info{"));
        // The same samples in both formats.
        let classic = render(&exposition(), Format::Text).expect("render");
        assert_eq!(samples(&text), samples(&classic));
    }

    #[test]
    fn unmeasured_and_empty_families_are_left_out() {
        let exposition = Arc::new(Exposition {
            process_trees: Vec::new(),
            measured: Measured {
                lifecycle: true,
                endpoints: false,
                waits: false,
                cpu: true,
                switches: true,
                delays: false,
                net: false,
                splice_reads: false,
                exit_rss: false,
            },
            ..Exposition::default()
        });
        let text = render(&exposition, Format::Text).expect("render");
        lint(&text);
        assert!(!text.contains("runqueue"));
        assert!(!text.contains("network"));
        assert!(!text.contains("worker_info"));
        assert_eq!(value(&text, "workerprobe_workers", &[]), 0.0);
    }

    #[test]
    fn accept_header_picks_the_format() {
        assert_eq!(Format::negotiate(None), Format::Text);
        assert_eq!(Format::negotiate(Some("*/*")), Format::Text);
        assert_eq!(
            Format::negotiate(Some(
                "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"
            )),
            Format::OpenMetrics
        );
        assert!(
            Format::Text
                .content_type()
                .starts_with("text/plain; version=0.0.4")
        );
    }
}
