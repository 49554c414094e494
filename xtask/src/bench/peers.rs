//! The configurations compared in the A/B rounds: nothing, workerprobe with each set of
//! programs, and the peers (bpftrace, a psutil poller, a cgroupfs poller). Starts and
//! stops each, measures its own CPU, and reads what it reported about the mix worker.

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

use super::sys::{self, Guarded};
use super::workloads::MixRun;

/// One configuration of an A/B round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Config {
    /// Nothing attached.
    Baseline,
    /// workerprobe with only the empty sched_switch program (`--programs floor`).
    Floor,
    /// workerprobe with the CPU accounting programs.
    Cpu,
    /// workerprobe with every program group.
    All,
    /// bpftrace running bench/cgroup_cpu_bytes.bt.
    Bpftrace,
    /// bench/psutil_poller.py, like Lithops' SystemMonitor.
    Psutil,
    /// bench/cgroupfs_poller.py, like cAdvisor.
    Cgroupfs,
}

impl Config {
    /// Every configuration; the A/B rounds rotate through them.
    pub const ALL: [Config; 7] = [
        Config::Baseline,
        Config::Floor,
        Config::Cpu,
        Config::All,
        Config::Bpftrace,
        Config::Psutil,
        Config::Cgroupfs,
    ];

    /// Name in tables.
    pub fn label(self, env: &PeerEnv) -> String {
        match self {
            Config::Baseline => "baseline (nothing attached)".to_owned(),
            Config::Floor => "workerprobe floor (empty tp_btf/sched_switch)".to_owned(),
            Config::Cpu => "workerprobe --programs cpu".to_owned(),
            Config::All => format!("workerprobe --programs {}", env.all_groups),
            Config::Bpftrace => "bpftrace (same accounting)".to_owned(),
            Config::Psutil => "psutil poller (1 s)".to_owned(),
            Config::Cgroupfs => "cgroupfs poller (1 s)".to_owned(),
        }
    }

    /// A short name for file and cgroup names.
    pub fn slug(self) -> &'static str {
        match self {
            Config::Baseline => "base",
            Config::Floor => "floor",
            Config::Cpu => "cpu",
            Config::All => "all",
            Config::Bpftrace => "bpftrace",
            Config::Psutil => "psutil",
            Config::Cgroupfs => "cgroupfs",
        }
    }

    /// Whether this is a peer (its accuracy on the mix comes from the A/B rounds).
    pub fn is_peer(self) -> bool {
        matches!(self, Config::Bpftrace | Config::Psutil | Config::Cgroupfs)
    }
}

/// What starting the configurations needs.
pub struct PeerEnv {
    /// The workerprobe binary.
    pub agent: PathBuf,
    /// Every program group of the agent, comma-separated (from its --help).
    pub all_groups: String,
    /// The repository's bench/ directory with the peer scripts.
    pub scripts: PathBuf,
    /// The cgroup2 mount.
    pub mount: PathBuf,
    /// The bench's parent cgroup, relative to the mount (e.g. "/wpbench").
    pub bench_rel: String,
    /// Where peers write their output.
    pub scratch: PathBuf,
}

/// A running configuration.
pub struct Running {
    config: Config,
    process: Option<Guarded>,
    output: Option<PathBuf>,
    cpu_at_start: f64,
    started: Instant,
}

/// What a configuration left behind once stopped.
pub struct Stopped {
    /// The configuration.
    pub config: Config,
    /// Its own CPU use while it ran, in % of one core (None for the baseline).
    pub own_cpu_percent: Option<f64>,
    /// What it printed (peers only).
    pub output: String,
}

/// A peer's report of the mix worker: CPU seconds and bytes, where it reports them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Estimate {
    /// CPU seconds it attributes to the worker.
    pub cpu_seconds: Option<f64>,
    /// Bytes sent it attributes to the worker.
    pub sent_bytes: Option<u64>,
    /// Bytes received.
    pub received_bytes: Option<u64>,
}

/// Starts `config` and waits until it is attached or polling.
pub fn start(config: Config, env: &PeerEnv, programs: Option<&str>) -> Result<Running> {
    let (process, output) = match config {
        Config::Baseline => (None, None),
        Config::Floor | Config::Cpu | Config::All => {
            let groups = programs.unwrap_or(match config {
                Config::Floor => "floor",
                Config::Cpu => "cpu",
                _ => &env.all_groups,
            });
            (Some(start_agent(env, groups)?), None)
        }
        Config::Bpftrace => {
            let out = env.scratch.join("bpftrace.out");
            let mut bt = Command::new("bpftrace");
            bt.arg("-f")
                .arg("json")
                .arg(env.scripts.join("cgroup_cpu_bytes.bt"));
            let guard = spawn_to_file("bpftrace", bt, &out)?;
            // bpftrace compiles and attaches first: its first JSON line says it is done.
            sys::wait_for_line(&out, "attached_probes", Duration::from_secs(60), "bpftrace")?;
            (Some(guard), Some(out))
        }
        Config::Psutil => {
            let out = env.scratch.join("psutil.out");
            let mut py = Command::new("/usr/bin/python3");
            py.arg(env.scripts.join("psutil_poller.py"))
                .arg("--cgroup-parent")
                .arg(env.mount.join(env.bench_rel.trim_start_matches('/')))
                .args(["--prefix", "mix"]);
            let guard = spawn_to_file("psutil poller", py, &out)?;
            sys::wait_for_line(&out, "\"t\"", Duration::from_secs(30), "psutil poller")?;
            (Some(guard), Some(out))
        }
        Config::Cgroupfs => {
            let out = env.scratch.join("cgroupfs.out");
            let mut py = Command::new("/usr/bin/python3");
            py.arg(env.scripts.join("cgroupfs_poller.py"))
                .arg("--mount")
                .arg(&env.mount)
                .arg("--report-prefix")
                .arg(&env.bench_rel);
            let guard = spawn_to_file("cgroupfs poller", py, &out)?;
            sys::wait_for_line(&out, "\"t\"", Duration::from_secs(30), "cgroupfs poller")?;
            (Some(guard), Some(out))
        }
    };
    let cpu_at_start = match &process {
        Some(p) => sys::process_cpu_seconds(p.pid())?,
        None => 0.0,
    };
    Ok(Running {
        config,
        process,
        output,
        cpu_at_start,
        // Own CPU counts from here: start-up (compiling, loading) is reported separately.
        started: Instant::now(),
    })
}

/// `workerprobe snapshot` with a long window, attached; killed when the config stops.
/// `groups` is a `--programs` value, optionally followed by more agent flags (e.g.
/// `net --net-attach fexit`).
fn start_agent(env: &PeerEnv, groups: &str) -> Result<Guarded> {
    let mut agent = Command::new(&env.agent);
    let mut words = groups.split_whitespace();
    agent
        .args(["snapshot", "--duration", "24h", "--programs"])
        .args(words.next())
        .args(words)
        .stdout(Stdio::null());
    Ok(sys::spawn_attached(&format!("workerprobe --programs {groups}"), agent)?.0)
}

/// Spawns a peer with stdout to `out` and stderr discarded (bpftrace warns about rlimits).
fn spawn_to_file(name: &str, mut command: Command, out: &PathBuf) -> Result<Guarded> {
    let file =
        fs::File::create(out).with_context(|| format!("could not create {}", out.display()))?;
    command
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(Stdio::null());
    Guarded::spawn(name, command)
}

impl Running {
    /// The configuration.
    pub fn config(&self) -> Config {
        self.config
    }

    /// Stops it (SIGINT so bpftrace prints its maps and the pollers flush), measuring its
    /// own CPU just before.
    pub fn stop(self) -> Result<Stopped> {
        let own_cpu_percent = match &self.process {
            Some(p) => {
                let cpu = sys::process_cpu_seconds(p.pid())? - self.cpu_at_start;
                Some(cpu / self.started.elapsed().as_secs_f64() * 100.0)
            }
            None => None,
        };
        if let Some(process) = self.process {
            let name = process.name.clone();
            // The agent needs no clean exit (the kernel detaches its programs); the peers
            // print or flush on SIGINT.
            let signal = if self.config.is_peer() {
                libc::SIGINT
            } else {
                libc::SIGTERM
            };
            process
                .stop(signal, Duration::from_secs(20))
                .with_context(|| format!("stopping {name}"))?;
        }
        let output = match &self.output {
            Some(path) => fs::read_to_string(path)
                .with_context(|| format!("could not read {}", path.display()))?,
            None => String::new(),
        };
        Ok(Stopped {
            config: self.config,
            own_cpu_percent,
            output,
        })
    }
}

impl Stopped {
    /// What this peer reported about the mix run `mix` in the cgroup `rel_path`.
    pub fn estimate(&self, mix: &MixRun, rel_path: &str) -> Result<Estimate> {
        match self.config {
            Config::Bpftrace => bpftrace_estimate(&self.output, mix.cgroup_id),
            Config::Psutil => Ok(psutil_estimate(&self.output, mix)),
            Config::Cgroupfs => Ok(cgroupfs_estimate(&self.output, rel_path)),
            _ => Ok(Estimate::default()),
        }
    }
}

/// Reads bpftrace's exit-time maps (`-f json`): `{"type":"map","data":{"@cpu_ns":{id:v}}}`.
fn bpftrace_estimate(output: &str, cgroup_id: u64) -> Result<Estimate> {
    let key = cgroup_id.to_string();
    let mut estimate = Estimate::default();
    let mut saw_map = false;
    for line in output.lines() {
        let Ok(doc) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if doc["type"] != "map" {
            continue;
        }
        saw_map = true;
        let data = &doc["data"];
        if let Some(ns) = data["@cpu_ns"][&key].as_u64() {
            estimate.cpu_seconds = Some(ns as f64 / 1e9);
        }
        if let Some(v) = data["@sent"][&key].as_u64() {
            estimate.sent_bytes = Some(v);
        }
        if let Some(v) = data["@recv"][&key].as_u64() {
            estimate.received_bytes = Some(v);
        }
    }
    anyhow::ensure!(saw_map, "bpftrace printed no maps at exit: {output}");
    // A map without the worker means bpftrace saw nothing of it: report 0, not n/a.
    estimate.cpu_seconds.get_or_insert(0.0);
    estimate.sent_bytes.get_or_insert(0);
    estimate.received_bytes.get_or_insert(0);
    Ok(estimate)
}

/// The psutil poller's view: the last sample that still saw the mix process gives its CPU;
/// host-wide network counters between the last sample before it started and that sample
/// give its bytes (what Lithops reports).
fn psutil_estimate(output: &str, mix: &MixRun) -> Estimate {
    let pid = mix.pid.to_string();
    let samples: Vec<serde_json::Value> = output
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let before = samples
        .iter()
        .rev()
        .find(|s| s["t"].as_f64().is_some_and(|t| t <= mix.start_mono));
    let last_seen = samples.iter().rev().find(|s| s["cpu"][&pid].is_number());
    let cpu_seconds = Some(
        last_seen
            .and_then(|s| s["cpu"][&pid].as_f64())
            .unwrap_or(0.0),
    );
    let delta = |field: &str| -> Option<u64> {
        let (Some(a), Some(b)) = (before, last_seen) else {
            return Some(0);
        };
        Some(b[field].as_u64()?.saturating_sub(a[field].as_u64()?))
    };
    Estimate {
        cpu_seconds,
        sent_bytes: delta("net_sent"),
        received_bytes: delta("net_recv"),
    }
}

/// The cgroupfs poller's view: the last `usage_usec` it read for the worker's cgroup. It
/// has no bytes.
fn cgroupfs_estimate(output: &str, rel_path: &str) -> Estimate {
    let usec = output
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|s| s["usage_usec"][rel_path].as_u64())
        .unwrap_or(0);
    Estimate {
        cpu_seconds: Some(usec as f64 / 1e6),
        sent_bytes: None,
        received_bytes: None,
    }
}
