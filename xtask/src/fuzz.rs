//! `cargo xtask fuzz`: runs the cargo-fuzz targets in `fuzz/` for a bounded time.
//!
//! The targets feed arbitrary input to the recording reader and to the cgroup-path resolver.
//! Each runs for its share of `--seconds` from the seeds in `fuzz/seeds/<target>`, keeping
//! what it learns in `fuzz/corpus/<target>`; a crash fails the task and names the input that
//! caused it (libFuzzer writes it to `fuzz/artifacts/<target>/`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::{cmd, setup};

/// The fuzz targets, as named in `fuzz/Cargo.toml`.
const TARGETS: &[&str] = &["recording", "identity"];

/// The fuzzing time `cargo xtask test` spends, in seconds (CI's budget).
pub const TEST_SECONDS: u64 = 60;

/// How long one input may take before libFuzzer reports it as a hang, in seconds.
const INPUT_TIMEOUT_SECONDS: u64 = 10;

/// `cargo xtask fuzz` options.
#[derive(clap::Args)]
pub struct FuzzArgs {
    /// Total fuzzing time in seconds, split evenly across the targets (building not counted).
    #[arg(long, default_value_t = TEST_SECONDS, value_parser = clap::value_parser!(u64).range(1..))]
    pub seconds: u64,
}

/// `cargo xtask fuzz`.
pub fn fuzz(args: &FuzzArgs) -> Result<()> {
    setup::setup()?;
    install_cargo_fuzz()?;
    let fuzz_dir = cmd::workspace_root()?.join("fuzz");
    cmd::run(cargo_fuzz(&fuzz_dir).arg("build")).context("building the fuzz targets failed")?;
    let share = (args.seconds / TARGETS.len() as u64).max(1);
    let mut results = Vec::new();
    for target in TARGETS {
        results.push(run_target(&fuzz_dir, target, share)?);
    }
    for result in &results {
        println!("fuzz: {result}");
    }
    Ok(())
}

/// Installs cargo-fuzz unless `cargo fuzz` already answers.
fn install_cargo_fuzz() -> Result<()> {
    let name = "cargo-fuzz";
    if cmd::probe(Command::new("cargo-fuzz").arg("--version")).is_some() {
        println!("setup: {name} … already done");
        return Ok(());
    }
    println!("setup: {name} …");
    cmd::run(cmd::cargo()?.args(["install", "cargo-fuzz", "--locked"])).context(
        "installing cargo-fuzz failed: run `cargo install cargo-fuzz --locked` by hand, then `cargo xtask fuzz` again",
    )?;
    println!("setup: {name} … ok");
    Ok(())
}

/// `cargo fuzz` with the nightly toolchain (sanitizers need it), run in `fuzz_dir`.
///
/// Through `rustup run` because `$CARGO` is the toolchain xtask was started with, and a
/// toolchain's own cargo takes no `+nightly`.
fn cargo_fuzz(fuzz_dir: &Path) -> Command {
    let mut command = Command::new("rustup");
    command
        .args(["run", "nightly", "cargo", "fuzz"])
        .current_dir(fuzz_dir)
        // cargo-fuzz runs the cargo named here; the nightly cargo sets it for its subcommand.
        .env_remove("CARGO");
    command
}

/// What one target's run found.
struct TargetResult {
    target: &'static str,
    seconds: u64,
    runs: Option<u64>,
    execs_per_second: Option<u64>,
    new_inputs: Option<u64>,
    corpus_size: usize,
}

impl std::fmt::Display for TargetResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let number = |n: Option<u64>| n.map_or_else(|| "?".to_owned(), |n| n.to_string());
        write!(
            f,
            "{}: {} runs in {} s ({} execs/s), {} new inputs, corpus {} inputs, no crash",
            self.target,
            number(self.runs),
            self.seconds,
            number(self.execs_per_second),
            number(self.new_inputs),
            self.corpus_size
        )
    }
}

/// Fuzzes `target` for `seconds`; fails with the crashing input's path if it finds one.
fn run_target(fuzz_dir: &Path, target: &'static str, seconds: u64) -> Result<TargetResult> {
    let corpus = fuzz_dir.join("corpus").join(target);
    std::fs::create_dir_all(&corpus)
        .with_context(|| format!("cannot make the corpus directory {}", corpus.display()))?;
    let seeds = fuzz_dir.join("seeds").join(target);
    let mut command = cargo_fuzz(fuzz_dir);
    command.args(["run", target]).arg(&corpus);
    if seeds.is_dir() {
        command.arg(&seeds);
    }
    command.args([
        "--".to_owned(),
        format!("-max_total_time={seconds}"),
        format!("-timeout={INPUT_TIMEOUT_SECONDS}"),
        "-print_final_stats=1".to_owned(),
    ]);
    println!(
        "==> fuzz {target} for {seconds} s: {}",
        cmd::describe(&command)
    );
    let output = command
        .output()
        .with_context(|| format!("could not start `{}`", cmd::describe(&command)))?;
    let log = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        // The crash report: libFuzzer's last lines, then which input to replay.
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        for line in tail.into_iter().rev() {
            eprintln!("{line}");
        }
        match crash_artifact(&log) {
            Some(artifact) => bail!(
                "fuzz target `{target}` crashed on the input {artifact}: reproduce with `cargo +nightly fuzz run {target} {artifact}` in fuzz/",
                artifact = artifact.display()
            ),
            None => bail!(
                "fuzz target `{target}` failed ({}) without writing a crashing input: see the output above",
                output.status
            ),
        }
    }
    Ok(TargetResult {
        target,
        seconds,
        runs: stat(&log, "stat::number_of_executed_units"),
        execs_per_second: stat(&log, "stat::average_exec_per_sec"),
        new_inputs: stat(&log, "stat::new_units_added"),
        corpus_size: std::fs::read_dir(&corpus)
            .map(|entries| entries.count())
            .unwrap_or(0),
    })
}

/// A `-print_final_stats=1` number, e.g. `stat::average_exec_per_sec:      1234`.
fn stat(log: &str, name: &str) -> Option<u64> {
    log.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|value| value.trim().parse().ok())
}

/// The input libFuzzer saved when it found a crash, leak or hang: "Test unit written to PATH".
fn crash_artifact(log: &str) -> Option<PathBuf> {
    log.lines()
        .find_map(|line| line.split_once("Test unit written to ").map(|(_, p)| p))
        .map(|path| PathBuf::from(path.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "\
#2097152\tpulse  cov: 612 ft: 2210 corp: 301/40Kb exec/s: 69905 rss: 512Mb
Done 2113190 runs in 31 second(s)
stat::number_of_executed_units: 2113190
stat::average_exec_per_sec:     68167
stat::new_units_added:          97
stat::slowest_unit_time_sec:    0
";

    #[test]
    fn final_stats_are_read() {
        assert_eq!(stat(LOG, "stat::average_exec_per_sec"), Some(68167));
        assert_eq!(stat(LOG, "stat::number_of_executed_units"), Some(2113190));
        assert_eq!(stat(LOG, "stat::new_units_added"), Some(97));
        assert_eq!(stat(LOG, "stat::peak_rss_mb"), None);
    }

    #[test]
    fn the_crashing_input_is_found() {
        let log = "==1== ERROR: libFuzzer: deadly signal\nartifact_prefix='/w/fuzz/artifacts/recording/'; Test unit written to /w/fuzz/artifacts/recording/crash-da39a3ee\nBase64: AA==\n";
        assert_eq!(
            crash_artifact(log),
            Some(PathBuf::from("/w/fuzz/artifacts/recording/crash-da39a3ee"))
        );
        assert_eq!(crash_artifact(LOG), None);
    }
}
