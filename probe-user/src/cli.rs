//! Command-line interface (clap only; values are validated by their parsers).

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// workerprobe: what each worker (cgroup) on this node did — CPU time per core, socket bytes —
/// measured by eBPF programs on scheduler and socket tracepoints. Needs root.
#[derive(Debug, Parser)]
#[command(name = "workerprobe", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Live table of active workers: CPU cores used (total and per CPU), send and receive
    /// rates, and totals since start. Refreshes every --interval until Ctrl-C.
    Top(TopArgs),
    /// Attach, wait --duration, and print what each worker did in that window (per-CPU detail
    /// and map drops included).
    Snapshot(SnapshotArgs),
    /// Print one exit summary per worker as each one ends (its cgroup is removed): CPU total,
    /// user/system and per CPU, time breakdown, bytes, memory peak, and a Lithops view.
    Watch(WatchArgs),
    /// Run a command in a fresh cgroup and print its exit summary when it ends; exits with the
    /// command's status (128 + signal if it was killed).
    Exec(ExecArgs),
    /// Serve Prometheus metrics of every worker on /metrics (and /healthz) over HTTP.
    Serve(ServeArgs),
    /// Record every worker's numbers to a JSON Lines file: a header, one line per tick per
    /// active worker, one line per worker exit.
    Record(RecordArgs),
    /// Show a recording as `top` would have shown it, at any recorded time.
    Replay(ReplayArgs),
    /// Draw a recording as one SVG: a Gantt of worker lives, then per worker CPU cores, the
    /// time breakdown, send and receive rates and memory, on the node's clock.
    Plot(PlotArgs),
    /// Write a recording as Chrome / Perfetto trace-event JSON (ui.perfetto.dev,
    /// chrome://tracing): a track per worker life, counter tracks for CPU, bytes and delays.
    Trace(TraceArgs),
    /// Write one self-contained HTML page: the plots and sortable tables of exit summaries.
    Report(ReportArgs),
    /// Merge several nodes' recordings into one on one wall-clock timeline, each node's lines
    /// placed by its own clock and named by its node (for plot, trace, report and replay).
    Merge(MergeArgs),
    /// Remove a pin set made with --pin DIR: detach its programs, free its maps, remove DIR.
    Unpin(UnpinArgs),
    /// Check this host: load and attach the programs, then print which variant each program
    /// group uses on this kernel (or why it cannot run) and the cgroup2 layout; exits 1 when a
    /// group asked for cannot run.
    Check(CheckArgs),
}

/// `workerprobe check`.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// What to check (the same values as every command's --programs).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "cpu,delays,net,workers,endpoints,waits"
    )]
    pub programs: Vec<ProgramChoice>,
}

/// `workerprobe unpin`.
#[derive(Debug, Args)]
pub struct UnpinArgs {
    /// The directory given to --pin.
    #[arg(value_name = "DIR", value_parser = crate::loader::pin::parse_pin_dir)]
    pub dir: std::path::PathBuf,
}

/// `workerprobe serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on (loopback by default; name another address to expose it).
    #[arg(long, default_value = "127.0.0.1:9464", value_parser = parse_listen)]
    pub listen: std::net::SocketAddr,
    /// How often the kernel maps are read for the exposition, e.g. 1s.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// How long an exited worker stays in the exposition (so its last counters are scraped)
    /// before its series go, keeping label cardinality bounded.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub exit_grace: Duration,
    /// Label endpoint series with raw peer addresses (ip:port) where no --endpoint rule names
    /// them; by default those are summed as `unnamed`, keeping cardinality bounded.
    #[arg(long)]
    pub endpoint_addresses: bool,
    /// Expose named process trees live, NAME:REGEX or the preset `lithops` (as `watch
    /// --process`): each tree's CPU so far while it runs, and its final figures for the
    /// exit grace period. Repeat for several.
    #[arg(long = "process", value_name = "NAME:REGEX|lithops", value_parser = crate::model::process::parse_rule)]
    pub process_rules: Vec<crate::model::process::ProcessRule>,
    #[command(flatten)]
    pub workers: WorkerArgs,
    #[command(flatten)]
    pub probe: ProbeArgs,
}

/// `workerprobe record`.
#[derive(Debug, Args)]
pub struct RecordArgs {
    /// The JSON Lines file to write; one that holds data is refused unless --append.
    #[arg(long, value_name = "FILE", value_parser = parse_output_file)]
    pub out: std::path::PathBuf,
    /// Add this run to the recording in FILE (a new header line starts it) instead of
    /// refusing a file that holds one.
    #[arg(long)]
    pub append: bool,
    /// Time between ticks, e.g. 1s.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Stop after this long (default: until Ctrl-C).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Start a new file (FILE.1, FILE.2, …) when the current one reaches this many MiB.
    #[arg(long, value_name = "MB", value_parser = parse_count::<u64, 1, 1_000_000>)]
    pub rotate_mb: Option<u64>,
    #[command(flatten)]
    pub workers: WorkerArgs,
    #[command(flatten)]
    pub probe: ProbeArgs,
}

/// `workerprobe replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// A recording made by `workerprobe record`.
    #[arg(value_parser = parse_recording_file)]
    pub file: std::path::PathBuf,
    /// Show the tick at this time: seconds from the start (e.g. 30s, 2m) or an RFC 3339
    /// time; default: every tick in turn.
    #[arg(long, value_parser = parse_at_text)]
    pub at: Option<String>,
    /// Only workers whose cgroup path matches this glob, or `name:`, `container:`, `pod:GLOB`.
    #[arg(long = "workers", visible_alias = "worker", value_name = "PATTERN", value_parser = crate::model::selection::parse_pattern)]
    pub patterns: Vec<String>,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// What `plot`, `trace` and `report` read, and which part of it.
#[derive(Debug, Args)]
pub struct PictureArgs {
    /// A recording made by `workerprobe record`.
    #[arg(value_parser = parse_recording_file)]
    pub file: std::path::PathBuf,
    /// The file to write.
    #[arg(long, value_name = "FILE", value_parser = parse_output_file)]
    pub out: std::path::PathBuf,
    /// Only workers whose cgroup path matches this glob, or whose name matches `name:GLOB`,
    /// container `container:GLOB` or pod `pod:GLOB` (repeat for several).
    #[arg(long = "workers", visible_alias = "worker", value_name = "PATTERN", value_parser = crate::model::selection::parse_pattern)]
    pub patterns: Vec<String>,
    /// Start at this time: seconds from the start (e.g. 30s, 2m, 45) or an RFC 3339 time.
    #[arg(long, value_name = "T", value_parser = crate::recording::at::parse_time)]
    pub from: Option<crate::recording::at::At>,
    /// End at this time, written as for --from.
    #[arg(long, value_name = "T", value_parser = crate::recording::at::parse_time)]
    pub to: Option<crate::recording::at::At>,
}

/// `workerprobe merge`.
#[derive(Debug, Args)]
pub struct MergeArgs {
    /// Recordings made by `workerprobe record`, one or more per node (a node's rotated parts
    /// and later runs may be separate files, but no two files may hold one node at once).
    #[arg(value_parser = parse_recording_file, required = true, num_args = 1..)]
    pub files: Vec<std::path::PathBuf>,
    /// The merged recording to write (refused if it is one of the inputs).
    #[arg(long, value_name = "FILE", value_parser = parse_output_file)]
    pub out: std::path::PathBuf,
}

/// `workerprobe plot`.
#[derive(Debug, Args)]
pub struct PlotArgs {
    #[command(flatten)]
    pub input: PictureArgs,
    /// How many workers get a series in the per-worker panels: the busiest by CPU time,
    /// bytes, or waiting on network and disk, whichever is largest against the busiest
    /// worker's; the Gantt always shows every worker.
    #[arg(long, default_value_t = crate::sink::picture::svg::DEFAULT_BUSIEST, value_parser = parse_count::<u16, 1, 200>)]
    pub busiest: u16,
    /// One CPU panel per CPU (cores of that CPU each worker used) instead of total cores.
    #[arg(long)]
    pub per_cpu: bool,
}

/// `workerprobe trace`.
#[derive(Debug, Args)]
pub struct TraceArgs {
    #[command(flatten)]
    pub input: PictureArgs,
}

/// `workerprobe report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    #[command(flatten)]
    pub input: PictureArgs,
    /// How many workers (the busiest) get a series in the plots' per-worker panels.
    #[arg(long, default_value_t = crate::sink::picture::svg::DEFAULT_BUSIEST, value_parser = parse_count::<u16, 1, 200>)]
    pub busiest: u16,
}

/// A listen address like 127.0.0.1:9464 or [::1]:9464.
pub fn parse_listen(text: &str) -> Result<std::net::SocketAddr, String> {
    text.parse().map_err(|_| {
        format!("`{text}` is not a listen address; write an IP and a port, like 127.0.0.1:9464 or [::]:9464")
    })
}

/// Which workers to report.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Only workers whose cgroup path matches this glob (`*` crosses `/`; a bare name matches
    /// the last component, e.g. nginx.service), whose name matches `name:GLOB`, whose
    /// container's name or id matches `container:GLOB` (e.g. container:ingest-*), or whose
    /// Kubernetes pod matches `pod:GLOB` (name or namespace/name). Repeat for several.
    #[arg(long = "workers", visible_alias = "worker", value_name = "PATTERN", value_parser = crate::model::selection::parse_pattern)]
    pub patterns: Vec<String>,
}

/// Which level of the cgroup tree a worker is.
#[derive(Debug, Args)]
pub struct TreeArgs {
    /// Show the cgroups N levels below the cgroup2 root as workers, or with `pods` each
    /// Kubernetes pod's cgroup, each with its whole subtree's figures (a pod summing its
    /// containers, a slice its services); deeper workers are folded into them, the others
    /// keep their own. Default: every cgroup, each with its own threads' figures.
    #[arg(long, value_name = "N|pods", value_parser = parse_level)]
    pub depth: Option<crate::model::tree::Level>,
}

/// A tree level: a depth from 0 to 64, or `pods`.
fn parse_level(text: &str) -> Result<crate::model::tree::Level, String> {
    use crate::model::tree::Level;
    if text.trim() == "pods" {
        return Ok(Level::Pods);
    }
    parse_count::<usize, 0, 64>(text)
        .map(Level::Depth)
        .map_err(|_| {
            format!("`{text}` is not a depth: write a whole number from 0 to 64, or `pods`")
        })
}

/// `workerprobe watch`.
#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Print JSON lines (a header with the node's facts, then one line per exit) instead of
    /// one human line per exit.
    #[arg(long)]
    pub json: bool,
    /// Stop after this long (default: until Ctrl-C).
    #[arg(long, value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// How often live workers' memory and cpu.stat are sampled, e.g. 1s.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Also summarise every process that ends in the selected workers' cgroups (pid, command
    /// line, its own CPU as rusage counts it, waits, bytes, peak RSS, exit status).
    #[arg(long)]
    pub processes: bool,
    /// Name process trees by their command line, NAME:REGEX (named captures become ids) or
    /// the preset `lithops`; each tree (the matching process and every process it makes) gets
    /// one summary when its last process ends. Repeat for several. Implies --processes.
    #[arg(long = "process", value_name = "NAME:REGEX|lithops", value_parser = crate::model::process::parse_rule)]
    pub process_rules: Vec<crate::model::process::ProcessRule>,
    #[command(flatten)]
    pub workers: WorkerArgs,
    #[command(flatten)]
    pub tree: TreeArgs,
    #[command(flatten)]
    pub probe: ProbeArgs,
}

/// `workerprobe exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Name of the worker (its cgroup is /workerprobe/exec-<pid>-<name>); default: the
    /// command's file name.
    #[arg(long, value_parser = parse_name)]
    pub name: Option<String>,
    /// Print the summary as one JSON line instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write the summary to this file instead of stderr.
    #[arg(long, value_name = "FILE", value_parser = parse_output_file)]
    pub output: Option<std::path::PathBuf>,
    /// How long processes the command left behind (daemons, detached cleaners) may go on
    /// after it exits; the worker ends when its cgroup is empty, and whatever is still there
    /// then is named and killed. 0 kills them at once.
    #[arg(long, default_value = "30s", value_parser = parse_linger)]
    pub linger: Duration,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
    #[command(flatten)]
    pub probe: ProbeArgs,
}

/// A worker name: letters, digits, `-`, `_` and `.`, at most 64.
pub fn parse_name(text: &str) -> Result<String, String> {
    let valid = !text.is_empty()
        && text.len() <= 64
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if valid && text != "." && text != ".." {
        Ok(text.to_string())
    } else {
        Err(format!(
            "`{text}` is not a worker name; use up to 64 letters, digits, '-', '_' or '.'"
        ))
    }
}

/// Options every command that loads the programs shares.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// How many cgroups the kernel maps can hold; a cgroup beyond that is counted as a drop.
    #[arg(long, default_value_t = probe_common::DEFAULT_MAX_WORKERS, value_parser = parse_count::<u32, 1, 1_048_576>)]
    pub max_workers: u32,
    /// What to measure: cpu (on-CPU time; context switches too with delays or waits, without
    /// them it is read from the kernel's own accounting at no cost to the scheduler), delays
    /// (where off-CPU time went: run-queue wait, blocked on I/O, sleep), net (socket bytes),
    /// workers (cgroups made and removed, for exit summaries). Separate with commas.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "cpu,delays,net,workers,endpoints,waits"
    )]
    pub programs: Vec<ProgramChoice>,
    /// After loading and attaching, run as this unprivileged user with no capabilities
    /// (e.g. nobody); the agent keeps its map descriptors. Not for `exec`, which must remove
    /// its cgroup at the end.
    #[arg(long, value_name = "NAME")]
    pub user: Option<String>,
    /// Keep the maps and attached programs in DIR (under a bpffs mount, e.g.
    /// /sys/fs/bpf/workerprobe) after exit; a later start with the same DIR continues the same
    /// counters. `workerprobe unpin DIR` removes them.
    #[arg(long, value_name = "DIR", value_parser = crate::loader::pin::parse_pin_dir)]
    pub pin: Option<std::path::PathBuf>,
    /// Name remote endpoints, first match first: NAME=CIDR[:PORT] or NAME=:PORT (repeat for
    /// several), e.g. --endpoint object-store=10.20.0.0/16:9000 --endpoint web=:443. Peers no
    /// rule names show as ip:port; loopback and unix sockets as local.
    #[arg(long = "endpoint", value_name = "NAME=CIDR[:PORT]", value_parser = crate::model::endpoints::parse_rule)]
    pub endpoints: Vec<crate::model::endpoints::EndpointRule>,
    /// Most remote endpoints kept per worker; calls with more peers are counted under its
    /// `other` endpoint (and as endpoint_overflow drops).
    #[arg(long, default_value_t = probe_common::net::DEFAULT_ENDPOINTS_PER_WORKER, value_parser = parse_count::<u32, 1, 4096>)]
    pub max_endpoints_per_worker: u32,
    /// For benchmarks: count socket bytes with this variant even where the kernel offers the
    /// other (tracepoint: sock_send_length, 6.3+; fexit: the protocols' sendmsg/recvmsg).
    #[arg(long, hide = true, value_enum)]
    pub net_attach: Option<NetAttachChoice>,
    /// For benchmarks and tests: count CPU time with the sched_switch program (sched-switch)
    /// even where the kernel's per-cgroup accounting can be read through a cgroup iterator
    /// (iter, the default where the kernel allows it).
    #[arg(long, hide = true, value_enum)]
    pub cpu_attach: Option<CpuAttachChoice>,
    /// For benchmarks and tests: read each worker's memory from its files (files) even where
    /// a cgroup iterator can read every cgroup's counters in one walk (iter, the default where
    /// the kernel and cgroup2 allow it).
    #[arg(long, hide = true, value_enum)]
    pub memory_read: Option<MemoryReadChoice>,
    /// For tests and benchmarks: slots of the per-worker counters' fast path (default: from
    /// the CPU count, within 8 MiB); workers beyond them are counted through hash maps (0:
    /// all of them).
    #[arg(long, hide = true, value_parser = parse_count::<u32, 0, 1_048_576>)]
    pub cpu_slots: Option<u32>,
    /// For tests and benchmarks: slots of the endpoints' fast path (default: from the CPU
    /// count, within 4 MiB); endpoints beyond them are counted through a hash map (0: all).
    #[arg(long, hide = true, value_parser = parse_count::<u32, 0, 1_048_576>)]
    pub endpoint_slots: Option<u32>,
    /// The node's name in headers and recordings, to tell nodes apart when their recordings
    /// are read together (default: the host name).
    #[arg(long, value_name = "NAME", value_parser = parse_node_name)]
    pub node_name: Option<String>,
}

/// A node name: printable, no spaces, at most 253 characters (a DNS name's limit).
fn parse_node_name(text: &str) -> Result<String, String> {
    let fits = !text.is_empty() && text.len() <= 253 && text.chars().all(|c| c.is_ascii_graphic());
    if fits {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "`{text}` is not a node name: use 1 to 253 printable characters without spaces, e.g. node-a"
        ))
    }
}

/// `--net-attach` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NetAttachChoice {
    /// The socket-length tracepoints.
    Tracepoint,
    /// fexit on the protocols' sendmsg / recvmsg.
    Fexit,
}

/// `--cpu-attach` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CpuAttachChoice {
    /// The kernel's per-cgroup accounting through a cgroup iterator, where the kernel allows.
    Iter,
    /// The sched_switch program.
    SchedSwitch,
}

/// `--memory-read` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MemoryReadChoice {
    /// One cgroup iterator walk a sample, where the kernel and cgroup2 allow.
    Iter,
    /// Each worker's `memory.current` and `memory.peak`.
    Files,
}

impl From<NetAttachChoice> for crate::loader::NetAttach {
    fn from(choice: NetAttachChoice) -> Self {
        match choice {
            NetAttachChoice::Tracepoint => Self::Tracepoint,
            NetAttachChoice::Fexit => Self::Fexit,
        }
    }
}

impl ProbeArgs {
    /// The loader's options these flags ask for.
    pub fn load_options(&self) -> crate::loader::LoadOptions {
        crate::loader::LoadOptions {
            max_workers: self.max_workers,
            groups: self.programs.iter().map(|&choice| choice.into()).collect(),
            net_attach: self.net_attach.map(Into::into),
            cpu_by_sched_switch: self.cpu_attach == Some(CpuAttachChoice::SchedSwitch),
            memory_by_files: self.memory_read == Some(MemoryReadChoice::Files),
            process_rss_walk: false,
            endpoints_per_worker: self.max_endpoints_per_worker,
            max_endpoints: probe_common::net::DEFAULT_MAX_ENDPOINTS,
            processes: false,
            cpu_slots: self.cpu_slots,
            endpoint_slots: self.endpoint_slots,
        }
    }

    /// How endpoints are named, from `--endpoint`.
    pub fn endpoint_namer(&self) -> crate::model::endpoints::EndpointNamer {
        crate::model::endpoints::EndpointNamer::new(self.endpoints.clone())
    }
}

/// `--programs` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ProgramChoice {
    /// On-CPU time and context switches.
    Cpu,
    /// Run-queue wait, blocked on I/O and sleep time (includes cpu).
    Delays,
    /// Socket bytes and calls.
    Net,
    /// Cgroups made and removed (exit summaries).
    Workers,
    /// Bytes and network waits per remote endpoint (with net).
    Endpoints,
    /// What each sleep waited on: network, disk, lock, timer, child, pipe, poll, other
    /// (includes delays).
    Waits,
    /// For benchmarks only: an empty sched_switch program, the cost floor.
    #[value(hide = true)]
    Floor,
    /// For benchmarks only: the least exact per-task CPU accounting on sched_switch.
    #[value(hide = true)]
    Least,
}

impl From<ProgramChoice> for crate::loader::ProgramGroup {
    fn from(choice: ProgramChoice) -> Self {
        match choice {
            ProgramChoice::Cpu => Self::Cpu,
            ProgramChoice::Delays => Self::Delays,
            ProgramChoice::Net => Self::Net,
            ProgramChoice::Workers => Self::Lifecycle,
            ProgramChoice::Endpoints => Self::Endpoints,
            ProgramChoice::Waits => Self::Waits,
            ProgramChoice::Floor => Self::Floor,
            ProgramChoice::Least => Self::Least,
        }
    }
}

/// `workerprobe top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// Time between refreshes, e.g. 1s, 500ms (at least 100ms).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
    /// Print one table after one interval and exit.
    #[arg(long)]
    pub once: bool,
    /// Show at most this many workers (busiest first).
    #[arg(long, default_value_t = 40, value_parser = parse_count::<usize, 1, 1_000_000>)]
    pub limit: usize,
    /// Also show named process trees live, NAME:REGEX or the preset `lithops` (as `watch
    /// --process`), in a table under the workers' (top then prints tables, not the full
    /// screen). Repeat for several.
    #[arg(long = "process", value_name = "NAME:REGEX|lithops", value_parser = crate::model::process::parse_rule)]
    pub process_rules: Vec<crate::model::process::ProcessRule>,
    #[command(flatten)]
    pub workers: WorkerArgs,
    #[command(flatten)]
    pub tree: TreeArgs,
    #[command(flatten)]
    pub probe: ProbeArgs,
}

/// `workerprobe snapshot`.
#[derive(Debug, Args)]
pub struct SnapshotArgs {
    /// Length of the window to measure, e.g. 1s, 250ms, 2m.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub workers: WorkerArgs,
    #[command(flatten)]
    pub tree: TreeArgs,
    #[command(flatten)]
    pub probe: ProbeArgs,
}

/// A duration like `1s`, `250ms` or `2m`, more than zero.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = parse_duration_or_zero(text)?;
    if duration.is_zero() {
        return Err("the duration must be more than zero".into());
    }
    Ok(duration)
}

/// A duration that may be zero (`--linger 0`).
pub fn parse_linger(text: &str) -> Result<Duration, String> {
    parse_duration_or_zero(text)
}

/// A duration with a unit (`1s`, `250ms`, `2m`), or a bare number of seconds (`1`, `0.5`),
/// as `top -d 1` and `vmstat 1` read it.
fn parse_duration_or_zero(text: &str) -> Result<Duration, String> {
    let bad = || {
        format!("`{text}` is not a duration: write it like 1s, 250ms, 2m, or a number of seconds")
    };
    let trimmed = text.trim();
    if let Ok(seconds) = trimmed.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).map_err(|_| bad());
    }
    humantime::parse_duration(trimmed).map_err(|_| bad())
}

/// A refresh interval: a duration of at least 100 ms.
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    let interval = parse_duration(text)?;
    if interval < Duration::from_millis(100) {
        return Err(format!(
            "`{text}` is shorter than the 100ms minimum interval"
        ));
    }
    Ok(interval)
}

/// A whole number from MIN to MAX; the error gives the form expected (clap names the flag),
/// never the number parser's own text.
fn parse_count<T: TryFrom<u64>, const MIN: u64, const MAX: u64>(text: &str) -> Result<T, String> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|count| (MIN..=MAX).contains(count))
        .and_then(|count| T::try_from(count).ok())
        .ok_or_else(|| format!("`{text}` is not a whole number from {MIN} to {MAX}"))
}

/// A recording to read: a path that exists and is not a directory.
///
/// Other failures to open it (permissions) are the machine's, reported when it is read.
pub fn parse_recording_file(text: &str) -> Result<std::path::PathBuf, String> {
    let path = std::path::PathBuf::from(text);
    match std::fs::metadata(&path) {
        Ok(metadata) if metadata.is_dir() => Err(format!(
            "`{text}` is a directory, not a recording: give the file `workerprobe record --out FILE` wrote"
        )),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "`{text}` does not exist: give the file `workerprobe record --out FILE` wrote"
        )),
        _ => Ok(path),
    }
}

/// A file to write: not a directory, in a directory that exists.
pub fn parse_output_file(text: &str) -> Result<std::path::PathBuf, String> {
    let path = std::path::PathBuf::from(text);
    if text.ends_with('/') || path.is_dir() {
        return Err(format!(
            "`{text}` is a directory: give the path of a file, like {}/out",
            text.trim_end_matches('/')
        ));
    }
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => std::path::Path::new("."),
    };
    if !parent.is_dir() {
        return Err(format!(
            "the directory {} does not exist: make it first, or give a file in an existing directory",
            parent.display()
        ));
    }
    Ok(path)
}

/// A `replay --at` time, checked here and kept as written (replay reads it again).
pub fn parse_at_text(text: &str) -> Result<String, String> {
    crate::recording::at::parse_at(text).map(|_| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_checked() {
        let dir = std::env::temp_dir();
        let dir_text = dir.to_str().expect("utf-8 temp dir");
        assert!(parse_output_file(&format!("{dir_text}/out.svg")).is_ok());
        assert!(parse_output_file("out.svg").is_ok());
        assert!(
            parse_output_file(dir_text)
                .unwrap_err()
                .contains("is a directory")
        );
        assert!(
            parse_output_file("/no/such/dir/out.svg")
                .unwrap_err()
                .contains("the directory /no/such/dir does not exist")
        );
        assert!(
            parse_recording_file(dir_text)
                .unwrap_err()
                .contains("is a directory")
        );
        assert!(
            parse_recording_file("/no/such/rec.jsonl")
                .unwrap_err()
                .contains("does not exist")
        );
        assert!(parse_at_text("30s").is_ok());
        assert!(parse_at_text("soon").unwrap_err().contains("is not a time"));
    }

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("fast").unwrap_err().contains("like 1s"));
        // Bare numbers are seconds, as `top -d 1` reads them.
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("0.5"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("-1").is_err());
        assert!(parse_duration("inf").is_err());
        assert_eq!(parse_linger("0"), Ok(Duration::ZERO));
        assert!(parse_interval("10ms").is_err());
        assert_eq!(parse_interval("1s"), Ok(Duration::from_secs(1)));
    }

    #[test]
    fn listen_addresses_are_checked() {
        assert!(parse_listen("127.0.0.1:9464").is_ok());
        assert!(parse_listen("[::1]:80").is_ok());
        assert!(
            parse_listen("localhost")
                .unwrap_err()
                .contains("127.0.0.1:9464")
        );
    }

    #[test]
    fn names_are_checked() {
        assert_eq!(parse_name("job-1.a_b"), Ok("job-1.a_b".into()));
        assert!(parse_name("a/b").is_err());
        assert!(parse_name("..").is_err());
        assert!(parse_name("").is_err());
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }
}
