//! workerprobe's developer tasks, run as `cargo xtask <task>`.
//!
//! Every task first runs `setup`, so a fresh Debian clone needs nothing but rustup.

mod bench;
mod cmd;
mod fuzz;
mod setup;
mod vm;

use std::ffi::OsString;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, ExitCode};

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};

/// Set up, build, run, test and benchmark workerprobe.
#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask")]
struct Cli {
    /// The task to run.
    #[command(subcommand)]
    task: Task,
}

/// The tasks `cargo xtask` knows.
#[derive(Subcommand)]
enum Task {
    /// Install what building and testing need; quick when all is there.
    ///
    /// Installs nightly's rust-src, the Debian packages (LLVM 22, bpftool, iperf3, perf,
    /// stress-ng, bpftrace, python3-psutil; needs root) and bpf-linker built against LLVM 22.
    Setup,
    /// Set up, then build the workspace (the agent embeds the eBPF programs it builds).
    Build {
        /// Build with the release profile.
        #[arg(long)]
        release: bool,
    },
    /// Set up, build the agent and run it, through `sudo -E` when not root.
    Run {
        /// Build and run the release binary.
        #[arg(long)]
        release: bool,
        /// Arguments for workerprobe, after `--` (default: `top`).
        #[arg(last = true)]
        args: Vec<OsString>,
    },
    /// Set up, then run fmt, clippy, the unit tests, the integration tests on this kernel and
    /// the kernel-dependent ones in VMs of Debian's 6.1 and 6.12 (needs root).
    Test {
        /// Skip the VM matrix (the host's integration tests still run): for a quick local
        /// check; CI runs everything.
        #[arg(long)]
        no_vm: bool,
        /// When every step is green, write the kernel matrix and the VMs' per-event costs
        /// into README.md and BENCHMARKS.md (as `vm-test --update-docs`).
        #[arg(long)]
        update_docs: bool,
        /// Extra arguments for the host's integration test binaries, after `--` (e.g.
        /// `--nocapture`).
        #[arg(last = true)]
        args: Vec<OsString>,
    },
    /// Benchmark overhead, accuracy and agent cost against a baseline and peers (needs
    /// root; minutes). Writes BENCHMARKS.md.
    Bench(bench::BenchArgs),
    /// Fuzz the recording reader and the cgroup-path resolver for a bounded time (cargo-fuzz,
    /// nightly; installs cargo-fuzz if missing). Fails on a crash, naming the input.
    Fuzz(fuzz::FuzzArgs),
    /// Boot each kernel of the matrix (Debian's 6.1 and 6.12) in a VM on pure cgroup2 and run
    /// the kernel-dependent integration tests there; prints the matrix (needs root; minutes).
    VmTest(vm::VmArgs),
    /// A workload the bench runs (internal).
    #[command(hide = true, subcommand)]
    BenchWorkload(bench::WorkloadMode),
}

fn main() -> ExitCode {
    let result = put_cargo_bin_on_path().and_then(|()| dispatch(Cli::parse()));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Puts cargo's bin directories in front of PATH, for this process and its children.
///
/// rustup, bpf-linker and cargo subcommands live there, and a root shell or CI job
/// often lacks them on PATH.
fn put_cargo_bin_on_path() -> Result<()> {
    let path = cmd::path_with(&cmd::cargo_bin_dirs())?;
    // SAFETY: called first thing in main, before any thread exists that could read the
    // environment concurrently.
    unsafe { std::env::set_var("PATH", path) };
    Ok(())
}

/// Runs the chosen task.
fn dispatch(cli: Cli) -> Result<()> {
    match cli.task {
        Task::Setup => setup::setup(),
        Task::Build { release } => build(release),
        Task::Run { release, args } => run(release, args),
        Task::Test {
            no_vm,
            update_docs,
            args,
        } => test(no_vm, update_docs, args),
        Task::Bench(args) => bench::bench(args),
        Task::VmTest(args) => vm::vm_test(&args),
        Task::Fuzz(args) => fuzz::fuzz(&args),
        Task::BenchWorkload(mode) => bench::workload(mode),
    }
}

/// `cargo xtask build`.
fn build(release: bool) -> Result<()> {
    setup::setup()?;
    cmd::run(&mut cargo_build(release)?)
}

/// `cargo build` of the default members, with the release profile when asked
/// (probe-ebpf is built for the BPF target inside probe-user's build script).
fn cargo_build(release: bool) -> Result<Command> {
    let mut build = cmd::cargo()?;
    build.arg("build");
    if release {
        build.arg("--release");
    }
    Ok(build)
}

/// `cargo xtask run`: builds the agent, then replaces xtask with it.
///
/// It never returns on success; the agent's exit code becomes xtask's.
fn run(release: bool, args: Vec<OsString>) -> Result<()> {
    setup::setup()?;
    let mut build = cargo_build(release)?;
    cmd::run(build.args(["-p", "probe-user"]))?;

    let profile = if release { "release" } else { "debug" };
    let binary = cmd::target_dir()?.join(profile).join("workerprobe");
    let args = if args.is_empty() {
        vec![OsString::from("top")]
    } else {
        args
    };

    let mut agent = if cmd::is_root() {
        Command::new(&binary)
    } else {
        let sudo = cmd::find_in_path("sudo").context(
            "workerprobe needs root to load eBPF programs and sudo is not installed: run `cargo xtask run` as root",
        )?;
        println!("xtask: not root, so running workerprobe through sudo");
        let mut sudo = Command::new(sudo);
        sudo.arg("-E").arg(&binary);
        sudo
    };
    agent.args(&args).current_dir(cmd::workspace_root()?);
    // exec rather than spawn: Ctrl-C then reaches only the agent, which detaches its
    // programs and exits with its own code, instead of also killing xtask mid-cleanup.
    let error = agent.exec();
    Err(error).with_context(|| format!("could not start `{}`", cmd::describe(&agent)))
}

/// One `cargo xtask test` step.
struct TestStep {
    /// What the step checks, for the header and for failures.
    name: &'static str,
    /// The cargo command that does it.
    command: Command,
}

/// `cargo xtask test`: every step in order, stopping at the first failure; the kernel matrix
/// (this host, then each VM) runs every environment and fails after printing its table.
fn test(no_vm: bool, update_docs: bool, extra_args: Vec<OsString>) -> Result<()> {
    // Checked first so a user without root learns it before minutes of clippy and tests.
    if !cmd::is_root() {
        bail!("the integration tests need root: run `sudo -E cargo xtask test`");
    }
    setup::setup()?;
    let started = std::time::Instant::now();
    let kernels = if no_vm {
        Vec::new()
    } else {
        // Before the long steps: a machine that cannot run the matrix says so at once.
        setup::setup_vm(&vm::MATRIX.iter().collect::<Vec<_>>())?
    };
    let (before, after) = test_steps()?;
    for TestStep { name, mut command } in before {
        println!("==> {name}: {}", cmd::describe(&command));
        cmd::run(&mut command).with_context(|| format!("test step `{name}` failed"))?;
    }
    println!("==> integration tests on this host");
    let mut rows = vec![vm::run_on_host(&vm::test_executables(false)?, &extra_args)?];
    if !kernels.is_empty() {
        println!("==> the kernel matrix in VMs");
        let executables = vm::build_release()?;
        for kernel in &kernels {
            rows.push(vm::run_in_vm(
                kernel,
                &executables,
                &vm::chosen_tests(&[])?,
            )?);
        }
    }
    vm::finish(&rows, update_docs && !no_vm).context("test step `kernel matrix` failed")?;
    for TestStep { name, mut command } in after {
        println!("==> {name}: {}", cmd::describe(&command));
        cmd::run(&mut command).with_context(|| format!("test step `{name}` failed"))?;
    }
    println!(
        "==> all test steps passed in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The cargo steps before the kernel matrix (fmt, clippy, unit tests, the agent's build) and
/// after it (bench smoke, fuzz).
///
/// fmt, clippy and unit tests cover the whole workspace: probe-ebpf compiles to an empty
/// host binary for them, and to the real object inside probe-user's build.
fn test_steps() -> Result<(Vec<TestStep>, Vec<TestStep>)> {
    let mut fmt = cmd::cargo()?;
    fmt.args(["fmt", "--all", "--", "--check"]);

    let mut clippy = cmd::cargo()?;
    clippy.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]);

    let mut unit = cmd::cargo()?;
    unit.args(["test", "--workspace", "--lib", "--bins"]);

    // The integration tests run the `workerprobe` binary itself.
    let mut build = cmd::cargo()?;
    build.args(["build", "-p", "probe-user"]);

    // A short run of `cargo xtask bench` (seconds per section) so the harness cannot rot;
    // it fails if any section measures nothing.
    let mut bench_smoke = cmd::cargo()?;
    bench_smoke.args(["xtask", "bench", "--smoke"]);

    // The fuzz targets for CI's budget (about a minute, split across them), so they cannot
    // rot and a panic on bad input is found.
    let mut fuzz = cmd::cargo()?;
    fuzz.args(["xtask", "fuzz", "--seconds"])
        .arg(fuzz::TEST_SECONDS.to_string());

    Ok((
        vec![
            TestStep {
                name: "cargo fmt --check",
                command: fmt,
            },
            TestStep {
                name: "cargo clippy",
                command: clippy,
            },
            TestStep {
                name: "unit tests",
                command: unit,
            },
            TestStep {
                name: "build the agent",
                command: build,
            },
        ],
        vec![
            TestStep {
                name: "bench smoke",
                command: bench_smoke,
            },
            TestStep {
                name: "fuzz",
                command: fuzz,
            },
        ],
    ))
}
