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
}

/// Options every command that loads the programs shares.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// How many cgroups the kernel maps can hold; a cgroup beyond that is counted as a drop.
    #[arg(long, default_value_t = probe_common::DEFAULT_MAX_WORKERS, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub max_workers: u32,
    /// What to measure: cpu (on-CPU time, context switches), delays (where off-CPU time went:
    /// run-queue wait, blocked on I/O, sleep), net (socket bytes). Separate with commas.
    #[arg(long, value_delimiter = ',', default_value = "cpu,delays,net")]
    pub programs: Vec<ProgramChoice>,
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
    /// For benchmarks only: an empty sched_switch program, the cost floor.
    #[value(hide = true)]
    Floor,
}

impl From<ProgramChoice> for crate::loader::ProgramGroup {
    fn from(choice: ProgramChoice) -> Self {
        match choice {
            ProgramChoice::Cpu => Self::Cpu,
            ProgramChoice::Delays => Self::Delays,
            ProgramChoice::Net => Self::Net,
            ProgramChoice::Floor => Self::Floor,
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
    #[arg(long, default_value_t = 40)]
    pub limit: usize,
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
    pub probe: ProbeArgs,
}

/// A duration like `1s`, `250ms` or `2m`, more than zero.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|err| {
        format!("`{text}` is not a duration ({err}); write it like 1s, 250ms or 2m")
    })?;
    if duration.is_zero() {
        return Err("the duration must be more than zero".into());
    }
    Ok(duration)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("fast").unwrap_err().contains("like 1s"));
        assert!(parse_interval("10ms").is_err());
        assert_eq!(parse_interval("1s"), Ok(Duration::from_secs(1)));
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }
}
