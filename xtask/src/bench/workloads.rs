//! The workloads the bench runs: the hidden `cargo xtask bench-workload` modes (code that
//! has to be ours: rr, mix, tick, burn) and the harness side that runs each workload once
//! and returns its number.

use std::fs;
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Subcommand;

use super::sys::{self, Cgroup};
use crate::cmd;

/// The hidden workload modes, run as `xtask bench-workload <mode>`.
#[derive(Subcommand, Clone, Debug)]
pub enum WorkloadMode {
    /// Same-CPU 1-byte TCP request/response over loopback, both ends pinned to CPU 0.
    Rr {
        /// How long to run.
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
    },
    /// A realistic worker: compute, move bytes over loopback TCP, write a file with fsync.
    Mix {
        /// Bytes to move over loopback TCP (sent by one thread, received by another).
        #[arg(long, default_value_t = 200_000_000)]
        bytes: u64,
        /// Iterations of the compute loop (fixed work, so wall time shows overhead).
        #[arg(long, default_value_t = 1_000_000_000)]
        compute_iters: u64,
        /// Bytes to write to the output file before fsync.
        #[arg(long, default_value_t = 64 << 20)]
        file_bytes: u64,
        /// Directory for the output file (removed afterwards).
        #[arg(long)]
        dir: PathBuf,
    },
    /// `count` processes, each in its own cgroup `<parent>/w<i>`, doing ~1 ms of CPU work
    /// every second: active workers for the agent-cost measurement.
    Tick {
        /// The cgroup directory holding the w<i> cgroups (they must exist).
        #[arg(long)]
        parent: PathBuf,
        /// How many worker processes.
        #[arg(long)]
        count: usize,
        /// How long they run.
        #[arg(long)]
        seconds: f64,
    },
    /// Spin `threads` threads for `millis` ms each: a known CPU-bound worker.
    Burn {
        /// Threads.
        #[arg(long, default_value_t = 2)]
        threads: usize,
        /// Milliseconds of spinning per thread.
        #[arg(long, default_value_t = 500)]
        millis: u64,
    },
}

/// Runs one workload mode in this process.
pub fn run_mode(mode: WorkloadMode) -> Result<()> {
    match mode {
        WorkloadMode::Rr { seconds } => rr(seconds),
        WorkloadMode::Mix {
            bytes,
            compute_iters,
            file_bytes,
            dir,
        } => mix(bytes, compute_iters, file_bytes, &dir),
        WorkloadMode::Tick {
            parent,
            count,
            seconds,
        } => tick(&parent, count, seconds),
        WorkloadMode::Burn { threads, millis } => burn(threads, millis),
    }
}

/// Pins the calling thread to `cpu`.
fn pin_to_cpu(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and sched_setaffinity only
    // touch the set we pass.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("sched_setaffinity to CPU {cpu} failed"));
        }
    }
    Ok(())
}

/// A loopback listener and a connected client/server pair with Nagle off.
fn loopback_pair() -> Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind("127.0.0.1:0").context("could not bind 127.0.0.1:0")?;
    let client = TcpStream::connect(listener.local_addr()?).context("loopback connect failed")?;
    let (server, _) = listener.accept().context("loopback accept failed")?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    Ok((client, server))
}

/// `rr`: prints `{"round_trips": n, "seconds": s, "usec_per_round_trip": x}`.
fn rr(seconds: f64) -> Result<()> {
    let (mut client, mut server) = loopback_pair()?;
    let echo = std::thread::spawn(move || -> Result<()> {
        pin_to_cpu(0)?;
        let mut byte = [0u8; 1];
        // read returns 0 at EOF, when the client is done.
        while server.read(&mut byte)? == 1 {
            server.write_all(&byte)?;
        }
        Ok(())
    });
    pin_to_cpu(0)?;
    let limit = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let mut trips: u64 = 0;
    let mut byte = [7u8; 1];
    loop {
        client.write_all(&byte)?;
        client.read_exact(&mut byte)?;
        trips += 1;
        // Reading the clock every trip would add to what we measure.
        if trips.is_multiple_of(256) && start.elapsed() >= limit {
            break;
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    drop(client);
    echo.join()
        .map_err(|_| anyhow::anyhow!("echo thread panicked"))??;
    println!(
        "{}",
        serde_json::json!({
            "round_trips": trips,
            "seconds": elapsed,
            "usec_per_round_trip": elapsed * 1e6 / trips as f64,
        })
    );
    Ok(())
}

/// A compute kernel the optimiser cannot remove: an xorshift chain.
fn compute(iters: u64) -> u64 {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for _ in 0..iters {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    std::hint::black_box(x)
}

/// `mix`: prints `{"wall_seconds", "sent_bytes", "received_bytes", "file_bytes"}`.
///
/// Phases in the order a data-processing worker has them: fetch input over the network,
/// compute, write the output durably.
fn mix(bytes: u64, compute_iters: u64, file_bytes: u64, dir: &Path) -> Result<()> {
    let start = Instant::now();
    let (mut client, mut server) = loopback_pair()?;
    let sender = std::thread::spawn(move || -> Result<u64> {
        let chunk = vec![0x5au8; 64 * 1024];
        let mut sent = 0u64;
        while sent < bytes {
            let n = (bytes - sent).min(chunk.len() as u64) as usize;
            server.write_all(&chunk[..n])?;
            sent += n as u64;
        }
        Ok(sent)
    });
    let mut buf = vec![0u8; 64 * 1024];
    let mut received = 0u64;
    while received < bytes {
        let n = client.read(&mut buf).context("mix: loopback read failed")?;
        if n == 0 {
            bail!("mix: sender closed after {received} of {bytes} bytes");
        }
        received += n as u64;
    }
    let sent = sender
        .join()
        .map_err(|_| anyhow::anyhow!("mix: sender thread panicked"))??;

    let checksum = compute(compute_iters);

    let path = dir.join(format!("wpbench-mix-{}.out", std::process::id()));
    let mut file = fs::File::create(&path)
        .with_context(|| format!("mix: could not create {}", path.display()))?;
    let block = vec![(checksum & 0xff) as u8; 1 << 20];
    let mut written = 0u64;
    while written < file_bytes {
        let n = (file_bytes - written).min(block.len() as u64) as usize;
        file.write_all(&block[..n])?;
        written += n as u64;
    }
    file.sync_all().context("mix: fsync failed")?;
    drop(file);
    fs::remove_file(&path).ok();

    println!(
        "{}",
        serde_json::json!({
            "wall_seconds": start.elapsed().as_secs_f64(),
            "sent_bytes": sent,
            "received_bytes": received,
            "file_bytes": written,
        })
    );
    Ok(())
}

/// `burn`: spins `threads` threads for `millis` ms each.
fn burn(threads: usize, millis: u64) -> Result<()> {
    let spin = move || {
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed() < Duration::from_millis(millis) {
            n = n.wrapping_add(compute(10_000));
        }
        std::hint::black_box(n);
    };
    let handles: Vec<_> = (0..threads).map(|_| std::thread::spawn(spin)).collect();
    for h in handles {
        h.join()
            .map_err(|_| anyhow::anyhow!("burn thread panicked"))?;
    }
    Ok(())
}

/// `tick`: forks `count` workers, each joins `<parent>/w<i>` and does ~1 ms of CPU every
/// second, phases spread over the second. Prints `ready` once every worker has joined.
fn tick(parent: &Path, count: usize, seconds: f64) -> Result<()> {
    let mut pids = Vec::with_capacity(count);
    for i in 0..count {
        let procs = parent.join(format!("w{i}")).join("cgroup.procs");
        // Checked before forking so a missing cgroup is a clear error, not a dead child.
        if !procs.exists() {
            bail!("tick: cgroup {} does not exist", procs.display());
        }
        // SAFETY: this process is single-threaded (tick runs no threads), so the child
        // may allocate and use std freely until it calls _exit.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(std::io::Error::last_os_error()).context("tick: fork failed");
        }
        if pid == 0 {
            // SAFETY: prctl and _exit are plain syscalls; the child never returns.
            unsafe {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                let code = i32::from(tick_worker(&procs, i, count, seconds).is_err());
                libc::_exit(code);
            }
        }
        pids.push(pid);
    }
    // Each worker joins its cgroup first thing; wait until every cgroup.procs shows it.
    let deadline = Instant::now() + Duration::from_secs(30);
    for i in 0..count {
        let procs = parent.join(format!("w{i}")).join("cgroup.procs");
        while fs::read_to_string(&procs).map_or(true, |t| t.trim().is_empty()) {
            if Instant::now() > deadline {
                bail!("tick: worker {i} never joined {}", procs.display());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    println!("ready");
    std::io::stdout().flush()?;
    let mut failed = 0;
    for pid in pids {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
            failed += 1;
        }
    }
    if failed > 0 {
        bail!("tick: {failed} of {count} workers failed");
    }
    Ok(())
}

/// One tick worker: join the cgroup, then ~1 ms of CPU per second until `seconds` pass.
fn tick_worker(procs: &Path, index: usize, count: usize, seconds: f64) -> Result<()> {
    fs::write(procs, b"0")?;
    let start = Instant::now();
    let end = Duration::from_secs_f64(seconds);
    // Spread the workers over the second, as independent workers would be.
    let mut next = Duration::from_secs_f64(index as f64 / count as f64);
    while next < end {
        let now = start.elapsed();
        if next > now {
            std::thread::sleep(next - now);
        }
        let burst = Instant::now();
        while burst.elapsed() < Duration::from_millis(1) {
            std::hint::black_box(compute(1000));
        }
        next += Duration::from_secs(1);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The harness side: run one workload, return its number.

/// How big each workload is; the smoke uses tiny sizes.
#[derive(Clone, Debug)]
pub struct Sizes {
    /// `perf bench sched pipe -l` loops.
    pub pipe_loops: u64,
    /// Seconds of the rr loop.
    pub rr_seconds: f64,
    /// iperf3 `-t` seconds (0 means use `iperf_bytes` with `-n`).
    pub iperf_seconds: u64,
    /// iperf3 `-n` bytes when `iperf_seconds` is 0.
    pub iperf_bytes: &'static str,
    /// Mix: bytes over TCP, compute iterations, file bytes.
    pub mix_bytes: u64,
    /// Mix compute iterations.
    pub mix_compute_iters: u64,
    /// Mix file bytes.
    pub mix_file_bytes: u64,
}

/// The A/B workloads of sections 2 and 3.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Workload {
    /// `taskset -c 0 perf bench sched pipe`: µs per op, lower is better.
    Pipe,
    /// Same-CPU 1-byte TCP request/response: µs per round trip.
    Rr,
    /// iperf3 over loopback with default writes: Gbit/s, higher is better.
    Iperf,
    /// iperf3 over loopback with 4 KiB writes.
    Iperf4k,
    /// The realistic worker mix: wall seconds.
    Mix,
}

impl Workload {
    /// All, in the order they run within a configuration.
    pub const ALL: [Workload; 5] = [
        Workload::Pipe,
        Workload::Rr,
        Workload::Iperf,
        Workload::Iperf4k,
        Workload::Mix,
    ];

    /// Name in tables.
    pub fn label(self) -> &'static str {
        match self {
            Workload::Pipe => "sched pipe, pinned (µs/op)",
            Workload::Rr => "TCP 1-byte RR, same CPU (µs/round trip)",
            Workload::Iperf => "iperf3 bulk TCP, default writes (Gbit/s)",
            Workload::Iperf4k => "iperf3 bulk TCP, 4 KiB writes (Gbit/s)",
            Workload::Mix => "worker mix (wall s)",
        }
    }

    /// Whether a larger number is better (throughput) rather than worse (time).
    pub fn higher_is_better(self) -> bool {
        matches!(self, Workload::Iperf | Workload::Iperf4k)
    }

    /// Slowdown in percent of `value` against `baseline` (positive = slower).
    pub fn overhead_percent(self, value: f64, baseline: f64) -> f64 {
        if self.higher_is_better() {
            (baseline / value - 1.0) * 100.0
        } else {
            (value / baseline - 1.0) * 100.0
        }
    }
}

/// What one mix run did, as it reported, plus the kernel's view of its cgroup.
#[derive(Clone, Debug)]
pub struct MixRun {
    /// Wall seconds the mix reported.
    pub wall_seconds: f64,
    /// Bytes it sent and received over TCP (its own counts).
    pub sent_bytes: u64,
    /// Bytes it received.
    pub received_bytes: u64,
    /// `usage_usec` of its cgroup after it exited.
    pub usage_usec: u64,
    /// The cgroup id and path relative to the mount.
    pub cgroup_id: u64,
    /// The mix process id.
    pub pid: u32,
    /// CLOCK_MONOTONIC seconds at its start, to line up the psutil poller's samples.
    pub start_mono: f64,
}

/// Runs `command` to completion and returns its stdout, failing on a non-zero exit.
fn output_of(command: &mut Command) -> Result<String> {
    let out = command
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start `{}`", cmd::describe(command)))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            cmd::describe(command),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Parses stdout as one JSON document, naming the command on failure.
fn json_of(text: &str, what: &str) -> Result<serde_json::Value> {
    serde_json::from_str(text.trim()).with_context(|| format!("{what} printed no JSON: {text}"))
}

/// Everything the harness needs to run the workloads.
pub struct Runner {
    /// This xtask binary, which holds the workload modes.
    pub xtask: PathBuf,
    /// The sizes.
    pub sizes: Sizes,
    /// The local iperf3 server's port.
    pub iperf_port: u16,
    /// Directory for the mix's output file.
    pub scratch: PathBuf,
}

impl Runner {
    /// Runs `workload` once and returns its number (see [`Workload::label`]).
    pub fn run(&self, workload: Workload) -> Result<f64> {
        match workload {
            Workload::Pipe => self.pipe(),
            Workload::Rr => self.rr(),
            Workload::Iperf => self.iperf(None),
            Workload::Iperf4k => self.iperf(Some("4K")),
            Workload::Mix => bail!("the mix runs through Runner::mix, in a cgroup"),
        }
    }

    /// `taskset -c 0 perf bench sched pipe -l N`: µs per op.
    pub fn pipe(&self) -> Result<f64> {
        let text = output_of(Command::new("taskset").args([
            "-c",
            "0",
            "perf",
            "bench",
            "sched",
            "pipe",
            "-l",
            &self.sizes.pipe_loops.to_string(),
        ]))?;
        text.lines()
            .find_map(|l| l.trim().strip_suffix("usecs/op")?.trim().parse().ok())
            .with_context(|| format!("no usecs/op in perf bench output: {text}"))
    }

    /// The rr mode: µs per round trip.
    pub fn rr(&self) -> Result<f64> {
        let text = output_of(Command::new(&self.xtask).args([
            "bench-workload",
            "rr",
            "--seconds",
            &self.sizes.rr_seconds.to_string(),
        ]))?;
        json_of(&text, "bench-workload rr")?["usec_per_round_trip"]
            .as_f64()
            .context("rr printed no usec_per_round_trip")
    }

    /// iperf3 client against the local server: received Gbit/s.
    pub fn iperf(&self, length: Option<&str>) -> Result<f64> {
        let mut iperf = Command::new("iperf3");
        iperf.args(["-c", "127.0.0.1", "-p", &self.iperf_port.to_string(), "-J"]);
        if self.sizes.iperf_seconds > 0 {
            iperf.args(["-t", &self.sizes.iperf_seconds.to_string()]);
        } else {
            iperf.args(["-n", self.sizes.iperf_bytes]);
        }
        if let Some(length) = length {
            iperf.args(["-l", length]);
        }
        // The one server takes one client at a time and may still be closing the last test,
        // and a run then ends without its summary (seen once in CI): such a run is repeated,
        // a few times at most, and iperf3's own error is told if it never gives one.
        let mut error = String::new();
        for _ in 0..5 {
            let text = output_of(&mut iperf)?;
            let report = json_of(&text, "iperf3")?;
            if let Some(bps) = report["end"]["sum_received"]["bits_per_second"].as_f64() {
                return Ok(bps / 1e9);
            }
            error = report["error"]
                .as_str()
                .unwrap_or("no end.sum_received.bits_per_second in its JSON")
                .to_string();
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        anyhow::bail!("iperf3 gave no result in 5 runs: {error}")
    }

    /// Runs the mix in `cgroup` (which it joins before exec) and reads the kernel's view.
    pub fn mix(&self, cgroup: &Cgroup) -> Result<MixRun> {
        let mut mix = Command::new(&self.xtask);
        mix.args(["bench-workload", "mix", "--bytes"])
            .arg(self.sizes.mix_bytes.to_string())
            .arg("--compute-iters")
            .arg(self.sizes.mix_compute_iters.to_string())
            .arg("--file-bytes")
            .arg(self.sizes.mix_file_bytes.to_string())
            .arg("--dir")
            .arg(&self.scratch)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        cgroup.join_on_spawn(&mut mix);
        let start_mono = sys::monotonic_seconds();
        let child = mix
            .spawn()
            .with_context(|| format!("could not start `{}`", cmd::describe(&mix)))?;
        let pid = child.id();
        let out = child.wait_with_output().context("mix: wait failed")?;
        if !out.status.success() {
            bail!("`{}` failed ({})", cmd::describe(&mix), out.status);
        }
        let doc = json_of(&String::from_utf8_lossy(&out.stdout), "bench-workload mix")?;
        let field = |name: &str| {
            doc[name]
                .as_f64()
                .with_context(|| format!("mix printed no {name}"))
        };
        Ok(MixRun {
            wall_seconds: field("wall_seconds")?,
            sent_bytes: field("sent_bytes")? as u64,
            received_bytes: field("received_bytes")? as u64,
            usage_usec: cgroup.usage_usec()?,
            cgroup_id: cgroup.id()?,
            pid,
            start_mono,
        })
    }

    /// Runs the burn mode in `cgroup` and waits for it.
    pub fn burn(&self, cgroup: &Cgroup, threads: usize, millis: u64) -> Result<()> {
        let mut burn = Command::new(&self.xtask);
        burn.args(["bench-workload", "burn", "--threads"])
            .arg(threads.to_string())
            .arg("--millis")
            .arg(millis.to_string());
        cgroup.join_on_spawn(&mut burn);
        output_of(&mut burn).map(drop)
    }
}
