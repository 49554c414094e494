//! `cargo xtask bench`: workerprobe's overhead, accuracy and cost against a baseline and
//! against peers (bpftrace, a psutil poller, a cgroupfs poller), all in one run, written to
//! BENCHMARKS.md.
//!
//! Every comparison is a ratio within the run: configurations are interleaved round by
//! round in rotating order, so drift of the VM hits all of them alike.

mod peers;
mod report;
mod stats;
mod sys;
mod workloads;

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead as _, BufReader, Read as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::{cmd, setup};
use peers::{Config, PeerEnv};
use stats::Summary;
use sys::{Cgroup, Guarded};
pub use workloads::WorkloadMode;
use workloads::{MixRun, Runner, Sizes, Workload};

/// Options of `cargo xtask bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Interleaved A/B rounds (each runs every configuration once).
    #[arg(long, default_value_t = 10)]
    pub rounds: usize,
    /// A few seconds per section, one round: checks that the harness works, not the agent.
    /// Writes to a temporary file unless --out is given.
    #[arg(long)]
    pub smoke: bool,
    /// Where to write the report (default: BENCHMARKS.md at the repository root).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// What the VM matrix runs inside each guest, with the agent given by --agent and no setup
    /// or build: the per-event section as JSON to --out, then the agent-cost A/B of the memory
    /// reads as JSON beside it.
    #[arg(long, hide = true, requires_all = ["agent", "out"])]
    pub vm_guest: bool,
    /// The workerprobe binary for --vm-guest.
    #[arg(long, hide = true)]
    pub agent: Option<PathBuf>,
}

/// One program's per-event cost, as `--vm-guest` writes it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct ProgCostRecord {
    /// Who loaded it.
    pub owner: String,
    /// The kernel's program name.
    pub name: String,
    /// Median ns per run over the windows.
    pub ns_per_event: f64,
    /// Median runs per second.
    pub events_per_second: f64,
}

/// Name prefixes of workerprobe's kernel programs: every group's programs start so.
const AGENT_PROG_PREFIXES: &[&str] = &["switch_", "sock_", "wakeup"];

/// The per-event section's first agent: the floor and the CPU group's sched_switch program
/// (forced: on its own the CPU group reads the kernel's accounting with an iterator).
const FLOOR_AND_CPU: &str = "floor,cpu --cpu-attach sched-switch";

/// Owner label of the per-event section's first agent: the floor and the CPU programs.
pub fn cpu_owner() -> String {
    format!("workerprobe --programs {FLOOR_AND_CPU}")
}

/// The per-event section's reference agent: the least exact per-task accounting on
/// sched_switch (`switch_least`), what no design of the sched_switch programs gets under.
const LEAST: &str = "least";

/// Owner label of the reference agent.
pub fn least_owner() -> String {
    format!("workerprobe --programs {LEAST}")
}

/// The agent arguments for `groups` with no slots: every worker's counters and every
/// endpoint's through the hash maps, as before the slots (the per-event section measures both
/// in one window).
pub fn hashes_only(groups: &str) -> String {
    format!("{groups} --cpu-slots 0 --endpoint-slots 0")
}

/// Owner label of the per-event section's second agent: every group.
pub fn all_owner(all_groups: &str) -> String {
    format!("workerprobe --programs {all_groups}")
}

/// The loopback port of the bench's own iperf3 server.
const IPERF_PORT: u16 = 5299;

/// One peer's (or workerprobe's) error on one worker run.
#[derive(Clone, Copy, Debug)]
pub struct AccuracySample {
    /// |estimate − cpu.stat| / cpu.stat, in percent.
    pub cpu_error_percent: f64,
    /// |estimated − actual| bytes sent, when the tool reports bytes.
    pub sent_error: Option<u64>,
    /// |estimated − actual| bytes received.
    pub received_error: Option<u64>,
}

/// Per-event cost of one program over the measuring windows.
#[derive(Clone, Debug)]
pub struct ProgCost {
    /// Who loaded it: "bpftrace", or `workerprobe --programs <groups>`.
    pub owner: String,
    /// The kernel's program name.
    pub name: String,
    /// ns per run, one value per window.
    pub ns_per_event: Vec<f64>,
    /// Runs per second of load, one value per window.
    pub events_per_second: Vec<f64>,
}

/// Agent cost at one number of active workers.
#[derive(Clone, Copy, Debug)]
pub struct AgentCost {
    /// Active worker cgroups.
    pub workers: usize,
    /// `workerprobe top`'s CPU time (all threads, ns-exact), % of one core.
    pub cpu_percent: f64,
    /// Its peak RSS (VmHWM) in bytes: includes loading (parsing the kernel's BTF).
    pub peak_rss: u64,
    /// Its RSS (VmRSS) at the end of the window, in bytes: the running agent.
    pub rss: u64,
    /// Seconds measured.
    pub seconds: f64,
}

/// Windows of the agent-cost section per worker count (its figure is their median).
pub const AGENT_COST_WINDOWS: usize = 3;
/// Seconds of each agent-cost window: long enough to hold the agent's periodic work, whose
/// longest period is 30 s (v1 memberships re-read, vanished workers looked for). A 20 s
/// window after a 3 s warm-up held none of it, and read the agent low.
pub const AGENT_COST_WINDOW_S: f64 = 60.0;

/// Everything measured, for the report.
pub struct Results {
    /// Run parameters.
    pub rounds: usize,
    /// Whether this was the smoke.
    pub smoke: bool,
    /// The command that reproduces it.
    pub command: String,
    /// Start time (UTC, RFC 3339).
    pub date: String,
    /// Machine description rows.
    pub machine: Vec<(String, String)>,
    /// Workload sizes.
    pub sizes: Sizes,
    /// workerprobe's program groups (`--programs` of the "all" configuration).
    pub all_groups: String,
    /// Load-and-attach times in ms.
    pub attach_ms: Vec<f64>,
    /// Per-event costs.
    pub prog_costs: Vec<ProgCost>,
    /// A/B values: (config, workload) → one value per round.
    pub ab: BTreeMap<(Config, Workload), Vec<f64>>,
    /// Own CPU % of one core of each configuration's process, per round.
    pub own_cpu: BTreeMap<Config, Vec<f64>>,
    /// Accuracy of the peers on the mix, per round.
    pub peer_accuracy: BTreeMap<Config, Vec<AccuracySample>>,
    /// workerprobe's accuracy (snapshot around mix + burn workers).
    pub agent_accuracy: Vec<AccuracySample>,
    /// Agent cost by worker count.
    pub agent_cost: Vec<AgentCost>,
    /// Labels of the configurations.
    pub labels: BTreeMap<Config, String>,
}

impl Results {
    /// Per-round overheads (%) of `config` on `workload` against the same round's baseline.
    pub fn overheads(&self, config: Config, workload: Workload) -> Vec<f64> {
        let (Some(base), Some(vals)) = (
            self.ab.get(&(Config::Baseline, workload)),
            self.ab.get(&(config, workload)),
        ) else {
            return Vec::new();
        };
        base.iter()
            .zip(vals)
            .map(|(b, v)| workload.overhead_percent(*v, *b))
            .collect()
    }

    /// Median ns/event of a program, by owner and name.
    pub fn prog_ns(&self, owner: &str, name: &str) -> Option<Summary> {
        self.prog_costs
            .iter()
            .find(|p| p.owner == owner && p.name == name)
            .and_then(|p| Summary::of(&p.ns_per_event))
    }

    /// Fails naming the first section that produced no number: a harness that silently
    /// measures nothing must not pass.
    fn check_complete(&self) -> Result<()> {
        if self.attach_ms.is_empty() {
            bail!("the load-and-attach section produced no number");
        }
        for name in ["switch_floor", "switch_cpu"] {
            if self.prog_ns(&cpu_owner(), name).is_none() {
                bail!("the per-event section measured no runs of {name}");
            }
        }
        if self.prog_ns(&least_owner(), "switch_least").is_none() {
            bail!("the per-event section measured no runs of switch_least");
        }
        if !self.prog_costs.iter().any(|p| p.owner == "bpftrace") {
            bail!("the per-event section found no bpftrace programs");
        }
        for config in Config::ALL {
            for workload in Workload::ALL {
                if self.ab.get(&(config, workload)).is_none_or(Vec::is_empty) {
                    bail!("the A/B section has no {workload:?} number for {config:?}");
                }
            }
            if config.is_peer() && self.peer_accuracy.get(&config).is_none_or(Vec::is_empty) {
                bail!("the accuracy section has no number for {config:?}");
            }
        }
        if self.agent_accuracy.is_empty() {
            bail!("the accuracy section has no number for workerprobe");
        }
        if self.agent_cost.is_empty() {
            bail!("the agent-cost section produced no number");
        }
        Ok(())
    }
}

/// `cargo xtask bench`.
pub fn bench(args: BenchArgs) -> Result<()> {
    if !cmd::is_root() {
        bail!("the bench loads eBPF programs and makes cgroups: run `sudo -E cargo xtask bench`");
    }
    if let (true, Some(agent), Some(out)) = (args.vm_guest, &args.agent, &args.out) {
        return vm_guest(agent, out);
    }
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let rounds = if args.smoke { 1 } else { args.rounds };
    setup::setup()?;
    check_tools()?;
    sys::ensure_tracefs()?;

    let root = cmd::workspace_root()?;
    // The smoke uses the debug agent `cargo xtask test` has just built: a release build
    // from scratch would not fit its time budget. The real bench measures the release one.
    let profile = if args.smoke { "debug" } else { "release" };
    let mut build = cmd::cargo()?;
    build.args(["build", "-p", "probe-user"]);
    if !args.smoke {
        build.arg("--release");
    }
    cmd::run(&mut build)?;
    let agent = cmd::target_dir()?.join(profile).join("workerprobe");
    // Workloads run from an optimised xtask so their own code does not dilute the
    // overheads; the smoke keeps the running (debug) one to stay fast.
    let xtask = if args.smoke {
        std::env::current_exe().context("could not find the xtask binary")?
    } else {
        cmd::run(cmd::cargo()?.args(["build", "--release", "-p", "xtask"]))?;
        cmd::target_dir()?.join("release").join("xtask")
    };

    let scratch = cmd::target_dir()?.join("bench-scratch");
    fs::create_dir_all(&scratch)
        .with_context(|| format!("could not create {}", scratch.display()))?;
    let mount = sys::cgroup2_mount()?;
    let bench_cgroup = Cgroup::create(&mount, "wpbench")?;
    let env = PeerEnv {
        all_groups: all_program_groups(&agent)?,
        agent,
        scripts: root.join("bench"),
        mount: mount.clone(),
        bench_rel: "/wpbench".to_owned(),
        scratch: scratch.clone(),
    };
    let runner = Runner {
        xtask,
        sizes: sizes(args.smoke),
        iperf_port: IPERF_PORT,
        scratch: scratch.clone(),
    };
    let _iperf_server = start_iperf_server()?;
    // Restored to its old value when the bench ends, however it ends.
    let bpf_stats = sys::Sysctl::set("kernel.bpf_stats_enabled", "0")?;

    let mut results = Results {
        rounds,
        smoke: args.smoke,
        command: if args.smoke {
            "sudo -E cargo xtask bench --smoke".to_owned()
        } else {
            format!("sudo -E cargo xtask bench --rounds {rounds}")
        },
        date: now_utc(),
        machine: sys::machine_description(),
        sizes: runner.sizes.clone(),
        all_groups: env.all_groups.clone(),
        attach_ms: Vec::new(),
        prog_costs: Vec::new(),
        ab: BTreeMap::new(),
        own_cpu: BTreeMap::new(),
        peer_accuracy: BTreeMap::new(),
        agent_accuracy: Vec::new(),
        agent_cost: Vec::new(),
        labels: Config::ALL.iter().map(|c| (*c, c.label(&env))).collect(),
    };

    let started = Instant::now();
    progress("load and attach time");
    results.attach_ms = attach_times(&env, if args.smoke { 1 } else { 7 })?;

    progress("per-event cost (bpf_stats on)");
    bpf_stats.write("1")?;
    // And the groups without waits and endpoints: what they add is the difference; and every
    // group with no slots (every worker through the hash maps, the design before slots).
    let without_waits = without_groups(&env.all_groups, &["waits", "endpoints"]);
    results.prog_costs = per_event_costs(
        &env,
        &runner,
        if args.smoke { 1 } else { 3 },
        true,
        &[without_waits, hashes_only(&env.all_groups)],
    )?;
    // bpf_stats add a clock read per program run: off for everything timed below.
    bpf_stats.write("0")?;

    ab_rounds(&env, &runner, &bench_cgroup, rounds, &mut results)?;

    progress("workerprobe accuracy");
    let mix_wall = Summary::of(
        results
            .ab
            .get(&(Config::Baseline, Workload::Mix))
            .map_or(&[][..], |v| v),
    )
    .map_or(2.0, |s| s.median);
    results.agent_accuracy = agent_accuracy(
        &env,
        &runner,
        &bench_cgroup,
        if args.smoke { 1 } else { 5 },
        mix_wall,
    )?;

    progress("agent cost with many workers");
    let counts: &[usize] = if args.smoke {
        &[10, 100]
    } else {
        &[10, 100, 1000]
    };
    let (warm, window) = if args.smoke {
        (1.0, 2.0)
    } else {
        (3.0, AGENT_COST_WINDOW_S)
    };
    // The median of a few windows, each with the agent started afresh: one window on a busy
    // host read 0.70% and then 1.05% for the same agent.
    let windows = if args.smoke { 1 } else { AGENT_COST_WINDOWS };
    for &n in counts {
        let mut runs = (0..windows)
            .map(|_| agent_cost(&env, &runner, &bench_cgroup, n, warm, window, &[]))
            .collect::<Result<Vec<_>>>()?;
        runs.sort_by(|a, b| a.cpu_percent.total_cmp(&b.cpu_percent));
        results.agent_cost.push(runs.swap_remove(runs.len() / 2));
    }
    drop(bpf_stats);
    drop(bench_cgroup);

    results.check_complete()?;
    let out = match (args.out, args.smoke) {
        (Some(out), _) => out,
        (None, true) => std::env::temp_dir().join("workerprobe-bench-smoke.md"),
        (None, false) => root.join("BENCHMARKS.md"),
    };
    let previous = fs::read_to_string(root.join("BENCHMARKS.md")).ok();
    let text = report::render(&results, previous.as_deref());
    fs::write(&out, text).with_context(|| format!("could not write {}", out.display()))?;
    println!(
        "bench: wrote {} in {:.0} s",
        out.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The hidden `cargo xtask bench-workload <mode>`.
pub fn workload(mode: WorkloadMode) -> Result<()> {
    workloads::run_mode(mode)
}

/// A progress line on stderr.
fn progress(what: &str) {
    eprintln!("bench: {what}");
}

/// Workload sizes for the full bench and for the smoke.
fn sizes(smoke: bool) -> Sizes {
    if smoke {
        Sizes {
            pipe_loops: 20_000,
            rr_seconds: 0.3,
            iperf_seconds: 0,
            iperf_bytes: "50M",
            mix_bytes: 20_000_000,
            mix_compute_iters: 20_000_000,
            mix_file_bytes: 4 << 20,
        }
    } else {
        Sizes {
            pipe_loops: 300_000,
            rr_seconds: 1.5,
            iperf_seconds: 2,
            iperf_bytes: "",
            mix_bytes: 200_000_000,
            mix_compute_iters: 1_000_000_000,
            mix_file_bytes: 64 << 20,
        }
    }
}

/// Fails with what to run when a tool the bench drives is missing.
fn check_tools() -> Result<()> {
    for tool in ["perf", "taskset", "iperf3", "bpftool", "bpftrace"] {
        if cmd::find_in_path(tool).is_none() {
            bail!("`{tool}` is not installed: run `sudo -E cargo xtask setup`");
        }
    }
    // bpftrace's classic tracepoints need tracefs; a fresh machine may not have it mounted.
    if !Path::new("/sys/kernel/tracing/events").exists() {
        let mounted = Command::new("mount")
            .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
            .status()
            .is_ok_and(|status| status.success());
        if !mounted {
            bail!(
                "tracefs is not mounted and could not be: run `mount -t tracefs nodev /sys/kernel/tracing`"
            );
        }
    }
    let psutil = cmd::probe(Command::new("/usr/bin/python3").args(["-c", "import psutil"]));
    if psutil.is_none() {
        bail!(
            "/usr/bin/python3 cannot import psutil: run `sudo -E cargo xtask setup` (python3-psutil)"
        );
    }
    Ok(())
}

/// Every `--programs` group the agent offers (its --help lists them), comma-separated.
///
/// Read rather than hard-coded so new groups (e.g. `delays`) are benchmarked as they land.
fn all_program_groups(agent: &Path) -> Result<String> {
    let help = cmd::probe(Command::new(agent).args(["snapshot", "--help"]))
        .with_context(|| format!("`{} snapshot --help` failed", agent.display()))?;
    let mut groups = Vec::new();
    let mut in_values = false;
    for line in help.lines() {
        let line = line.trim();
        if line.starts_with("Possible values") {
            in_values = true;
        } else if in_values {
            match line.strip_prefix("- ").and_then(|l| l.split_once(':')) {
                Some((name, _)) => groups.push(name.trim().to_owned()),
                None => in_values = false,
            }
        }
    }
    groups.retain(|g| g != "floor");
    if groups.is_empty() {
        bail!("`workerprobe snapshot --help` lists no --programs values");
    }
    Ok(groups.join(","))
}

/// `groups` (comma-separated) without `drop`.
pub fn without_groups(groups: &str, drop: &[&str]) -> String {
    groups
        .split(',')
        .filter(|g| !drop.contains(g))
        .collect::<Vec<_>>()
        .join(",")
}

/// `iperf3 -s` on the bench port, once it accepts connections.
fn start_iperf_server() -> Result<Guarded> {
    let mut server = Command::new("iperf3");
    server
        .args(["-s", "-p", &IPERF_PORT.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut guard = Guarded::spawn("iperf3 server", server)?;
    for _ in 0..100 {
        if TcpStream::connect(("127.0.0.1", IPERF_PORT)).is_ok() {
            // iperf3 treats a bare connect as a client that gave up; give it a moment.
            std::thread::sleep(Duration::from_millis(200));
            return Ok(guard);
        }
        if guard.child.try_wait()?.is_some() {
            bail!("iperf3 -s -p {IPERF_PORT} exited at once (is the port in use?)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("iperf3 -s -p {IPERF_PORT} never accepted a connection")
}

/// Current UTC time from `date`, for the report header.
fn now_utc() -> String {
    cmd::probe(Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"]))
        .map_or_else(|| "unknown".to_owned(), |s| s.trim().to_owned())
}

/// Section 6b: ms from spawning `workerprobe snapshot` to its "attached" line.
fn attach_times(env: &PeerEnv, runs: usize) -> Result<Vec<f64>> {
    let mut times = Vec::new();
    for _ in 0..runs {
        let mut snapshot = Command::new(&env.agent);
        snapshot
            .args([
                "snapshot",
                "--duration",
                "100ms",
                "--programs",
                &env.all_groups,
            ])
            .stdout(Stdio::null());
        let (mut agent, elapsed) = sys::spawn_attached("workerprobe snapshot", snapshot)?;
        times.push(elapsed.as_secs_f64() * 1e3);
        let status = agent.wait(Duration::from_secs(30))?;
        if !status.success() {
            bail!("workerprobe snapshot failed ({status})");
        }
    }
    Ok(times)
}

/// The VM guest's sections, written as JSON: no setup, no build, the given agent.
fn vm_guest(agent: &Path, out: &Path) -> Result<()> {
    check_tools()?;
    sys::ensure_tracefs()?;
    let scratch = std::env::temp_dir().join("wp-bench-scratch");
    fs::create_dir_all(&scratch)
        .with_context(|| format!("could not create {}", scratch.display()))?;
    let mount = sys::cgroup2_mount()?;
    let bench_cgroup = Cgroup::create(&mount, "wpbench")?;
    let env = PeerEnv {
        all_groups: all_program_groups(agent)?,
        agent: agent.to_path_buf(),
        scripts: cmd::workspace_root()?.join("bench"),
        mount,
        bench_rel: "/wpbench".to_owned(),
        scratch: scratch.clone(),
    };
    let runner = Runner {
        xtask: std::env::current_exe().context("could not find the xtask binary")?,
        // Emulated VMs are slow: a load of seconds, still thousands of events per program.
        sizes: Sizes {
            pipe_loops: 50_000,
            rr_seconds: 1.0,
            ..sizes(false)
        },
        iperf_port: IPERF_PORT,
        scratch,
    };
    let bpf_stats = sys::Sysctl::set("kernel.bpf_stats_enabled", "1")?;
    // Where the kernel has the socket-length tracepoints, the fexit variant is measured beside
    // them, on the same load.
    let btf = fs::read("/sys/kernel/btf/vmlinux").unwrap_or_default();
    let has_tracepoints = btf
        .windows(b"btf_trace_sock_send_length".len())
        .any(|w| w == b"btf_trace_sock_send_length");
    let more: Vec<String> = if has_tracepoints {
        vec!["net --net-attach fexit".to_owned()]
    } else {
        Vec::new()
    };
    let costs = per_event_costs(&env, &runner, 2, false, &more)?;
    drop(bpf_stats);
    let records: Vec<ProgCostRecord> = costs
        .iter()
        .filter_map(|cost| {
            Some(ProgCostRecord {
                owner: cost.owner.clone(),
                name: cost.name.clone(),
                ns_per_event: Summary::of(&cost.ns_per_event)?.median,
                events_per_second: Summary::of(&cost.events_per_second)?.median,
            })
        })
        .collect();
    let text = serde_json::to_string_pretty(&records)?;
    fs::write(out, text).with_context(|| format!("could not write {}", out.display()))?;

    // The agent's CPU with many workers, memory read by the walk against from each worker's files (pure
    // cgroup2 here, unlike the host): A/B interleaved, beside the per-event costs.
    let mut percents: Vec<Vec<f64>> = vec![Vec::new(); VM_MEMORY_READS.len()];
    for round in 0..VM_AGENT_COST_ROUNDS {
        for offset in 0..VM_MEMORY_READS.len() {
            let which = (round + offset) % VM_MEMORY_READS.len();
            let (_, args) = VM_MEMORY_READS[which];
            let cost = agent_cost(
                &env,
                &runner,
                &bench_cgroup,
                1000,
                12.0,
                AGENT_COST_WINDOW_S,
                args,
            )?;
            percents[which].push(cost.cpu_percent);
        }
    }
    let records: Vec<AgentCostRecord> = VM_MEMORY_READS
        .iter()
        .zip(&percents)
        .filter_map(|((memory_read, _), percents)| {
            let summary = Summary::of(percents)?;
            Some(AgentCostRecord {
                memory_read: (*memory_read).to_owned(),
                workers: 1000,
                cpu_percent: summary.median,
                cpu_percent_min: summary.min,
                cpu_percent_max: summary.max,
            })
        })
        .collect();
    let agent_out = out.with_file_name(AGENT_COST_FILE);
    fs::write(&agent_out, serde_json::to_string_pretty(&records)?)
        .with_context(|| format!("could not write {}", agent_out.display()))
}

/// Rounds of the VM's agent-cost A/B.
const VM_AGENT_COST_ROUNDS: usize = 3;
/// The memory reads compared in the VMs: how the report names each, and the agent's flags.
const VM_MEMORY_READS: [(&str, &[&str]); 2] = [
    ("one cgroup walk a sample (default)", &[]),
    ("each worker's files", &["--memory-read", "files"]),
];
/// File beside the per-event JSON holding the VM's agent-cost records.
pub const AGENT_COST_FILE: &str = "agent_cost.json";

/// The agent's CPU at many workers in a VM, as `--vm-guest` writes it.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct AgentCostRecord {
    /// How memory was read.
    pub memory_read: String,
    /// Active worker cgroups.
    pub workers: usize,
    /// Median `top` CPU over the rounds, % of one core.
    pub cpu_percent: f64,
    /// Lowest round.
    pub cpu_percent_min: f64,
    /// Highest round.
    pub cpu_percent_max: f64,
}

/// Section 1: ns per run of each program, workerprobe's (with the floor) and bpftrace's, under
/// a pipe + request/response load.
///
/// Each agent (and bpftrace) runs the load alone, one after another in each window, in an
/// order rotated by one each window. Not all at once: programs on one tracepoint run in
/// attach order, and a later one finds the task's and socket's cache lines warmed by an
/// earlier one (of two agents with the same programs here, the second measured 10–20%
/// cheaper than the first).
fn per_event_costs(
    env: &PeerEnv,
    runner: &Runner,
    windows: usize,
    with_bpftrace: bool,
    more_agents: &[String],
) -> Result<Vec<ProgCost>> {
    // floor + cpu (the floor and the cpu-only sched_switch program), the least per-task
    // accounting, every group (whose sched_switch program may differ, e.g. `switch_full` when
    // delays are on), then the variants a kernel may refuse.
    let mut attachments: Vec<Attachment> = [
        FLOOR_AND_CPU.to_owned(),
        LEAST.to_owned(),
        env.all_groups.clone(),
    ]
    .into_iter()
    .map(|groups| Attachment::Agent {
        groups,
        required: true,
    })
    .chain(more_agents.iter().map(|groups| Attachment::Agent {
        groups: groups.clone(),
        required: false,
    }))
    .collect();
    // bpftrace's script needs the socket-length tracepoints (6.3+): the VMs go without.
    if with_bpftrace {
        attachments.push(Attachment::Bpftrace);
    }
    let mut costs: Vec<ProgCost> = Vec::new();
    for window in 0..windows {
        for k in 0..attachments.len() {
            let attachment = &attachments[(k + window) % attachments.len()];
            let Some(measured) = measure_alone(env, runner, attachment)? else {
                continue;
            };
            for run in measured {
                let entry = match costs
                    .iter_mut()
                    .find(|c| c.owner == run.owner && c.name == run.name)
                {
                    Some(entry) => entry,
                    None => {
                        costs.push(ProgCost {
                            owner: run.owner,
                            name: run.name,
                            ns_per_event: Vec::new(),
                            events_per_second: Vec::new(),
                        });
                        costs.last_mut().expect("just pushed")
                    }
                };
                entry.ns_per_event.push(run.ns_per_event);
                entry.events_per_second.push(run.events_per_second);
            }
        }
    }
    Ok(costs)
}

/// What the per-event section attaches, one at a time.
enum Attachment {
    /// workerprobe with these program groups; a variant that is not `required` is left out
    /// where the kernel refuses it (e.g. fexit).
    Agent { groups: String, required: bool },
    /// bpftrace's script of the same accounting.
    Bpftrace,
}

/// One program's cost over one load run.
struct ProgRun {
    /// Who loaded it.
    owner: String,
    /// The kernel's program name.
    name: String,
    /// Mean ns per run.
    ns_per_event: f64,
    /// Runs per second of the load.
    events_per_second: f64,
}

/// Attaches one agent (or bpftrace), runs the load and detaches it: each of its programs that
/// ran. `None` for an optional variant this kernel refuses.
fn measure_alone(
    env: &PeerEnv,
    runner: &Runner,
    attachment: &Attachment,
) -> Result<Option<Vec<ProgRun>>> {
    let before = sys::prog_stats()?;
    let (owner, running, listed) = match attachment {
        Attachment::Agent { groups, required } => {
            let agent = match peers::start(Config::All, env, Some(groups)) {
                Ok(agent) => agent,
                Err(err) if !required => {
                    println!("bench: `workerprobe --programs {groups}` cannot run here: {err:#}");
                    return Ok(None);
                }
                Err(err) => return Err(err),
            };
            let listed = sys::prog_stats()?;
            (format!("workerprobe --programs {groups}"), agent, listed)
        }
        Attachment::Bpftrace => {
            let bpftrace = peers::start(Config::Bpftrace, env, None)?;
            // bpftrace may report its probes a moment before they show in bpftool: wait.
            let mut listed = sys::prog_stats()?;
            let deadline = Instant::now() + Duration::from_secs(10);
            while listed.keys().all(|id| before.contains_key(id)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
                listed = sys::prog_stats()?;
            }
            ("bpftrace".to_owned(), bpftrace, listed)
        }
    };
    // Its programs are those that appeared when it attached.
    let ids: Vec<u64> = listed
        .iter()
        .filter(|(id, p)| {
            !before.contains_key(id)
                && match attachment {
                    Attachment::Agent { .. } => AGENT_PROG_PREFIXES
                        .iter()
                        .any(|pre| p.name.starts_with(pre)),
                    Attachment::Bpftrace => true,
                }
        })
        .map(|(id, _)| *id)
        .collect();
    let s0 = sys::prog_stats()?;
    let t0 = Instant::now();
    runner.pipe()?;
    runner.rr()?;
    let seconds = t0.elapsed().as_secs_f64();
    let s1 = sys::prog_stats()?;
    running.stop()?;
    Ok(Some(
        ids.into_iter()
            .filter_map(|id| {
                let (a, b) = (s0.get(&id)?, s1.get(&id)?);
                let runs = b.run_cnt.saturating_sub(a.run_cnt);
                (runs != 0).then(|| ProgRun {
                    owner: owner.clone(),
                    name: b.name.clone(),
                    ns_per_event: b.run_time_ns.saturating_sub(a.run_time_ns) as f64 / runs as f64,
                    events_per_second: runs as f64 / seconds,
                })
            })
            .collect(),
    ))
}

/// Sections 2–4: every configuration once per round, in rotating order, each running every
/// workload; peers' own CPU and their accuracy on the mix are read as they stop.
fn ab_rounds(
    env: &PeerEnv,
    runner: &Runner,
    bench_cgroup: &Cgroup,
    rounds: usize,
    results: &mut Results,
) -> Result<()> {
    let n = Config::ALL.len();
    for round in 0..rounds {
        for k in 0..n {
            let config = Config::ALL[(k + round) % n];
            progress(&format!(
                "A/B round {}/{rounds}: {}",
                round + 1,
                results.labels[&config]
            ));
            let running = peers::start(config, env, None)?;
            let mut mix: Option<(MixRun, Cgroup)> = None;
            for workload in Workload::ALL {
                let value = if workload == Workload::Mix {
                    let name = format!("mix-r{round}-{}", config.slug());
                    let cgroup = Cgroup::create(&bench_cgroup.dir, &name)?;
                    let run = runner.mix(&cgroup)?;
                    let wall = run.wall_seconds;
                    mix = Some((run, cgroup));
                    wall
                } else {
                    runner
                        .run(workload)
                        .with_context(|| format!("{workload:?} under {config:?}"))?
                };
                results
                    .ab
                    .entry((config, workload))
                    .or_default()
                    .push(value);
            }
            debug_assert_eq!(running.config(), config);
            let stopped = running.stop()?;
            if let Some(cpu) = stopped.own_cpu_percent {
                results.own_cpu.entry(config).or_default().push(cpu);
            }
            if let (true, Some((run, cgroup))) = (config.is_peer(), &mix) {
                let rel = format!(
                    "{}/{}",
                    env.bench_rel,
                    cgroup.dir.file_name().unwrap_or_default().to_string_lossy()
                );
                let estimate = stopped.estimate(run, &rel)?;
                results
                    .peer_accuracy
                    .entry(config)
                    .or_default()
                    .push(accuracy(
                        run,
                        estimate.cpu_seconds,
                        estimate.sent_bytes,
                        estimate.received_bytes,
                    ));
            }
        }
    }
    Ok(())
}

/// Errors of an estimate against the kernel's cpu.stat and the mix's own byte counts.
fn accuracy(
    run: &MixRun,
    cpu_seconds: Option<f64>,
    sent: Option<u64>,
    received: Option<u64>,
) -> AccuracySample {
    let reference = run.usage_usec as f64 / 1e6;
    AccuracySample {
        cpu_error_percent: cpu_seconds.map_or(100.0, |c| (c - reference).abs() / reference * 100.0),
        sent_error: sent.map(|s| s.abs_diff(run.sent_bytes)),
        received_error: received.map(|r| r.abs_diff(run.received_bytes)),
    }
}

/// Section 5 for workerprobe: a snapshot window around a mix worker and a CPU-bound worker
/// running side by side, each in its own fresh cgroup.
fn agent_accuracy(
    env: &PeerEnv,
    runner: &Runner,
    bench_cgroup: &Cgroup,
    reps: usize,
    mix_wall: f64,
) -> Result<Vec<AccuracySample>> {
    let burn_ms: u64 = if runner.sizes.pipe_loops < 100_000 {
        200
    } else {
        800
    };
    // Long enough that both workers end inside the window, whatever the noise.
    let window_ms = ((mix_wall.max(burn_ms as f64 / 1e3) * 2.0 + 1.5) * 1e3) as u64;
    let mut samples = Vec::new();
    for rep in 0..reps {
        let mix_cg = Cgroup::create(&bench_cgroup.dir, &format!("acc-mix-{rep}"))?;
        let burn_cg = Cgroup::create(&bench_cgroup.dir, &format!("acc-burn-{rep}"))?;
        let mut snapshot = Command::new(&env.agent);
        snapshot
            .args([
                "snapshot",
                "--json",
                "--programs",
                &env.all_groups,
                "--duration",
            ])
            .arg(format!("{window_ms}ms"))
            .stdout(Stdio::piped());
        let (mut agent, _) = sys::spawn_attached("workerprobe snapshot --json", snapshot)?;
        let mut stdout = agent
            .child
            .stdout
            .take()
            .context("snapshot stdout not piped")?;
        let run = std::thread::scope(|scope| -> Result<MixRun> {
            let burn = scope.spawn(|| runner.burn(&burn_cg, 2, burn_ms));
            let run = runner.mix(&mix_cg);
            burn.join()
                .map_err(|_| anyhow::anyhow!("burn thread panicked"))??;
            run
        })?;
        let burn_usec = burn_cg.usage_usec()?;
        let mut text = String::new();
        stdout
            .read_to_string(&mut text)
            .context("could not read the snapshot's JSON")?;
        let status = agent.wait(Duration::from_secs(30))?;
        if !status.success() {
            bail!("workerprobe snapshot --json failed ({status})");
        }
        let doc: serde_json::Value =
            serde_json::from_str(&text).context("workerprobe snapshot printed no JSON")?;
        let worker = |name: &str| {
            let path = format!("{}/{name}", env.bench_rel);
            doc["workers"]
                .as_array()
                .and_then(|ws| ws.iter().find(|w| w["path"] == path.as_str()))
                .cloned()
                .unwrap_or(serde_json::Value::Null)
        };
        let m = worker(&format!("acc-mix-{rep}"));
        samples.push(accuracy(
            &run,
            Some(m["cpu"]["seconds"].as_f64().unwrap_or(0.0)),
            Some(m["net"]["sent_bytes"].as_u64().unwrap_or(0)),
            Some(m["net"]["received_bytes"].as_u64().unwrap_or(0)),
        ));
        // The CPU-bound worker moves no bytes: its byte error is whatever was counted.
        let b = worker(&format!("acc-burn-{rep}"));
        let burn_run = MixRun {
            sent_bytes: 0,
            received_bytes: 0,
            usage_usec: burn_usec,
            ..run
        };
        samples.push(accuracy(
            &burn_run,
            Some(b["cpu"]["seconds"].as_f64().unwrap_or(0.0)),
            Some(b["net"]["sent_bytes"].as_u64().unwrap_or(0)),
            Some(b["net"]["received_bytes"].as_u64().unwrap_or(0)),
        ));
    }
    Ok(samples)
}

/// Section 6: `workerprobe top --interval 1s` with `count` active worker cgroups.
fn agent_cost(
    env: &PeerEnv,
    runner: &Runner,
    bench_cgroup: &Cgroup,
    count: usize,
    warm: f64,
    window: f64,
    agent_args: &[&str],
) -> Result<AgentCost> {
    let parent = Cgroup::create(&bench_cgroup.dir, &format!("tick-{count}"))?;
    // The workers get the memory controller where cgroup2 has it (not on hybrid hosts, where
    // the write fails and their memory is read as without it).
    for dir in [&bench_cgroup.dir, &parent.dir] {
        let _ = fs::write(dir.join("cgroup.subtree_control"), "+memory");
    }
    for i in 0..count {
        let dir = parent.dir.join(format!("w{i}"));
        if !dir.is_dir() {
            fs::create_dir(&dir).with_context(|| format!("could not create {}", dir.display()))?;
        }
    }
    let mut tick = Command::new(&runner.xtask);
    tick.args(["bench-workload", "tick", "--parent"])
        .arg(&parent.dir)
        .arg("--count")
        .arg(count.to_string())
        .arg("--seconds")
        .arg((warm + window + 10.0).to_string())
        .stdout(Stdio::piped());
    let mut workers = Guarded::spawn("bench-workload tick", tick)?;
    let stdout = workers
        .child
        .stdout
        .take()
        .context("tick stdout not piped")?;
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l == "ready");
    if !ready {
        bail!("bench-workload tick exited before its {count} workers were ready");
    }

    let mut top = Command::new(&env.agent);
    top.args(["top", "--interval", "1s"])
        .args(agent_args)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let top = Guarded::spawn("workerprobe top", top)?;
    // Load and attach are measured on their own; this is the steady state.
    std::thread::sleep(Duration::from_secs_f64(warm));
    let c0 = sys::process_cpu_seconds(top.pid())?;
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(window));
    let c1 = sys::process_cpu_seconds(top.pid())
        .context("workerprobe top exited during the agent-cost window")?;
    let seconds = t0.elapsed().as_secs_f64();
    let peak_rss = sys::process_peak_rss(top.pid())?;
    let rss = sys::process_rss(top.pid())?;
    top.stop(libc::SIGTERM, Duration::from_secs(10))?;
    // The workers die with their parent (PR_SET_PDEATHSIG); wait until the cgroups are
    // empty so they can be removed.
    workers.stop(libc::SIGKILL, Duration::from_secs(10))?;
    let deadline = Instant::now() + Duration::from_secs(20);
    for i in 0..count {
        let procs = parent.dir.join(format!("w{i}")).join("cgroup.procs");
        while fs::read_to_string(&procs).is_ok_and(|t| !t.trim().is_empty()) {
            if Instant::now() > deadline {
                bail!("tick workers in {} did not exit", procs.display());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(AgentCost {
        workers: count,
        cpu_percent: (c1 - c0) / seconds * 100.0,
        peak_rss,
        rss,
        seconds,
    })
}
