//! `workerprobe serve`: a Prometheus endpoint (`/metrics`, `/healthz`) over HTTP.
//!
//! This module owns the serving: binding the address, the collection thread that turns
//! samples and worker exits into the [`Exposition`] the endpoint shows, the grace period of
//! exited workers, and the readings of the agent's own cost. The request path only encodes the
//! latest exposition (no kernel reads), and no endpoint changes any state.

use std::{
    collections::{BTreeMap, HashMap},
    fs,
    net::SocketAddr,
    sync::{
        Arc, PoisonError, RwLock,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use axum::{
    Router,
    extract::State,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse as _, Response},
    routing::get,
};
use probe_common::{cpu::CpuStats, drops::DROP_NAMES, net::NetStats};

use super::watch::Watcher;
use crate::{
    cli::ServeArgs,
    model::{
        CpuStatUsec, Measured, Sample, WorkerCounters, identity::Identity, registry::WorkerRecord,
        selection::Selection, summary::ExitSummary,
    },
    sink::prometheus::{
        AgentCost, EndpointLabels, Exposition, Format, ProgramCost, WorkerSeries, render,
    },
};

/// How often worker exits are looked for, so a worker that lived 50 ms is still seen.
const EXIT_POLL: Duration = Duration::from_millis(50);

/// The latest exposition, swapped whole by the collection thread and read by requests.
type Shared = Arc<RwLock<Arc<Exposition>>>;

/// `workerprobe serve`.
pub async fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let selection = Selection::new(&args.workers.patterns)?;
    // Bind first: a wrong address is told before anything is loaded into the kernel.
    let listener = bind(args.listen).await?;
    let processes = !args.process_rules.is_empty();
    if processes && args.probe.pin.is_some() {
        return Err(crate::error::UserError::BadInput(
            "--process cannot be used with --pin: drop --pin to follow process trees".into(),
        )
        .into());
    }
    let collector = super::start_collector_with(&args.probe, processes)?;
    let measured = collector.measured();
    if processes && !measured.cpu {
        return Err(crate::error::UserError::BadInput(
            "--process needs the CPU programs, which this kernel or --programs leaves out: add cpu to --programs"
                .into(),
        )
        .into());
    }
    let mut watcher =
        Watcher::new(collector, selection).with_endpoint_namer(args.probe.endpoint_namer());
    if processes {
        watcher = watcher.with_processes(crate::model::process::ProcessTracker::new(
            args.process_rules.clone(),
        ));
    }
    let mut collection = Collection::new(watcher, measured, args.interval, args.exit_grace);
    collection.node = collection
        .node
        .clone()
        .named(args.probe.node_name.as_deref());
    collection.endpoint_labels = EndpointLabels {
        namer: args.probe.endpoint_namer(),
        raw_addresses: args.endpoint_addresses,
    };
    // The first sample before the first request, so no scrape sees an empty agent.
    let shared: Shared = Arc::new(RwLock::new(Arc::new(collection.collect(Instant::now())?)));

    let stop = Arc::new(AtomicBool::new(false));
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<anyhow::Error>();
    let thread = {
        let shared = Arc::clone(&shared);
        let stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("workerprobe-collect".into())
            .spawn(move || {
                if let Err(err) = collection.run(&shared, &stop) {
                    let _ = failed_tx.send(err);
                }
            })
            .context("starting the collection thread")?
    };

    let router = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(Arc::clone(&shared));
    let address = listener.local_addr().unwrap_or(args.listen);
    let shutdown = interrupted()?;
    crate::say!("workerprobe: serving http://{address}/metrics");
    let server = axum::serve(listener, router).with_graceful_shutdown(shutdown);
    let outcome = tokio::select! {
        result = std::future::IntoFuture::into_future(server) => result.context("serving HTTP"),
        failed = failed_rx => Err(failed.unwrap_or_else(|_| {
            anyhow::anyhow!("the collection thread stopped unexpectedly")
        })),
    };
    stop.store(true, Ordering::Relaxed);
    // It notices within one EXIT_POLL; joining detaches the programs before we return.
    let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    outcome
}

/// Binds the listen address, or says in one sentence why it cannot be.
async fn bind(address: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(address)
        .await
        .map_err(|err| anyhow::anyhow!(bind_error_sentence(address, &err)))
}

/// One sentence for a failed bind, saying what to do.
fn bind_error_sentence(address: SocketAddr, err: &std::io::Error) -> String {
    use std::io::ErrorKind;
    match err.kind() {
        ErrorKind::AddrInUse => format!(
            "cannot listen on {address}: another program is using that address; stop it or pick another one with --listen"
        ),
        ErrorKind::AddrNotAvailable => format!(
            "cannot listen on {address}: that IP address is not on this machine; give one of its addresses (or 0.0.0.0) with --listen"
        ),
        ErrorKind::PermissionDenied => format!(
            "cannot listen on {address}: permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE); pick another port with --listen"
        ),
        _ => format!("cannot listen on {address} ({err}); pick another address with --listen"),
    }
}

/// A future that resolves on Ctrl-C (SIGINT) or SIGTERM. The handlers are installed now, not
/// at the first poll, so a signal sent right after the "serving" line is not fatal.
fn interrupted() -> anyhow::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).context("handling SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("handling SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}

/// `GET /metrics`: the latest exposition, in the format the `Accept` header asks for.
async fn metrics(State(shared): State<Shared>, headers: HeaderMap) -> Response {
    let format = Format::negotiate(
        headers
            .get(header::ACCEPT)
            .and_then(|value| value.to_str().ok()),
    );
    let exposition = Arc::clone(&shared.read().unwrap_or_else(PoisonError::into_inner));
    match render(&exposition, format) {
        Ok(body) => ([(header::CONTENT_TYPE, format.content_type())], body).into_response(),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "encoding the metrics failed\n",
        )
            .into_response(),
    }
}

/// The collection side: samples, exits and the agent's own cost, made into expositions.
struct Collection {
    watcher: Watcher,
    series: SeriesBook,
    /// Named process trees (`--process`).
    trees: crate::model::process::TreeSeriesBook,
    measured: Measured,
    interval: Duration,
    programs: ProgramNames,
    drops: Vec<(String, u64)>,
    collection_duration_seconds: f64,
    endpoint_labels: EndpointLabels,
    node: crate::node::NodeFacts,
}

impl Collection {
    fn new(watcher: Watcher, measured: Measured, interval: Duration, grace: Duration) -> Self {
        Self {
            watcher,
            series: SeriesBook::new(grace),
            trees: crate::model::process::TreeSeriesBook::new(grace),
            measured,
            interval,
            programs: ProgramNames::default(),
            drops: Vec::new(),
            collection_duration_seconds: 0.0,
            endpoint_labels: EndpointLabels::default(),
            node: crate::node::NodeFacts::read(),
        }
    }

    /// Samples every worker and returns the exposition.
    fn collect(&mut self, now: Instant) -> anyhow::Result<Exposition> {
        let started = Instant::now();
        let sample = self.watcher.sample()?;
        self.series
            .observe(&sample, self.watcher.registry().records());
        self.drops = DROP_NAMES
            .iter()
            .zip(&sample.drops.by_map)
            .map(|(name, &total)| ((*name).to_string(), total))
            .collect();
        self.series.expire(now);
        self.watcher.recycle(sample);
        self.trees.observe(self.watcher.live_trees());
        self.trees.expire(now);
        self.collection_duration_seconds = started.elapsed().as_secs_f64();
        Ok(self.exposition())
    }

    /// Samples every interval and looks for exits every [`EXIT_POLL`], publishing into
    /// `shared`, until `stop`.
    fn run(&mut self, shared: &Shared, stop: &AtomicBool) -> anyhow::Result<()> {
        let mut next_sample = Instant::now() + self.interval;
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(EXIT_POLL);
            let now = Instant::now();
            let mut changed = false;
            for (summary, counters) in self.watcher.poll_with_counters() {
                self.series.exit(&summary, counters, now);
                changed = true;
            }
            // Trees only: a series per process would grow without bound.
            for (end, _) in self.watcher.poll_processes()? {
                if let crate::model::process::ProcessEnd::Tree(tree) = end {
                    self.trees.ended(&tree, now);
                    changed = true;
                }
            }
            let exposition = if now >= next_sample {
                next_sample = now + self.interval;
                Some(self.collect(now)?)
            } else if self.series.expire(now) | self.trees.expire(now) || changed {
                Some(self.exposition())
            } else {
                None
            };
            if let Some(exposition) = exposition {
                *shared.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(exposition);
            }
        }
        Ok(())
    }

    fn exposition(&mut self) -> Exposition {
        let bpf_stats_enabled = read_bpf_stats_enabled();
        Exposition {
            measured: self.measured,
            workers: self.series.workers(),
            live_workers: self.series.live_workers(),
            worker_exits: self.series.exits,
            drops: self.drops.clone(),
            endpoint_labels: self.endpoint_labels.clone(),
            node: Some(self.node.clone()),
            clock: crate::clock::ClockQuality::read(),
            process_trees: self.trees.series(),
            agent: AgentCost {
                cpu_seconds: agent_cpu_seconds(),
                resident_memory_bytes: fs::read_to_string("/proc/self/status")
                    .ok()
                    .and_then(|status| parse_vm_rss_bytes(&status)),
                collection_duration_seconds: self.collection_duration_seconds,
                bpf_stats_enabled,
                programs: if bpf_stats_enabled == Some(true) {
                    self.programs.own_program_costs()
                } else {
                    Vec::new()
                },
            },
        }
    }
}

/// The series of live workers and of exited ones in their grace period.
#[derive(Debug)]
struct SeriesBook {
    live: BTreeMap<u64, WorkerSeries>,
    /// Exited workers: cgroup id → (when they exited, final series).
    exited: BTreeMap<u64, (Instant, WorkerSeries)>,
    /// Exits since start.
    exits: u64,
    grace: Duration,
}

impl SeriesBook {
    fn new(grace: Duration) -> Self {
        Self {
            live: BTreeMap::new(),
            exited: BTreeMap::new(),
            exits: 0,
            grace,
        }
    }

    /// Rebuilds the live series from a sample and the registry's records (the selected,
    /// live workers). A counter never goes back: a worker missing from one sample keeps its
    /// last values rather than dropping to zero, which Prometheus would read as a reset.
    fn observe<'a>(&mut self, sample: &Sample, records: impl Iterator<Item = &'a WorkerRecord>) {
        let mut live = BTreeMap::new();
        for record in records {
            if self.exited.contains_key(&record.cgroup_id) {
                continue;
            }
            let previous = self.live.remove(&record.cgroup_id);
            let mut counters = sample
                .workers
                .get(&record.cgroup_id)
                .cloned()
                .unwrap_or_default();
            if counters.cpu_stat.is_none() {
                counters.cpu_stat = record.cpu_stat;
            }
            if let Some(previous) = &previous {
                counters = monotonic(&previous.counters, counters);
            }
            let peak = record
                .memory
                .map(|reading| reading.peak_bytes.max(record.memory_peak_bytes));
            live.insert(
                record.cgroup_id,
                WorkerSeries {
                    path: record.path.clone(),
                    identity: record.identity.clone(),
                    counters,
                    memory_bytes: record.memory.map(|reading| reading.current_bytes),
                    memory_peak_bytes: peak,
                },
            );
        }
        self.live = live;
    }

    /// A worker exited: its final counters stay for the grace period.
    fn exit(&mut self, summary: &ExitSummary, final_counters: WorkerCounters, now: Instant) {
        self.exits += 1;
        let previous = self.live.remove(&summary.cgroup_id);
        let mut counters = match &previous {
            Some(previous) => monotonic(&previous.counters, final_counters),
            None => final_counters,
        };
        counters.path = Some(summary.path.as_str().into());
        if counters.cpu_stat.is_none() {
            counters.cpu_stat = summary
                .cpu
                .user_seconds
                .zip(summary.cpu.system_seconds)
                .map(|(user, system)| CpuStatUsec {
                    usage_usec: ((user + system) * 1e6).round() as u64,
                    user_usec: (user * 1e6).round() as u64,
                    system_usec: (system * 1e6).round() as u64,
                });
        }
        let peak = summary
            .memory
            .as_ref()
            .map(|memory| memory.peak_bytes)
            .or(previous.as_ref().and_then(|p| p.memory_peak_bytes));
        let series = WorkerSeries {
            path: summary.path.clone(),
            identity: Identity {
                name: summary.name.clone(),
                kind: summary.kind,
                ids: summary.ids.clone(),
            },
            counters,
            // It uses no memory any more; its peak stays.
            memory_bytes: None,
            memory_peak_bytes: peak,
        };
        self.exited.insert(summary.cgroup_id, (now, series));
    }

    /// Drops exited workers whose grace period is over; whether any went.
    fn expire(&mut self, now: Instant) -> bool {
        let before = self.exited.len();
        let grace = self.grace;
        self.exited
            .retain(|_, (exited_at, _)| now.saturating_duration_since(*exited_at) < grace);
        self.exited.len() != before
    }

    fn live_workers(&self) -> u64 {
        self.live.len() as u64
    }

    /// Every series to expose, one per path: a cgroup made again at the path of an exited one
    /// replaces it (two series with one label set would break the scrape).
    fn workers(&self) -> Vec<WorkerSeries> {
        let mut by_path: BTreeMap<&str, &WorkerSeries> = BTreeMap::new();
        let mut exited: Vec<&(Instant, WorkerSeries)> = self.exited.values().collect();
        exited.sort_by_key(|(exited_at, _)| *exited_at);
        for (_, series) in exited {
            by_path.insert(&series.path, series);
        }
        for series in self.live.values() {
            by_path.insert(&series.path, series);
        }
        by_path.into_values().cloned().collect()
    }
}

/// Field by field the larger of two readings of one worker's cumulative counters.
fn monotonic(previous: &WorkerCounters, mut current: WorkerCounters) -> WorkerCounters {
    if current.on_cpu_ns_per_cpu.len() < previous.on_cpu_ns_per_cpu.len() {
        current
            .on_cpu_ns_per_cpu
            .resize(previous.on_cpu_ns_per_cpu.len(), 0);
    }
    for (cur, prev) in current
        .on_cpu_ns_per_cpu
        .iter_mut()
        .zip(&previous.on_cpu_ns_per_cpu)
    {
        *cur = (*cur).max(*prev);
    }
    *current.sched = max_cpu(&previous.sched, &current.sched);
    current.net = max_net(&previous.net, &current.net);
    for before in &previous.endpoints {
        match current.endpoints.iter_mut().find(|e| e.key == before.key) {
            Some(now) => {
                let (a, b) = (before.stats, now.stats);
                now.stats = probe_common::net::EndpointStats {
                    sent_bytes: a.sent_bytes.max(b.sent_bytes),
                    received_bytes: a.received_bytes.max(b.received_bytes),
                    sent_calls: a.sent_calls.max(b.sent_calls),
                    received_calls: a.received_calls.max(b.received_calls),
                    wait_ns: a.wait_ns.max(b.wait_ns),
                    waits: a.waits.max(b.waits),
                };
            }
            None => current.endpoints.push(before.clone()),
        }
    }
    current.cpu_stat = match (previous.cpu_stat, current.cpu_stat) {
        (Some(p), Some(c)) => Some(CpuStatUsec {
            usage_usec: p.usage_usec.max(c.usage_usec),
            user_usec: p.user_usec.max(c.user_usec),
            system_usec: p.system_usec.max(c.system_usec),
        }),
        (p, c) => c.or(p),
    };
    current
}

fn max_cpu(a: &CpuStats, b: &CpuStats) -> CpuStats {
    let mut hist = b.runqueue_wait_hist;
    for (out, &other) in hist.iter_mut().zip(&a.runqueue_wait_hist) {
        *out = (*out).max(other);
    }
    CpuStats {
        on_cpu_ns: a.on_cpu_ns.max(b.on_cpu_ns),
        voluntary_switches: a.voluntary_switches.max(b.voluntary_switches),
        involuntary_switches: a.involuntary_switches.max(b.involuntary_switches),
        runqueue_wait_ns: a.runqueue_wait_ns.max(b.runqueue_wait_ns),
        blocked_io_ns: a.blocked_io_ns.max(b.blocked_io_ns),
        sleep_ns: a.sleep_ns.max(b.sleep_ns),
        wakeups: a.wakeups.max(b.wakeups),
        runqueue_wait_hist: hist,
        wait_ns: std::array::from_fn(|r| a.wait_ns[r].max(b.wait_ns[r])),
        waits: std::array::from_fn(|r| a.waits[r].max(b.waits[r])),
        user_tick_ns: a.user_tick_ns.max(b.user_tick_ns),
        system_tick_ns: a.system_tick_ns.max(b.system_tick_ns),
    }
}

fn max_net(a: &NetStats, b: &NetStats) -> NetStats {
    let mut out = *b;
    for (family, other) in out.families.iter_mut().zip(&a.families) {
        family.sent_bytes = family.sent_bytes.max(other.sent_bytes);
        family.sent_calls = family.sent_calls.max(other.sent_calls);
        family.received_bytes = family.received_bytes.max(other.received_bytes);
        family.received_calls = family.received_calls.max(other.received_calls);
    }
    out
}

/// Names of this process's eBPF programs by id, learnt once per program.
#[derive(Debug, Default)]
struct ProgramNames {
    by_id: HashMap<u32, String>,
}

impl ProgramNames {
    /// Run counts and times of the programs this process loaded: found from its own file
    /// descriptors, so other agents on the node (e.g. a second workerprobe) are not counted.
    fn own_program_costs(&mut self) -> Vec<ProgramCost> {
        let own = own_programs();
        if own
            .iter()
            .any(|program| !self.by_id.contains_key(&program.id))
        {
            // A program's name is in its kernel info, not in fdinfo: ask once.
            for info in aya::programs::loaded_programs().flatten() {
                if own.iter().any(|program| program.id == info.id()) {
                    let name = info.name_as_str().unwrap_or("").to_string();
                    self.by_id.insert(info.id(), name);
                }
            }
        }
        let mut costs: Vec<ProgramCost> = own
            .into_iter()
            .map(|program| ProgramCost {
                program: match self.by_id.get(&program.id) {
                    Some(name) if !name.is_empty() => name.clone(),
                    _ => format!("id{}", program.id),
                },
                runs: program.runs,
                run_time_ns: program.run_time_ns,
            })
            .collect();
        costs.sort_by(|a, b| a.program.cmp(&b.program));
        costs.dedup_by(|a, b| a.program == b.program);
        costs
    }
}

/// A program as its file descriptor's fdinfo shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FdProgram {
    id: u32,
    runs: u64,
    run_time_ns: u64,
}

/// The eBPF programs this process holds open.
fn own_programs() -> Vec<FdProgram> {
    let Ok(entries) = fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut programs: Vec<FdProgram> = entries
        .flatten()
        .filter(|entry| {
            fs::read_link(entry.path())
                .is_ok_and(|target| target.as_os_str() == "anon_inode:bpf-prog")
        })
        .filter_map(|entry| {
            let fdinfo = fs::read_to_string(
                std::path::Path::new("/proc/self/fdinfo").join(entry.file_name()),
            )
            .ok()?;
            parse_prog_fdinfo(&fdinfo)
        })
        .collect();
    programs.sort_by_key(|program| program.id);
    programs.dedup_by_key(|program| program.id);
    programs
}

/// The id and run statistics in a program's `/proc/<pid>/fdinfo/<fd>`.
fn parse_prog_fdinfo(text: &str) -> Option<FdProgram> {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim().parse::<u64>().ok())?
        })
    };
    Some(FdProgram {
        id: u32::try_from(field("prog_id")?).ok()?,
        runs: field("run_cnt").unwrap_or(0),
        run_time_ns: field("run_time_ns").unwrap_or(0),
    })
}

/// Whether the kernel counts program runs (`kernel.bpf_stats_enabled`).
fn read_bpf_stats_enabled() -> Option<bool> {
    let text = fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").ok()?;
    Some(text.trim() != "0")
}

/// CPU time of this process so far (user + system), seconds.
fn agent_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes one rusage into the zeroed struct we own.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return 0.0;
        }
        usage
    };
    let seconds = |tv: libc::timeval| tv.tv_sec as f64 + tv.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// The resident memory in a `/proc/<pid>/status` text (`VmRSS:  1234 kB`), bytes.
fn parse_vm_rss_bytes(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use probe_common::net::FAMILY_IPV4;

    use super::*;
    use crate::model::{
        MemoryReading, MemorySource,
        identity::{WorkerKind, identify},
        summary::ExitSummary,
    };

    fn record(id: u64, path: &str) -> WorkerRecord {
        WorkerRecord {
            cgroup_id: id,
            path: path.into(),
            identity: identify(path),
            started_at_monotonic_ns: 0,
            start_observed: true,
            memory: Some(MemoryReading {
                current_bytes: 100,
                peak_bytes: 300,
                source: MemorySource::Cgroup2,
            }),
            memory_peak_bytes: 300,
            cpu_stat: None,
        }
    }

    fn counters(on_cpu_ns: u64, sent_bytes: u64) -> WorkerCounters {
        let mut counters = WorkerCounters {
            on_cpu_ns_per_cpu: vec![on_cpu_ns, 0],
            ..WorkerCounters::default()
        };
        counters.net.families[FAMILY_IPV4].sent_bytes = sent_bytes;
        counters.net.families[FAMILY_IPV4].sent_calls = 1;
        counters
    }

    fn sample(workers: &[(u64, WorkerCounters)]) -> Sample {
        Sample {
            workers: workers.iter().cloned().collect(),
            ..Sample::default()
        }
    }

    fn summary(record: &WorkerRecord, final_counters: &WorkerCounters) -> ExitSummary {
        ExitSummary::new(
            record,
            final_counters,
            1_000,
            0,
            Measured::default(),
            &crate::model::endpoints::EndpointNamer::default(),
            None,
        )
    }

    #[test]
    fn exited_workers_stay_for_the_grace_period_then_go() {
        let mut book = SeriesBook::new(Duration::from_secs(10));
        let job = record(7, "/job");
        let other = record(8, "/other");
        book.observe(
            &sample(&[(7, counters(100, 10)), (8, counters(5, 0))]),
            [&job, &other].into_iter(),
        );
        assert_eq!(book.live_workers(), 2);
        let start = Instant::now();
        let last = counters(250, 40);
        book.exit(&summary(&job, &last), last.clone(), start);
        assert_eq!(book.exits, 1);
        assert_eq!(book.live_workers(), 1);
        let workers = book.workers();
        assert_eq!(workers.len(), 2);
        let exited = &workers[0];
        assert_eq!(exited.path, "/job");
        assert_eq!(exited.counters.on_cpu_ns(), 250, "final counters kept");
        assert_eq!(exited.memory_bytes, None);
        assert_eq!(exited.memory_peak_bytes, Some(300));
        assert_eq!(exited.identity.kind, WorkerKind::Cgroup);

        // A sample after the exit (the registry no longer has it) keeps it exited.
        book.observe(&sample(&[(8, counters(6, 0))]), [&other].into_iter());
        assert_eq!(book.workers().len(), 2);
        assert!(!book.expire(start + Duration::from_secs(9)));
        assert!(book.expire(start + Duration::from_secs(10)));
        let workers = book.workers();
        assert_eq!(workers.len(), 1);
        assert_eq!(workers[0].path, "/other");
        assert_eq!(book.exits, 1, "the exit count never drops");
    }

    #[test]
    fn a_short_worker_never_sampled_is_still_exposed() {
        let mut book = SeriesBook::new(Duration::from_secs(60));
        let job = record(9, "/short");
        let last = counters(30_000_000, 0);
        book.exit(&summary(&job, &last), last, Instant::now());
        let workers = book.workers();
        assert_eq!(workers.len(), 1);
        assert_eq!(workers[0].counters.on_cpu_ns(), 30_000_000);
        assert_eq!(book.live_workers(), 0);
    }

    #[test]
    fn counters_never_go_back() {
        let mut book = SeriesBook::new(Duration::from_secs(60));
        let job = record(7, "/job");
        book.observe(&sample(&[(7, counters(100, 10))]), [&job].into_iter());
        // Missing from one sample: keeps its values rather than reading zero.
        book.observe(&sample(&[]), [&job].into_iter());
        let workers = book.workers();
        assert_eq!(workers[0].counters.on_cpu_ns(), 100);
        assert_eq!(workers[0].counters.net.families[FAMILY_IPV4].sent_bytes, 10);
        // Final counters a little behind the last sample do not lower it either.
        let last = counters(90, 10);
        book.exit(&summary(&job, &last), last, Instant::now());
        assert_eq!(book.workers()[0].counters.on_cpu_ns(), 100);
    }

    #[test]
    fn a_cgroup_made_again_replaces_the_exited_one() {
        let mut book = SeriesBook::new(Duration::from_secs(60));
        let old = record(7, "/job");
        let last = counters(500, 0);
        book.observe(&sample(&[(7, last.clone())]), [&old].into_iter());
        book.exit(&summary(&old, &last), last, Instant::now());
        let new = record(11, "/job");
        book.observe(&sample(&[(11, counters(1, 0))]), [&new].into_iter());
        let workers = book.workers();
        assert_eq!(workers.len(), 1, "one series per path");
        assert_eq!(workers[0].counters.on_cpu_ns(), 1);
    }

    #[test]
    fn reads_fdinfo_and_status() {
        let fdinfo = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t2072\nprog_type:\t26\nprog_jited:\t1\nprog_tag:\t3b1b6bbd2e5c1e8f\nmemlock:\t4096\nprog_id:\t1234\nrun_time_ns:\t56789\nrun_cnt:\t42\nrecursion_misses:\t0\nverified_insns:\t300\n";
        assert_eq!(
            parse_prog_fdinfo(fdinfo),
            Some(FdProgram {
                id: 1234,
                runs: 42,
                run_time_ns: 56789
            })
        );
        assert_eq!(parse_prog_fdinfo("pos:\t0\n"), None);
        let status = "Name:\tworkerprobe\nVmPeak:\t  9000 kB\nVmRSS:\t   1536 kB\nThreads:\t4\n";
        assert_eq!(parse_vm_rss_bytes(status), Some(1536 * 1024));
        assert_eq!(parse_vm_rss_bytes("Name:\tx\n"), None);
        assert!(agent_cpu_seconds() >= 0.0);
    }

    #[test]
    fn bind_errors_are_one_sentence_naming_the_flag() {
        let address: SocketAddr = "127.0.0.1:9464".parse().expect("address");
        for kind in [
            std::io::ErrorKind::AddrInUse,
            std::io::ErrorKind::AddrNotAvailable,
            std::io::ErrorKind::PermissionDenied,
            std::io::ErrorKind::Other,
        ] {
            let sentence = bind_error_sentence(address, &std::io::Error::from(kind));
            assert!(sentence.contains("127.0.0.1:9464"), "{sentence}");
            assert!(sentence.contains("--listen"), "{sentence}");
            assert!(!sentence.contains('\n'), "{sentence}");
        }
    }
}
