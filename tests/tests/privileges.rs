//! Least privilege: with `--user`, the agent drops to that user and every capability after
//! load and attach, and keeps measuring through the descriptors it holds.

use std::time::Duration;

use workerprobe_tests::{TestCgroup, require_root, start_agent, status_field};

#[test]
fn an_agent_running_as_nobody_without_capabilities_still_measures() {
    require_root();
    let worker = TestCgroup::new("priv");
    let agent = start_agent(
        &["snapshot", "--json", "--duration", "3s", "--user", "nobody"],
        "attached",
    );
    // The drop happens before the window starts: look while it measures.
    std::thread::sleep(Duration::from_millis(300));
    let uid = status_field(agent.id(), "Uid:");
    let effective = status_field(agent.id(), "CapEff:");
    let permitted = status_field(agent.id(), "CapPrm:");
    let before = worker.cpu_stat().usage_usec;
    let spinner = worker.spawn_workload(&["spin", "800", "1"]);
    assert!(spinner.wait_with_output().expect("wait").status.success());
    let kernel_s = (worker.cpu_stat().usage_usec - before) as f64 / 1e6;
    let output = agent.wait_with_output().expect("wait for agent");

    assert_eq!(
        uid.split_whitespace().collect::<Vec<_>>(),
        ["65534"; 4],
        "uid {uid}"
    );
    assert_eq!(
        u64::from_str_radix(&effective, 16),
        Ok(0),
        "CapEff {effective}"
    );
    assert_eq!(
        u64::from_str_radix(&permitted, 16),
        Ok(0),
        "CapPrm {permitted}"
    );
    assert!(output.status.success(), "agent failed: {:?}", output.status);
    let document: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let ours_s = document["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .find(|w| w["cgroup_id"] == worker.id)
        .unwrap_or_else(|| panic!("the worker is missing from {document}"))["cpu"]["seconds"]
        .as_f64()
        .expect("seconds");
    eprintln!("as nobody: ours {ours_s}s, cpu.stat {kernel_s}s");
    assert!(kernel_s > 0.3, "the worker barely ran");
    assert!(
        (ours_s - kernel_s).abs() <= kernel_s * 0.02,
        "{ours_s}s vs cpu.stat {kernel_s}s"
    );
}

#[test]
fn an_unknown_user_is_one_sentence_and_exit_2() {
    require_root();
    let output = std::process::Command::new(workerprobe_tests::workerprobe_path())
        .args([
            "snapshot",
            "--duration",
            "100ms",
            "--user",
            "no-such-user-here",
        ])
        .output()
        .expect("run workerprobe");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no user `no-such-user-here`"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}
