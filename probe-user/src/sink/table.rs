//! The plain-text worker table of `top` (also used when output is not a terminal).

use std::fmt::Write as _;

use crate::model::{Interval, WorkerStats};

/// Longest worker path shown before it is shortened in the middle.
const PATH_WIDTH: usize = 40;

/// Longest worker name shown (a container's name, a unit's, a pod's) before it is shortened.
pub const NAME_WIDTH: usize = 18;

/// Renders the table of active workers, busiest first, at most `limit` rows.
pub fn render(interval: &Interval, limit: usize) -> String {
    let mut active: Vec<&WorkerStats> = interval.active_workers().collect();
    active.sort_by(|a, b| {
        b.cpu_ns()
            .cmp(&a.cpu_ns())
            .then(a.cgroup_id.cmp(&b.cgroup_id))
    });
    let drops: u64 = interval.total_drops.iter().sum();
    let mut out = String::new();
    let _ = write!(
        out,
        "workers active: {}   interval: {:.2}s   drops since start: {}",
        active.len(),
        interval.duration_ns() as f64 / 1e9,
        drops
    );
    if let Some(level) = interval.level {
        let _ = write!(out, "   {level}: subtrees folded in");
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<PATH_WIDTH$} {:<NAME_WIDTH$} {:>6}  {:<16} {:<19} {:<20} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9}",
        "WORKER",
        "NAME",
        "CORES",
        "PER-CPU",
        "CPU/RUNQ/IO/SLEEP %",
        "WAITING ON",
        "SEND/s",
        "RECV/s",
        "MEM",
        "CPU-TOTAL",
        "SENT",
        "RECV"
    );
    let measured = interval.measured;
    // Not measured reads `n/a`, never 0.
    let net = |text: String| {
        if measured.net {
            text
        } else {
            NOT_MEASURED.into()
        }
    };
    for worker in active.iter().take(limit) {
        let _ = writeln!(
            out,
            "{:<PATH_WIDTH$} {:<NAME_WIDTH$} {:>6.2}  {:<16} {:<19} {:<20} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9}",
            shorten(&worker_label(worker), PATH_WIDTH),
            shorten(&worker_name(worker), NAME_WIDTH),
            worker.cpu_cores(),
            per_cpu(worker),
            breakdown(worker, measured.delays),
            if measured.waits {
                top_reasons(worker)
            } else {
                NOT_MEASURED.into()
            },
            net(format!(
                "{}/s",
                bytes(worker.sent_bytes_per_second() as u64)
            )),
            net(format!(
                "{}/s",
                bytes(worker.received_bytes_per_second() as u64)
            )),
            memory_cell(worker),
            format!("{:.2}s", worker.total_cpu_ns as f64 / 1e9),
            net(bytes(worker.total_sent_bytes)),
            net(bytes(worker.total_received_bytes)),
        );
    }
    if active.len() > limit {
        let _ = writeln!(out, "… {} more", active.len() - limit);
    }
    out
}

/// The path of a worker, or its id once the cgroup is gone.
pub fn worker_label(worker: &WorkerStats) -> String {
    worker
        .path
        .as_deref()
        .map_or_else(|| format!("cgroup:{}", worker.cgroup_id), str::to_owned)
}

/// A worker's name (its container's, unit's, pod's or last path component), `-` once the
/// cgroup is gone unnamed.
pub fn worker_name(worker: &WorkerStats) -> String {
    worker
        .named()
        .map_or_else(|| "-".to_owned(), |identity| identity.name)
}

/// Cores used on each CPU, e.g. `0.98 0.02`.
fn per_cpu(worker: &WorkerStats) -> String {
    worker
        .cpu_cores_per_cpu()
        .iter()
        .map(|cores| format!("{cores:.2}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Memory in use at the end of the interval; `n/a` where no source had it.
pub fn memory_cell(worker: &WorkerStats) -> String {
    worker
        .memory
        .map_or(NOT_MEASURED.into(), |memory| bytes(memory.current_bytes))
}

/// What a cell shows for a measurement this kernel or `--programs` did not make.
pub const NOT_MEASURED: &str = "n/a";

/// Where the thread time went, in % of the interval: `cpu/runq/io/sleep` (`cpu/n/a` when the
/// delays are not measured).
fn breakdown(worker: &WorkerStats, delays_measured: bool) -> String {
    let percent = |ns: u64| (worker.share_of_interval(ns) * 100.0).round() as u64;
    if !delays_measured {
        return format!("{}/{NOT_MEASURED}", percent(worker.cpu_ns()));
    }
    let delays = &worker.delays;
    format!(
        "{}/{}/{}/{}",
        percent(worker.cpu_ns()),
        percent(delays.runqueue_wait_ns),
        percent(delays.blocked_io_ns),
        percent(delays.sleep_ns)
    )
}

/// The two longest wait reasons and their share of the interval, e.g. `network 71% lock 3%`.
pub fn top_reasons(worker: &WorkerStats) -> String {
    let reasons = worker.delays.reasons_by_time();
    if reasons.is_empty() {
        return "-".into();
    }
    reasons
        .iter()
        .take(2)
        .map(|(name, ns)| format!("{name} {:.0}%", worker.share_of_interval(*ns) * 100.0))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `text` in at most `width` cells, shortened from the middle with `…` (a path keeps its
/// root and its last component, the parts that name a worker).
pub fn shorten(text: &str, width: usize) -> String {
    let chars: Vec<char> = text.chars().collect();
    if chars.len() <= width || width < 3 {
        return text.to_string();
    }
    let tail = (width - 1) * 2 / 3;
    let head = width - 1 - tail;
    let mut out: String = chars[..head].iter().collect();
    out.push('…');
    out.extend(&chars[chars.len() - tail..]);
    out
}

/// Bytes in IEC units with three significant digits.
pub fn bytes(count: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = count as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{count}B")
    } else if value < 10.0 {
        format!("{value:.2}{}", UNITS[unit])
    } else if value < 100.0 {
        format!("{value:.1}{}", UNITS[unit])
    } else {
        format!("{value:.0}{}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Timestamp;

    #[test]
    fn formats_bytes() {
        assert_eq!(bytes(0), "0B");
        assert_eq!(bytes(1023), "1023B");
        assert_eq!(bytes(1536), "1.50KiB");
        assert_eq!(bytes(50 * 1024 * 1024), "50.0MiB");
        assert_eq!(bytes(300 * 1024 * 1024 * 1024), "300GiB");
    }

    #[test]
    fn shortens_in_the_middle_keeping_root_and_last_component() {
        assert_eq!(shorten("/a/b", 10), "/a/b");
        assert_eq!(
            shorten("/system.slice/worker-1.service", 16),
            "/syst…-1.service"
        );
        // A Kubernetes path keeps its kubepods root and the container's scope.
        let pod = "/kubepods.slice/kubepods-pod1a2b.slice/cri-containerd-4f3a.scope";
        let short = shorten(pod, 40);
        assert_eq!(short.chars().count(), 40);
        assert!(short.starts_with("/kubepods") && short.ends_with("cri-containerd-4f3a.scope"));
    }

    #[test]
    fn renders_busiest_first_with_per_cpu_split() {
        let worker = |id, path: &str, cpu0, cpu1| WorkerStats {
            cgroup_id: id,
            path: Some(path.into()),
            interval_ns: 1_000_000_000,
            cpu_ns_per_cpu: vec![cpu0, cpu1],
            ..WorkerStats::default()
        };
        let interval = Interval {
            measured: Default::default(),
            level: None,
            start: Some(Timestamp {
                monotonic_ns: 0,
                wall_unix_ns: 0,
            }),
            end: Some(Timestamp {
                monotonic_ns: 1_000_000_000,
                wall_unix_ns: 1_000_000_000,
            }),
            workers: vec![
                worker(2, "/small", 100_000_000, 0),
                worker(3, "/big", 900_000_000, 500_000_000),
                worker(4, "/idle", 0, 0),
            ],
            drops: vec![0, 0],
            total_drops: vec![0, 0],
        };
        let text = render(&interval, 10);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("workers active: 2"));
        assert!(lines[2].starts_with("/big"));
        assert!(lines[2].contains("1.40  0.90 0.50"));
        assert!(lines[2].contains("140/0/0/0"));
        assert!(lines[3].starts_with("/small"));
        assert_eq!(lines.len(), 4);
    }
}

/// One named process tree in top's table.
#[derive(Clone, Debug, PartialEq)]
pub struct TreeRow {
    /// The rule that named it.
    pub rule: String,
    /// Its captures, `name=value` separated by spaces.
    pub ids: String,
    /// Processes so far.
    pub processes: u64,
    /// CPU in the interval, ns.
    pub interval_cpu_ns: u64,
    /// CPU so far, ns.
    pub total_cpu_ns: u64,
    /// False for a tree that ended in the interval.
    pub running: bool,
}

/// The named process trees, busiest first: CPU in the interval as % of one CPU, and so far.
pub fn render_trees(rows: &[TreeRow], interval: std::time::Duration) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\nprocess trees: {}", rows.len());
    let _ = writeln!(
        out,
        "{:<10} {:>6} {:>7} {:>10} {:<6} IDS",
        "RULE", "PROCS", "CPU%", "CPU s", "STATE"
    );
    let interval_ns = interval.as_nanos().max(1) as f64;
    for row in rows {
        let _ = writeln!(
            out,
            "{:<10} {:>6} {:>7.1} {:>10.3} {:<6} {}",
            row.rule,
            row.processes,
            row.interval_cpu_ns as f64 / interval_ns * 100.0,
            row.total_cpu_ns as f64 / 1e9,
            if row.running { "run" } else { "ended" },
            row.ids
        );
    }
    out
}
