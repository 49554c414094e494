//! `workerprobe serve`: a Prometheus endpoint (`/metrics`, `/healthz`) over HTTP.
//!
//! This module owns the serving: binding the address, the collection thread that turns
//! samples and worker exits into the [`Exposition`] the endpoint shows, the grace period of
//! exited workers, and the readings of the agent's own cost. The request path only encodes the
//! latest exposition (no kernel reads), and no endpoint changes any state.

use std::{
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
use probe_common::drops::DROP_NAMES;

use super::watch::Watcher;
use crate::{
    cli::ServeArgs,
    collect::own_cost::OwnCostReader,
    model::{Measured, selection::Selection, series::SeriesBook},
    sink::prometheus::{EndpointLabels, Exposition, Format, render},
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
    own_cost: OwnCostReader,
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
            own_cost: OwnCostReader::default(),
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
        Exposition {
            measured: self.measured,
            workers: self.series.workers(),
            live_workers: self.series.live_workers(),
            worker_exits: self.series.exits(),
            drops: self.drops.clone(),
            endpoint_labels: self.endpoint_labels.clone(),
            node: Some(self.node.clone()),
            clock: crate::clock::ClockQuality::read(),
            process_trees: self.trees.series(),
            agent: self.own_cost.read(self.collection_duration_seconds),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
