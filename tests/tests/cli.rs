//! The `workerprobe` binary end to end: JSON snapshot and error sentences.

use std::{
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Child, Command},
    time::Duration,
};

use workerprobe_tests::{
    TestCgroup, field, read_first_json_line, require_root, start_agent, temp_path, wait_json,
    workerprobe_path,
};

#[test]
fn snapshot_json_reports_a_worker_cpu_and_bytes() {
    require_root();
    let sender = TestCgroup::new("cli-send");
    let receiver = TestCgroup::new("cli-recv");
    // Start the work only once the window has begun.
    let agent = start_agent(
        &[
            "snapshot",
            "--json",
            "--duration",
            "4s",
            "--node-name",
            "node-a",
        ],
        "attached",
    );

    let mut recv = receiver.spawn_workload(&["recv", "tcp", "127.0.0.1:0", "0"]);
    let addr = read_first_json_line(&mut recv)["addr"]
        .as_str()
        .expect("addr")
        .to_string();
    let send = sender.spawn_workload(&["send", "tcp", &addr, "5000000", "4096,65536"]);
    let sent = wait_json(send);
    let received = wait_json(recv);
    let spin = sender.spawn_workload(&["spin", "300", "1"]);
    assert!(spin.wait_with_output().expect("wait").status.success());
    let sender_usage_ns = sender.cpu_stat().usage_usec * 1_000;

    let output = agent.wait_with_output().expect("wait for agent");
    assert!(output.status.success(), "agent failed: {:?}", output.status);
    let document: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("one JSON document");
    assert_eq!(document["schema_version"], 4);
    // The node as named, and its clock as the kernel sees it (adjtimex read here too).
    assert_eq!(document["node"]["name"], "node-a");
    let synchronized = workerprobe_tests::kernel_clock_synchronized();
    let clock = &document["node"]["clock"];
    assert_eq!(clock["synchronized"], synchronized, "{clock}");
    assert!(
        clock["max_error_seconds"]
            .as_f64()
            .is_some_and(|s| s >= 0.0),
        "{clock}"
    );
    assert!(
        document["window"]["duration_seconds"]
            .as_f64()
            .expect("duration")
            >= 4.0
    );
    assert_eq!(document["drops"]["cpu_stats"]["total"], 0);
    let sender_doc = worker_in(&document, sender.id);
    let receiver_doc = worker_in(&document, receiver.id);
    let sender_path = &sender.name();
    assert!(
        sender_doc["path"]
            .as_str()
            .expect("path")
            .ends_with(sender_path)
    );
    assert_eq!(
        sender_doc["net"]["sent_bytes"].as_u64(),
        Some(field(&sent, "sent_bytes"))
    );
    assert_eq!(
        sender_doc["net"]["families"]["ipv4"]["sent_calls"].as_u64(),
        Some(field(&sent, "sent_calls"))
    );
    assert_eq!(
        receiver_doc["net"]["received_bytes"].as_u64(),
        Some(field(&received, "received_bytes"))
    );

    let cpu = &sender_doc["cpu"];
    let seconds = cpu["seconds"].as_f64().expect("seconds");
    let per_cpu: f64 = cpu["per_cpu_seconds"]
        .as_array()
        .expect("per cpu")
        .iter()
        .map(|v| v.as_f64().expect("f64"))
        .sum();
    assert!(
        (per_cpu - seconds).abs() < 1e-6,
        "per-CPU seconds {per_cpu} do not sum to {seconds}"
    );
    let kernel_seconds = sender_usage_ns as f64 / 1e9;
    assert!(
        (seconds - kernel_seconds).abs() / kernel_seconds < 0.02,
        "sender CPU {seconds}s vs cpu.stat {kernel_seconds}s"
    );
    let user = cpu["user_seconds"]
        .as_f64()
        .expect("user seconds from cpu.stat");
    let system = cpu["system_seconds"]
        .as_f64()
        .expect("system seconds from cpu.stat");
    assert!(user > 0.1, "a 300 ms spin is mostly user time: {user}");
    assert!((user + system - kernel_seconds).abs() < 0.05);
}

#[test]
fn without_privileges_it_says_what_to_do() {
    require_root();
    // uid 65534 (nobody) has no capabilities.
    let output = Command::new(workerprobe_path())
        .args(["snapshot", "--duration", "100ms"])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run workerprobe as nobody");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "stderr: {stderr}");
    assert_eq!(
        stderr.lines().count(),
        1,
        "one sentence, no backtrace: {stderr}"
    );
    assert!(
        stderr.contains("needs root (or CAP_BPF and CAP_PERFMON)"),
        "{stderr}"
    );
}

#[test]
fn a_bad_value_names_the_flag_and_exits_2() {
    let output = Command::new(workerprobe_path())
        .args(["top", "--interval", "fast"])
        .output()
        .expect("run workerprobe");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    assert!(stderr.contains("--interval"), "{stderr}");
    assert!(stderr.contains("like 1s"), "{stderr}");
}

/// `workerprobe check` on this kernel: every group runs (through whichever variant the
/// kernel allows), and the cgroup2 mount it names is the one in mountinfo.
#[test]
fn check_finds_a_variant_for_every_group() {
    require_root();
    let output = Command::new(workerprobe_path())
        .args(["check", "--json"])
        .output()
        .expect("run workerprobe check");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "stderr: {stderr}");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    for group in ["cpu", "delays", "net", "workers"] {
        assert!(
            report["groups"][group]["variant"].is_string(),
            "{group} has no variant: {report}"
        );
    }
    let mount = workerprobe::cgroup::find_cgroup2_mount().expect("cgroup2");
    assert_eq!(report["cgroup2"]["mount"], mount.display().to_string());
    // Memory by one walk exactly where cgroup2 has the memory controller (every kernel of
    // the matrix has the cgroup iterator).
    let controllers =
        std::fs::read_to_string(mount.join("cgroup.controllers")).expect("controllers");
    let memory = report["memory"].as_str().unwrap_or("");
    assert_eq!(
        memory.starts_with("iter/cgroup"),
        controllers.split_whitespace().any(|c| c == "memory"),
        "memory read by {memory}"
    );
    // The socket-length tracepoints exist from 6.3; before, the fexit variant runs.
    let btf = std::fs::read("/sys/kernel/btf/vmlinux").expect("BTF");
    let has_tracepoint = btf
        .windows(b"btf_trace_sock_send_length".len())
        .any(|w| w == b"btf_trace_sock_send_length");
    let net = report["groups"]["net"]["variant"].as_str().unwrap_or("");
    assert_eq!(
        net.starts_with("tp_btf"),
        has_tracepoint,
        "net variant {net}"
    );
}

/// The default `top`, piped, shows a worker sending bytes while it sends.
#[test]
fn top_once_shows_a_sending_worker_and_its_bytes() {
    require_root();
    let sender = TestCgroup::new("cli-top-send");
    let receiver = TestCgroup::new("cli-top-recv");
    let mut recv = receiver.spawn_workload(&["recv", "tcp", "127.0.0.1:0", "0"]);
    let addr = read_first_json_line(&mut recv)["addr"]
        .as_str()
        .expect("addr")
        .to_string();
    // Sends for as long as top takes to start and sample (killed after).
    let mut send = sender.spawn_workload(&["send", "tcp", &addr, "1000000000000", "65536"]);
    let output = Command::new(workerprobe_path())
        .args([
            "top",
            "--once",
            "--interval",
            "2s",
            "--workers",
            "*cli-top-send",
        ])
        .output()
        .expect("run workerprobe top");
    let _ = send.kill();
    let _ = send.wait();
    let _ = recv.kill();
    let _ = recv.wait();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "top failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let name = sender.name();
    let row = stdout
        .lines()
        .find(|line| line.contains(&name))
        .unwrap_or_else(|| panic!("no row for {name} in\n{stdout}"));
    let columns: Vec<&str> = row.split_whitespace().collect();
    // SEND/s is the fourth figure from the right of CPU-TOTAL SENT RECV.
    let sent_total = columns[columns.len() - 2];
    assert!(
        sent_total != "0B" && sent_total != "n/a",
        "no bytes sent in {row:?}"
    );
}

/// With only CPU time, delays, bytes and context switches are not measured: null and n/a,
/// never 0.
#[test]
fn cpu_only_shows_delays_and_bytes_as_not_measured() {
    require_root();
    let worker = TestCgroup::new("cli-cpu-only");
    let agent = start_agent(
        &[
            "snapshot",
            "--json",
            "--duration",
            "2s",
            "--programs",
            "cpu",
        ],
        "attached",
    );
    wait_json_or_status(worker.spawn_workload(&["spin", "100", "1"]));
    let output = agent.wait_with_output().expect("wait for agent");
    assert!(output.status.success());
    let document: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(document["measured"]["net"], false);
    assert_eq!(document["measured"]["delays"], false);
    // CPU time alone comes from the kernel's accounting: no switch program counts switches.
    assert_eq!(document["measured"]["switches"], false);
    let seen = worker_in(&document, worker.id);
    assert!(seen["net"].is_null() && seen["time"].is_null(), "{seen}");
    assert!(seen["cpu"]["voluntary_switches"].is_null(), "{seen}");
    assert!(seen["cpu"]["seconds"].as_f64().is_some_and(|s| s > 0.05));
}

fn wait_json_or_status(child: std::process::Child) {
    let output = child.wait_with_output().expect("wait");
    assert!(
        output.status.success(),
        "workload failed: {:?}",
        output.status
    );
}

/// Memory in `snapshot --json` is the kernel's own figure for the worker: its cgroup's
/// `memory.current` where cgroup2 has the memory controller, else its process's resident set.
#[test]
fn snapshot_json_reports_a_worker_memory() {
    require_root();
    let worker = TestCgroup::new("cli-mem");
    // Held long enough for a slow (debug, emulated) agent's start; killed once read.
    let mut holder = worker.spawn_workload(&["hold", "64", "60000"]);
    read_first_json_line(&mut holder);
    let name = worker.name();
    let output = Command::new(workerprobe_path())
        .args(["snapshot", "--json", "--duration", "1s", "--workers", &name])
        .output()
        .expect("run snapshot");
    // The kernel's figure, read while the holder still holds.
    let (expected_source, kernel_bytes) = kernel_memory(&worker, &[&holder]);
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let document: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let seen = worker_in(&document, worker.id);
    let memory = &seen["memory"];
    let current = memory["current_bytes"].as_u64().expect("current_bytes");
    eprintln!("memory: {memory} against the kernel's {kernel_bytes} ({expected_source})");
    assert_eq!(memory["source"], expected_source, "{memory}");
    assert!(current >= 64 << 20, "{current} bytes for 64 MiB held");
    let error = (current as f64 - kernel_bytes as f64).abs() / kernel_bytes as f64;
    assert!(
        error < 0.05,
        "{current} bytes against the kernel's {kernel_bytes}"
    );
    assert!(
        memory["peak_bytes"]
            .as_u64()
            .is_some_and(|peak| peak >= current)
    );
}

/// The worker with cgroup id `id` in a `snapshot --json` document.
fn worker_in(document: &serde_json::Value, id: u64) -> &serde_json::Value {
    document["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .find(|w| w["cgroup_id"] == id)
        .unwrap_or_else(|| panic!("worker {id} missing from {document}"))
}

/// The kernel's figure for the memory of `cgroup` holding `holders`: its `memory.current`
/// where cgroup2 has the memory controller, else the holders' summed VmRSS (what the agent
/// falls back to); with the source the agent must name.
fn kernel_memory(cgroup: &TestCgroup, holders: &[&Child]) -> (&'static str, u64) {
    if let Ok(text) = std::fs::read_to_string(cgroup.dir.join("memory.current")) {
        return ("cgroup2", text.trim().parse().expect("memory.current"));
    }
    let rss_bytes = holders
        .iter()
        .map(|holder| {
            let status =
                std::fs::read_to_string(format!("/proc/{}/status", holder.id())).expect("status");
            let kib: u64 = status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
                .expect("VmRSS");
            kib * 1024
        })
        .sum();
    ("rss", rss_bytes)
}

/// Waits (up to two minutes, for emulated kernels) until the recording at `out` has a tick of
/// cgroup `id` whose memory is within 5% of `expected`; panics with what the ticks said.
fn wait_for_memory_tick(out: &Path, id: u64, (source, expected): (&str, u64)) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut seen = Vec::new();
    while std::time::Instant::now() < deadline {
        let text = std::fs::read_to_string(out).unwrap_or_default();
        seen = text
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|line| line["type"] == "tick" && line["cgroup_id"] == id)
            .map(|line| line["memory"].clone())
            .collect::<Vec<_>>();
        if seen.iter().any(|memory| {
            memory["source"] == source
                && memory["current_bytes"].as_u64().is_some_and(|bytes| {
                    (bytes as f64 - expected as f64).abs() / (expected as f64) < 0.05
                })
        }) {
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("no tick of cgroup {id} showed {expected} bytes ({source}); its ticks said {seen:?}");
}

/// Memory is read afresh at every tick from files the agent keeps open between ticks: a
/// worker that grows shows its growth, and a cgroup removed and made again under the same
/// name shows the new cgroup's memory, not an error or the old one's.
#[test]
fn each_tick_reads_memory_afresh_even_of_a_cgroup_made_again_under_its_name() {
    require_root();
    let worker = TestCgroup::new("kept-memory");
    let name = worker.name();
    let out = temp_path("cli", "kept-memory.jsonl");
    let out_arg = out.to_str().expect("a UTF-8 temp path");
    let mut agent = start_agent(
        &[
            "record",
            "--out",
            out_arg,
            "--interval",
            "500ms",
            "--workers",
            &name,
        ],
        "recording to",
    );

    let mut first = worker.spawn_workload(&["hold", "32", "600000"]);
    read_first_json_line(&mut first);
    wait_for_memory_tick(&out, worker.id, kernel_memory(&worker, &[&first]));
    // A second process joins: the kept process list and counters must show it.
    let mut second = worker.spawn_workload(&["hold", "64", "600000"]);
    read_first_json_line(&mut second);
    wait_for_memory_tick(&out, worker.id, kernel_memory(&worker, &[&first, &second]));
    for mut holder in [first, second] {
        let _ = holder.kill();
        let _ = holder.wait();
    }
    let first_id = worker.id;
    drop(worker);

    let again = TestCgroup::new("kept-memory");
    assert_ne!(again.id, first_id, "the cgroup made again has a new id");
    let mut third = again.spawn_workload(&["hold", "48", "600000"]);
    read_first_json_line(&mut third);
    wait_for_memory_tick(&out, again.id, kernel_memory(&again, &[&third]));
    let _ = third.kill();
    let _ = third.wait();
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(agent.id() as i32, libc::SIGINT) }, 0);
    assert!(agent.wait().expect("wait for record").success());
    let _ = std::fs::remove_file(&out);
}

/// `exec` runs its command with the descriptor limit `exec` was given: the agents raise their
/// own soft limit for the files they keep open, and a command must not inherit that.
#[test]
fn exec_passes_on_the_callers_descriptor_limit() {
    require_root();
    let mut command = Command::new(workerprobe_path());
    command.args(["exec", "--", "sh", "-c", "ulimit -Sn"]);
    // SAFETY: setrlimit is async-signal-safe; the struct lives on this stack frame.
    unsafe {
        command.pre_exec(|| {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
            // Below the hard limit, so a raise would show.
            limit.rlim_cur = 1000.min(limit.rlim_max.saturating_sub(1));
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            Ok(())
        });
    }
    let output = command.output().expect("run exec");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let soft: u64 = String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("ulimit -Sn prints a number");
    let mut own = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut own) };
    assert_eq!(soft, 1000.min(own.rlim_max - 1), "the command's soft limit");
}
