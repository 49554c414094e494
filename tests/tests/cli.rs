//! The `workerprobe` binary end to end: JSON snapshot and error sentences.

use std::{os::unix::process::CommandExt as _, process::Command};

use workerprobe_tests::{
    TestCgroup, field, read_first_json_line, require_root, start_agent, wait_json, workerprobe_path,
};

#[test]
fn snapshot_json_reports_a_worker_cpu_and_bytes() {
    require_root();
    let sender = TestCgroup::new("cli-send");
    let receiver = TestCgroup::new("cli-recv");
    // Start the work only once the window has begun.
    let agent = start_agent(&["snapshot", "--json", "--duration", "4s"], "attached");

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
    assert_eq!(document["schema_version"], 1);
    assert!(
        document["window"]["duration_seconds"]
            .as_f64()
            .expect("duration")
            >= 4.0
    );
    assert_eq!(document["drops"]["cpu_stats"]["total"], 0);
    let workers = document["workers"].as_array().expect("workers");
    let find = |id: u64| {
        workers
            .iter()
            .find(|w| w["cgroup_id"] == id)
            .unwrap_or_else(|| panic!("worker {id} missing from {document}"))
    };
    let sender_doc = find(sender.id);
    let receiver_doc = find(receiver.id);
    let sender_path = sender
        .dir
        .file_name()
        .expect("name")
        .to_str()
        .expect("utf-8");
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
