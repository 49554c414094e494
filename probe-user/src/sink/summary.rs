//! Exit summaries for people: one line per exit (`watch`), or a short report (`exec`).

use std::fmt::Write as _;

use crate::{model::summary::ExitSummary, sink::table::bytes};

/// One line: who ended, how long it lived, and where its time, bytes and memory went.
pub fn human_line(summary: &ExitSummary) -> String {
    let wall = summary.wall_seconds.max(f64::MIN_POSITIVE);
    let share = |seconds: f64| (seconds / wall * 100.0).round() as i64;
    let mut line = format!(
        "exit {} ({} {}) wall {:.3}s cpu {:.3}s",
        summary.path,
        summary.kind.as_str(),
        summary.name,
        summary.wall_seconds,
        summary.cpu.total_seconds,
    );
    if let (Some(user), Some(system)) = (summary.cpu.user_seconds, summary.cpu.system_seconds) {
        let _ = write!(line, " (user {user:.3}s system {system:.3}s)");
    }
    match &summary.time {
        Some(time) => {
            let _ = write!(
                line,
                " on-cpu/runq/io/sleep {}/{}/{}/{}%",
                share(time.on_cpu_seconds),
                share(time.runqueue_wait_seconds),
                share(time.blocked_io_seconds),
                share(time.sleep_seconds),
            );
            let mut reasons: Vec<(&str, f64)> = time
                .waits
                .iter()
                .flatten()
                .map(|(name, wait)| (*name, wait.seconds))
                .collect();
            reasons.sort_by(|a, b| b.1.total_cmp(&a.1));
            let top: Vec<String> = reasons
                .iter()
                .filter(|(_, seconds)| *seconds > 0.0)
                .take(2)
                .map(|(name, seconds)| format!("{name} {}%", share(*seconds)))
                .collect();
            if !top.is_empty() {
                let _ = write!(line, " waits {}", top.join(" "));
            }
        }
        None => line.push_str(" on-cpu/runq/io/sleep n/a"),
    }
    match &summary.net {
        Some(net) => {
            let _ = write!(
                line,
                " sent {} recv {}",
                bytes(net.sent_bytes),
                bytes(net.received_bytes)
            );
        }
        None => line.push_str(" sent n/a recv n/a"),
    }
    if let Some(memory) = &summary.memory {
        let _ = write!(line, " mem peak {}", bytes(memory.peak_bytes));
    }
    line
}

/// A short report of one worker, for `exec`.
pub fn report(summary: &ExitSummary) -> String {
    let mut out = String::new();
    let wall = summary.wall_seconds.max(f64::MIN_POSITIVE);
    let percent = |seconds: f64| seconds / wall * 100.0;
    if let Some(exec) = &summary.exec {
        let how = match exec.signal {
            Some(signal) => format!("was killed by signal {signal}"),
            None => format!("exited {}", exec.exit_code),
        };
        let _ = writeln!(
            out,
            "workerprobe: `{}` {how} after {:.3}s",
            exec.command.join(" "),
            summary.wall_seconds
        );
    }
    let _ = writeln!(
        out,
        "  worker     {} ({})",
        summary.path,
        summary.kind.as_str()
    );
    let mut cpu = format!(
        "{:.3}s total, {:.2} cores on average",
        summary.cpu.total_seconds, summary.cpu.cores
    );
    if let (Some(user), Some(system)) = (summary.cpu.user_seconds, summary.cpu.system_seconds) {
        let _ = write!(cpu, " (user {user:.3}s, system {system:.3}s)");
    }
    let _ = writeln!(out, "  cpu        {cpu}");
    let per_cpu: Vec<String> = summary
        .cpu
        .per_cpu_seconds
        .iter()
        .enumerate()
        .map(|(index, seconds)| format!("cpu{index} {seconds:.3}s ({:.0}%)", percent(*seconds)))
        .collect();
    let _ = writeln!(out, "  per cpu    {}", per_cpu.join("  "));
    match &summary.time {
        Some(time) => {
            let _ = writeln!(out, "  time       {}", time_line(summary, time, wall));
            if let (Some(p50), Some(p99)) = (
                time.runqueue_wait_p50_seconds,
                time.runqueue_wait_p99_seconds,
            ) {
                let _ = writeln!(
                    out,
                    "  run-queue  p50 ≤ {} · p99 ≤ {}",
                    micros(p50),
                    micros(p99)
                );
            }
        }
        None => {
            let _ = writeln!(out, "  time       not measured");
        }
    }
    match &summary.net {
        Some(net) => {
            let _ = writeln!(
                out,
                "  network    sent {} in {} calls · received {} in {} calls",
                bytes(net.sent_bytes),
                net.sent_calls,
                bytes(net.received_bytes),
                net.received_calls
            );
        }
        None => {
            let _ = writeln!(out, "  network    not measured");
        }
    }
    if let Some(endpoints) = &summary.endpoints {
        for endpoint in endpoints.iter().take(5) {
            let waited = endpoint
                .wait_seconds
                .map_or(String::new(), |seconds| format!(" · waited {seconds:.3}s"));
            let _ = writeln!(
                out,
                "  endpoint   {} sent {} · received {}{waited}",
                endpoint.endpoint,
                bytes(endpoint.sent_bytes),
                bytes(endpoint.received_bytes)
            );
        }
        if endpoints.len() > 5 {
            let _ = writeln!(out, "  endpoint   … {} more", endpoints.len() - 5);
        }
    }
    match (&summary.memory, summary.lithops.worker_peak_memory_end) {
        (Some(memory), _) => {
            let _ = writeln!(
                out,
                "  memory     peak {} ({})",
                bytes(memory.peak_bytes),
                serde_json::to_value(memory.source)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            );
        }
        (None, Some(peak)) => {
            let _ = writeln!(out, "  memory     peak {} (max rss)", bytes(peak));
        }
        (None, None) => {}
    }
    match &summary.context_switches {
        Some(switches) => {
            let _ = writeln!(
                out,
                "  switches   voluntary {} · involuntary {}",
                switches.voluntary, switches.involuntary
            );
        }
        None => {
            let _ = writeln!(out, "  switches   not measured");
        }
    }
    out
}

/// Where the time went, leading with the answer: on-CPU, then each wait reason, longest
/// first (network with its endpoints), then run-queue, in % of the wall time.
fn time_line(
    summary: &ExitSummary,
    time: &crate::model::summary::SummaryTime,
    wall: f64,
) -> String {
    let percent = |seconds: f64| format!("{:.0}%", seconds / wall * 100.0);
    let Some(waits) = &time.waits else {
        // Without the reasons, the four states.
        return format!(
            "on-cpu {} · run-queue {} · blocked i/o {} · sleep {}",
            percent(time.on_cpu_seconds),
            percent(time.runqueue_wait_seconds),
            percent(time.blocked_io_seconds),
            percent(time.sleep_seconds)
        );
    };
    let mut parts = vec![format!("on-cpu {}", percent(time.on_cpu_seconds))];
    let mut reasons: Vec<(&str, f64)> = waits
        .iter()
        .map(|(name, wait)| (*name, wait.seconds))
        .filter(|(_, seconds)| *seconds > 0.0)
        .collect();
    reasons.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (index, (name, seconds)) in reasons.iter().enumerate() {
        let mut part = if index == 0 {
            format!("waiting on {name} {}", percent(*seconds))
        } else {
            format!("{name} {}", percent(*seconds))
        };
        if *name == "network"
            && let Some(endpoints) = &summary.endpoints
        {
            let mut waited: Vec<(&str, f64)> = endpoints
                .iter()
                .filter_map(|e| Some((e.endpoint.as_str(), e.wait_seconds?)))
                .filter(|(_, seconds)| *seconds > 0.0)
                .collect();
            waited.sort_by(|a, b| b.1.total_cmp(&a.1));
            if !waited.is_empty() {
                let shown: Vec<String> = waited
                    .iter()
                    .take(3)
                    .map(|(endpoint, seconds)| format!("{endpoint} {}", percent(*seconds)))
                    .collect();
                let _ = write!(part, " ({})", shown.join(", "));
            }
        }
        parts.push(part);
    }
    parts.push(format!("run-queue {}", percent(time.runqueue_wait_seconds)));
    parts.join(" · ")
}

/// A short duration in µs or ms.
fn micros(seconds: f64) -> String {
    if seconds < 1e-3 {
        format!("{:.0}µs", seconds * 1e6)
    } else if seconds < 1.0 {
        format!("{:.1}ms", seconds * 1e3)
    } else {
        format!("{seconds:.2}s")
    }
}
