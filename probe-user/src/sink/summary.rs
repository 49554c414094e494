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
            let _ = writeln!(
                out,
                "  time       on-cpu {:.0}% · run-queue {:.0}% · blocked i/o {:.0}% · sleep {:.0}%",
                percent(time.on_cpu_seconds),
                percent(time.runqueue_wait_seconds),
                percent(time.blocked_io_seconds),
                percent(time.sleep_seconds)
            );
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
    match (&summary.memory, summary.lithops.worker_peak_memory) {
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
    let _ = writeln!(
        out,
        "  switches   voluntary {} · involuntary {}",
        summary.context_switches.voluntary, summary.context_switches.involuntary
    );
    out
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
