//! `workerprobe record` and `workerprobe replay` end to end: whole lines after a SIGKILL,
//! replay equal to what was measured live, and one sentence for bad input.

use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    process::{Child, Command, Output},
    time::Duration,
};

use workerprobe::cgroup;
use workerprobe_tests::{
    TestCgroup, field, read_first_json_line, require_root, start_agent, temp_path, wait_json,
    workerprobe_path, workload_path,
};

/// A fresh path in the temp directory for this test.
fn temp_file(name: &str) -> PathBuf {
    temp_path("record", name)
}

/// Starts `workerprobe record --out out` with `extra` flags and returns once it records.
fn start_record(out: &Path, extra: &[&str]) -> Child {
    let mut args: Vec<&std::ffi::OsStr> =
        vec!["record".as_ref(), "--out".as_ref(), out.as_os_str()];
    args.extend(extra.iter().map(|arg| std::ffi::OsStr::new(*arg)));
    start_agent(&args, "recording to")
}

/// Sends `signal` to a child.
fn signal(child: &Child, signal: i32) {
    // SAFETY: kill(2) on our own child's pid.
    let rc = unsafe { libc::kill(child.id() as i32, signal) };
    assert_eq!(rc, 0, "kill {}", child.id());
}

/// Every line of a recording, parsed; panics on a line that is not JSON of a known type.
fn read_lines(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).expect("read recording");
    assert!(text.ends_with('\n'), "the recording ends inside a line");
    text.lines()
        .enumerate()
        .map(|(number, line)| {
            let value: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|err| panic!("line {} is not JSON ({err}): {line:?}", number + 1));
            assert!(
                matches!(
                    value["type"].as_str(),
                    Some("header" | "tick" | "exit" | "clock")
                ),
                "line {} has no known type: {line}",
                number + 1
            );
            assert_eq!(value["schema_version"], 4, "line {}: {line}", number + 1);
            value
        })
        .collect()
}

fn replay(args: &[&str]) -> Output {
    Command::new(workerprobe_path())
        .arg("replay")
        .args(args)
        .output()
        .expect("run workerprobe replay")
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs `workerprobe COMMAND RECORDING --out OUT` (trace, report), which must succeed, and
/// returns what it wrote.
fn picture(command: &str, recording: &Path, out: &Path) -> String {
    let output = Command::new(workerprobe_path())
        .arg(command)
        .arg(recording)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap_or_else(|err| panic!("run workerprobe {command}: {err}"));
    assert!(output.status.success(), "{command}: {}", stderr_of(&output));
    std::fs::read_to_string(out).unwrap_or_else(|err| panic!("read {}: {err}", out.display()))
}

#[test]
fn a_recording_killed_mid_run_holds_only_whole_lines() {
    require_root();
    let mount = cgroup::find_cgroup2_mount().expect("cgroup2");
    let out = temp_file("killed.jsonl");
    let agent = start_record(&out, &["--interval", "200ms", "--node-name", "node-k"]);
    // A long worker busy throughout, and short ones made and removed, for exit lines.
    let busy = TestCgroup::new("rec-busy");
    let mut spin = busy.spawn_workload(&["spin", "5000", "1"]);
    for index in 0..12 {
        let dir = mount.join(format!("wp-rec-kill-{}-{index}", std::process::id()));
        std::fs::create_dir(&dir).expect("mkdir worker");
        let mut command = Command::new(workload_path());
        command.args(["life", "40"]);
        let status = cgroup::spawn_in_cgroup(&mut command, &dir)
            .expect("spawn")
            .wait()
            .expect("wait");
        assert!(status.success());
        cgroup::remove_cgroup(&dir).expect("rmdir worker");
    }
    std::thread::sleep(Duration::from_millis(350));
    signal(&agent, libc::SIGKILL);
    let mut agent = agent;
    let status = agent.wait().expect("wait for record");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    let _ = spin.kill();
    let _ = spin.wait();

    let lines = read_lines(&out);
    assert_eq!(lines[0]["type"], "header");
    assert_eq!(lines[0]["format"], "workerprobe-recording");
    // The node as named, and its clock as the kernel sees it (adjtimex read here too).
    assert_eq!(lines[0]["node"]["name"], "node-k");
    let synchronized = workerprobe_tests::kernel_clock_synchronized();
    assert_eq!(
        lines[0]["node"]["clock"]["synchronized"], synchronized,
        "{}",
        lines[0]
    );
    let ticks = lines.iter().filter(|line| line["type"] == "tick").count();
    let exits = lines.iter().filter(|line| line["type"] == "exit").count();
    assert!(ticks > 0 && exits > 0, "{ticks} ticks and {exits} exits");
    assert!(
        lines
            .iter()
            .any(|line| line["type"] == "tick" && line["cgroup_id"] == busy.id),
        "the busy worker has no tick line"
    );

    // The killed recording replays, and a new run appends after it on a line of its own.
    let output = replay(&[out.to_str().expect("utf-8")]);
    assert!(output.status.success(), "{}", stderr_of(&output));
    let mut again = start_record(
        &out,
        &["--append", "--interval", "200ms", "--duration", "600ms"],
    );
    assert!(again.wait().expect("wait").success());
    let lines = read_lines(&out);
    let headers = lines.iter().filter(|line| line["type"] == "header").count();
    assert_eq!(headers, 2);
    let output = replay(&["--json", out.to_str().expect("utf-8")]);
    assert!(output.status.success(), "{}", stderr_of(&output));
    assert!(stderr_of(&output).is_empty(), "{}", stderr_of(&output));
    let _ = std::fs::remove_file(&out);
}

/// Sums one worker's numbers over every document `replay --json` printed.
fn replayed_sum(documents: &[serde_json::Value], id: u64, pointer: &str) -> f64 {
    documents
        .iter()
        .flat_map(|document| document["workers"].as_array().expect("workers").iter())
        .filter(|worker| worker["cgroup_id"] == id)
        .map(|worker| {
            worker
                .pointer(pointer)
                .and_then(|v| v.as_f64())
                .unwrap_or(0.0)
        })
        .sum()
}

#[test]
fn replay_reproduces_the_live_totals() {
    require_root();
    let sender = TestCgroup::new("rec-send");
    let receiver = TestCgroup::new("rec-recv");
    let out = temp_file("totals.jsonl");
    let pattern = format!("*workerprobe-test-{}-rec-*", std::process::id());
    let agent = start_record(&out, &["--interval", "200ms", "--workers", &pattern]);

    let mut recv = receiver.spawn_workload(&["recv", "tcp", "127.0.0.1:0", "0"]);
    let addr = read_first_json_line(&mut recv)["addr"]
        .as_str()
        .expect("addr")
        .to_string();
    let send = sender.spawn_workload(&["send", "tcp", &addr, "5000000", "4096,65536"]);
    let sent = wait_json(send);
    let received = wait_json(recv);
    let spin = sender.spawn_workload(&["spin", "600", "2"]);
    assert!(spin.wait_with_output().expect("wait").status.success());
    // Two more ticks, so the workers' last moments are recorded.
    std::thread::sleep(Duration::from_millis(500));
    let sender_usage_seconds = sender.cpu_stat().usage_usec as f64 / 1e6;
    signal(&agent, libc::SIGINT);
    let mut agent = agent;
    assert!(agent.wait().expect("wait").success(), "record failed");

    let lines = read_lines(&out);
    let last_tick = |id: u64| {
        lines
            .iter()
            .rev()
            .find(|line| line["type"] == "tick" && line["cgroup_id"] == id)
            .unwrap_or_else(|| panic!("no tick line of {id}"))
            .clone()
    };
    let sender_last = last_tick(sender.id);
    let receiver_last = last_tick(receiver.id);
    for line in lines.iter().filter(|line| line["type"] == "tick") {
        let path = line["path"].as_str().expect("path");
        assert!(path.contains("-rec-"), "--workers let {path} in");
    }
    // The recorded totals are what the workloads did.
    assert_eq!(
        sender_last["totals"]["sent_bytes"].as_u64(),
        Some(field(&sent, "sent_bytes"))
    );
    assert_eq!(
        sender_last["totals"]["families"]["ipv4"]["sent_calls"].as_u64(),
        Some(field(&sent, "sent_calls"))
    );
    assert_eq!(
        receiver_last["totals"]["received_bytes"].as_u64(),
        Some(field(&received, "received_bytes"))
    );

    let output = replay(&["--json", out.to_str().expect("utf-8")]);
    assert!(output.status.success(), "{}", stderr_of(&output));
    let documents: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON document per line"))
        .collect();
    assert!(documents.len() >= 3, "{} documents", documents.len());
    let mut windows = HashSet::new();
    for document in &documents {
        assert_eq!(document["schema_version"], 4);
        assert!(windows.insert(document["window"]["end_monotonic_ns"].as_u64()));
    }
    // Replayed, each worker carries the memory its tick line recorded.
    let replayed_memory = documents
        .iter()
        .flat_map(|document| document["workers"].as_array().expect("workers").iter())
        .filter(|worker| worker["cgroup_id"] == sender.id && !worker["memory"].is_null())
        .map(|worker| worker["memory"].clone())
        .collect::<Vec<_>>();
    let recorded_memory = lines
        .iter()
        .filter(|line| line["type"] == "tick" && line["cgroup_id"] == sender.id)
        .filter(|line| !line["memory"].is_null())
        .map(|line| line["memory"].clone())
        .collect::<Vec<_>>();
    assert!(!recorded_memory.is_empty(), "no memory recorded");
    assert_eq!(replayed_memory, recorded_memory);
    // Replayed, the ticks add up to the live totals: bytes to the byte, CPU to the ns.
    let sent_bytes = replayed_sum(&documents, sender.id, "/net/sent_bytes");
    assert_eq!(sent_bytes as u64, field(&sent, "sent_bytes"));
    let received_bytes = replayed_sum(&documents, receiver.id, "/net/received_bytes");
    assert_eq!(received_bytes as u64, field(&received, "received_bytes"));
    let cpu_seconds = replayed_sum(&documents, sender.id, "/cpu/seconds");
    let recorded_seconds = sender_last["totals"]["on_cpu_ns"].as_u64().expect("ns") as f64 / 1e9;
    assert!(
        (cpu_seconds - recorded_seconds).abs() < 1e-6,
        "replayed {cpu_seconds}s vs recorded {recorded_seconds}s"
    );
    assert!(
        (cpu_seconds - sender_usage_seconds).abs() / sender_usage_seconds < 0.02,
        "replayed CPU {cpu_seconds}s vs cpu.stat {sender_usage_seconds}s"
    );

    // --worker keeps one worker; --at picks one tick and shows the same table as top.
    let sender_name = &sender.name();
    let output = replay(&[
        "--json",
        "--worker",
        sender_name,
        out.to_str().expect("utf-8"),
    ]);
    assert!(output.status.success(), "{}", stderr_of(&output));
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let document: serde_json::Value = serde_json::from_str(line).expect("json");
        for worker in document["workers"].as_array().expect("workers") {
            assert_eq!(worker["cgroup_id"], sender.id);
        }
    }
    let output = replay(&["--at", "0.1", out.to_str().expect("utf-8")]);
    assert!(output.status.success(), "{}", stderr_of(&output));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("workers active:") && text.contains("CPU-TOTAL"),
        "{text}"
    );
    assert_eq!(text.matches("workers active:").count(), 1, "{text}");
    let output = replay(&["--at", "10h", out.to_str().expect("utf-8")]);
    assert_eq!(output.status.code(), Some(2), "a time outside is bad input");
    assert!(
        stderr_of(&output).contains("is outside the recording, which runs from"),
        "{}",
        stderr_of(&output)
    );
    let _ = std::fs::remove_file(&out);
}

#[test]
fn a_bad_interval_names_the_flag_and_exits_2() {
    let out = temp_file("bad-interval.jsonl");
    let output = Command::new(workerprobe_path())
        .arg("record")
        .arg("--out")
        .arg(&out)
        .args(["--interval", "10ms"])
        .output()
        .expect("run workerprobe record");
    let stderr = stderr_of(&output);
    assert_eq!(output.status.code(), Some(2), "stderr: {stderr}");
    assert!(stderr.contains("--interval"), "{stderr}");
    assert!(stderr.contains("100ms minimum"), "{stderr}");
    assert!(!out.exists(), "a refused run made {}", out.display());
}

#[test]
fn empty_foreign_and_missing_files_are_refused_with_one_sentence() {
    let empty = temp_file("empty.jsonl");
    std::fs::write(&empty, "").expect("write");
    let foreign = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let missing = temp_file("missing.jsonl");
    let cases = [
        (empty.clone(), "is empty: it holds no recording"),
        (
            foreign,
            "is not a workerprobe recording (its first line is not a header)",
        ),
        (missing, "does not exist"),
    ];
    for (path, expected) in cases {
        let output = replay(&[path.to_str().expect("utf-8")]);
        let stderr = stderr_of(&output);
        // Bad input, like a bad flag value: exit 2 and one sentence (clap adds its
        // "try --help" line to a bad argument).
        assert_eq!(
            output.status.code(),
            Some(2),
            "{}: {stderr}",
            path.display()
        );
        let sentences = stderr
            .lines()
            .filter(|line| !line.trim().is_empty() && !line.contains("--help"))
            .count();
        assert_eq!(sentences, 1, "one sentence: {stderr}");
        assert!(stderr.contains(expected), "{}: {stderr}", path.display());
        // It never suggests recording over the file it refused.
        assert!(
            !stderr.contains(&format!("--out {}", path.display())),
            "suggests overwriting {}: {stderr}",
            path.display()
        );
        assert!(output.stdout.is_empty());
    }
    let _ = std::fs::remove_file(&empty);
}

#[test]
fn a_corrupt_line_is_skipped_and_counted() {
    require_root();
    let out = temp_file("corrupt.jsonl");
    let mut agent = start_record(&out, &["--interval", "200ms", "--duration", "1s"]);
    assert!(agent.wait().expect("wait").success());
    let text = std::fs::read_to_string(&out).expect("read");
    let mut lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 3, "{text}");
    let middle = lines.len() / 2;
    let cut = &lines[middle][..lines[middle].len() / 2];
    lines.insert(middle, cut);
    lines.insert(middle, "\u{1}\u{2} not json");
    std::fs::write(&out, lines.join("\n") + "\n").expect("write");

    let output = replay(&[out.to_str().expect("utf-8")]);
    let stderr = stderr_of(&output);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(
        stderr.trim(),
        format!("workerprobe: skipped 2 corrupt lines in {}", out.display())
    );
    assert!(String::from_utf8_lossy(&output.stdout).contains("workers active:"));
    let _ = std::fs::remove_file(&out);
}

/// Each line's moment on the merged timeline: its monotonic moment through its node's
/// latest run offset (wall − monotonic at the run's start), as `merge` places it.
fn timeline_ns(lines: &[serde_json::Value]) -> Vec<(String, String, i128)> {
    let mut offsets = std::collections::HashMap::new();
    let ns = |value: &serde_json::Value| i128::from(value.as_u64().expect("ns"));
    lines
        .iter()
        .map(|line| {
            let kind = line["type"].as_str().expect("type").to_owned();
            if kind == "header" {
                let node = line["node"]["name"].as_str().expect("name").to_owned();
                let run = &line["run_started"];
                let offset = ns(&run["wall_unix_ns"]) - ns(&run["monotonic_ns"]);
                offsets.insert(node.clone(), offset);
                return (kind, node, ns(&line["started"]["monotonic_ns"]) + offset);
            }
            let node = line["node"]
                .as_str()
                .expect("every merged line names its node");
            let moment = if kind == "clock" { "at" } else { "end" };
            let at = ns(&line[moment]["monotonic_ns"]) + offsets[node];
            (kind, node.to_owned(), at)
        })
        .collect()
}

#[test]
fn two_nodes_recordings_merge_into_one_timeline_with_each_nodes_workers_and_clock() {
    require_root();
    let pid = std::process::id();
    let (a_busy, a_short) = (
        TestCgroup::new("mrg-a-busy"),
        TestCgroup::new("mrg-a-short"),
    );
    let b_busy = TestCgroup::new("mrg-b-busy");
    let (a_out, b_out, fleet) = (
        temp_file("node-a.jsonl"),
        temp_file("node-b.jsonl"),
        temp_file("fleet.jsonl"),
    );
    // Two agents on this machine, each the agent of one "node" and its workers.
    let agent_a = start_record(
        &a_out,
        &[
            "--node-name",
            "node-a",
            "--interval",
            "200ms",
            "--workers",
            &format!("*workerprobe-test-{pid}-mrg-a-*"),
        ],
    );
    let agent_b = start_record(
        &b_out,
        &[
            "--node-name",
            "node-b",
            "--interval",
            "300ms",
            "--workers",
            &format!("*workerprobe-test-{pid}-mrg-b-*"),
        ],
    );
    let spins = [
        a_busy.spawn_workload(&["spin", "600", "1"]),
        b_busy.spawn_workload(&["spin", "400", "2"]),
        a_short.spawn_workload(&["spin", "50", "1"]),
    ];
    for spin in spins {
        assert!(spin.wait_with_output().expect("wait").status.success());
    }
    let usage_s = |cgroup: &TestCgroup| cgroup.cpu_stat().usage_usec as f64 / 1e6;
    let cpu_stat_s = [usage_s(&a_busy), usage_s(&b_busy), usage_s(&a_short)];
    let short_id = a_short.id;
    drop(a_short); // its cgroup goes: an exit line on node-a
    std::thread::sleep(Duration::from_millis(700));
    for agent in [agent_a, agent_b] {
        signal(&agent, libc::SIGINT);
        let mut agent = agent;
        assert!(agent.wait().expect("wait").success(), "record failed");
    }
    // node-b's clock as a node without time service would report it.
    let mut b_lines = read_lines(&b_out);
    b_lines[0]["node"]["clock"] = serde_json::json!(
        {"synchronized": false, "estimated_error_seconds": 0.0, "max_error_seconds": 16.0}
    );
    let b_text: String = b_lines.iter().map(|line| format!("{line}\n")).collect();
    std::fs::write(&b_out, b_text).expect("rewrite node-b's header");

    let merge = Command::new(workerprobe_path())
        .args([
            "merge",
            a_out.to_str().expect("utf-8"),
            b_out.to_str().expect("utf-8"),
        ])
        .arg("--out")
        .arg(&fleet)
        .output()
        .expect("run workerprobe merge");
    assert!(merge.status.success(), "{}", stderr_of(&merge));
    assert!(
        stderr_of(&merge).contains("of 2 nodes (node-a, node-b)"),
        "{}",
        stderr_of(&merge)
    );
    let (a_lines, merged) = (read_lines(&a_out), read_lines(&fleet));
    assert_eq!(
        merged.len(),
        a_lines.len() + b_lines.len(),
        "a line lost or added"
    );
    // Ticks, headers and clock readings ordered on one timeline (an exit line comes when
    // its node wrote it, a little after its worker ended), and each node's own lines in
    // their own order.
    let placed: Vec<_> = timeline_ns(&merged)
        .into_iter()
        .filter(|(kind, _, _)| kind != "exit")
        .collect();
    for pair in placed.windows(2) {
        assert!(
            pair[0].2 <= pair[1].2,
            "out of order: {:?} then {:?}",
            pair[0],
            pair[1]
        );
    }
    for (node, own) in [("node-a", &a_lines), ("node-b", &b_lines)] {
        let ours: Vec<&serde_json::Value> = merged
            .iter()
            .filter(|line| line["node"] == node || line["node"]["name"] == node)
            .collect();
        let theirs: Vec<&serde_json::Value> = own.iter().collect();
        let strip = |line: &serde_json::Value| {
            let mut line = line.clone();
            if line["type"] != "header" {
                line.as_object_mut().expect("object").remove("node");
            }
            line
        };
        assert_eq!(
            ours.iter().map(|line| strip(line)).collect::<Vec<_>>(),
            theirs.iter().map(|line| strip(line)).collect::<Vec<_>>(),
            "{node}'s lines are not its recording's"
        );
    }

    // The trace: a process per node, every worker once under its node, its CPU the
    // kernel's (cpu.stat) and its recording's last total.
    let trace_path = temp_file("fleet.json");
    let document: serde_json::Value =
        serde_json::from_str(&picture("trace", &fleet, &trace_path)).expect("json");
    let events = document["traceEvents"].as_array().expect("events");
    let process = |name: &str| {
        events
            .iter()
            .find(|event| {
                event["name"] == "process_name"
                    && event["args"]["name"]
                        .as_str()
                        .is_some_and(|text| text.starts_with(name))
            })
            .unwrap_or_else(|| panic!("no process {name}"))["pid"]
            .clone()
    };
    let (a_pid, b_pid) = (
        process("workerprobe node node-a"),
        process("workerprobe node node-b"),
    );
    assert_ne!(a_pid, b_pid);
    let last_total_s = |lines: &[serde_json::Value], id: u64| {
        lines
            .iter()
            .rev()
            .find(|line| line["type"] == "tick" && line["cgroup_id"] == id)
            .map(|line| line["totals"]["on_cpu_ns"].as_u64().expect("ns") as f64 / 1e9)
    };
    for (index, (cgroup_id, pid_of_node, lines)) in [
        (a_busy.id, &a_pid, &a_lines),
        (b_busy.id, &b_pid, &b_lines),
        (short_id, &a_pid, &a_lines),
    ]
    .into_iter()
    .enumerate()
    {
        let spans: Vec<&serde_json::Value> = events
            .iter()
            .filter(|event| event["ph"] == "X" && event["args"]["cgroup_id"] == cgroup_id)
            .collect();
        assert_eq!(
            spans.len(),
            1,
            "worker {cgroup_id} has {} life spans",
            spans.len()
        );
        assert_eq!(
            &spans[0]["pid"], pid_of_node,
            "worker {cgroup_id} under the wrong node"
        );
        let traced_s = spans[0]["args"]["cpu_seconds"].as_f64().expect("cpu");
        if let Some(recorded_s) = last_total_s(lines, cgroup_id) {
            assert!(
                (traced_s - recorded_s).abs() < 1e-6,
                "worker {cgroup_id}: {traced_s} s traced, {recorded_s} s in its recording"
            );
        }
        let kernel_s = cpu_stat_s[index];
        eprintln!("worker {cgroup_id}: {traced_s:.6} s traced, cpu.stat {kernel_s:.6} s");
        assert!(
            (traced_s - kernel_s).abs() <= kernel_s * 0.02 + 0.002,
            "worker {cgroup_id}: {traced_s} s traced, cpu.stat {kernel_s} s"
        );
    }

    // Replay takes the nodes' ticks in turn, each named by its node.
    let output = replay(&[fleet.to_str().expect("utf-8")]);
    assert!(output.status.success(), "{}", stderr_of(&output));
    let text = String::from_utf8_lossy(&output.stdout);
    let on = |node: &str| text.lines().filter(|line| line.ends_with(node)).count();
    assert!(on(" on node-a") > 0 && on(" on node-b") > 0, "{text}");

    // The report names both nodes and says how far their times may be off.
    let report_path = temp_file("fleet.html");
    let page = picture("report", &fleet, &report_path);
    assert!(
        page.contains("node node-a") && page.contains("node node-b"),
        "{page}"
    );
    assert!(
        page.contains("node-b ± 16.0 s (clock not synchronised)"),
        "the report does not say node-b's clock was unsynchronised"
    );
    assert_eq!(
        page.contains("node-a ± 16.0 s (clock not synchronised)"),
        !workerprobe_tests::kernel_clock_synchronized(),
        "the report's word on node-a's clock is not the kernel's"
    );
    for path in [&a_out, &b_out, &fleet, &trace_path, &report_path] {
        let _ = std::fs::remove_file(path);
    }
}

#[test]
fn the_time_between_two_appended_runs_is_shown_as_not_recorded() {
    require_root();
    let worker = TestCgroup::new("rec-gap");
    let out = temp_file("gap.jsonl");
    let pattern = format!("*workerprobe-test-{}-rec-gap", std::process::id());
    // Wakes every 50 ms, so it is active in every tick of both runs, at almost no CPU.
    let mut napper = worker.spawn_workload(&["nap", "100000", "50"]);
    for append in [false, true] {
        let mut args = vec![
            "--interval",
            "200ms",
            "--duration",
            "1s",
            "--workers",
            &pattern,
        ];
        if append {
            args.push("--append");
        }
        let agent = start_record(&out, &args);
        assert!(agent.wait_with_output().expect("wait").status.success());
        // No agent for a while: the worker runs on, unrecorded.
        std::thread::sleep(Duration::from_millis(if append { 0 } else { 800 }));
    }
    let _ = napper.kill();
    let _ = napper.wait();
    let lines = read_lines(&out);
    let ns = |line: &serde_json::Value, pointer: &str| {
        line.pointer(pointer)
            .and_then(|v| v.as_u64())
            .expect(pointer) as f64
            / 1e9
    };
    let ticks: Vec<&serde_json::Value> = lines.iter().filter(|l| l["type"] == "tick").collect();
    let headers: Vec<&serde_json::Value> = lines.iter().filter(|l| l["type"] == "header").collect();
    assert_eq!(headers.len(), 2, "two runs");
    // The gap as the recording has it: from the last moment the first run wrote (a tick's
    // end, a clock reading) to the second run's start.
    let second_at = lines
        .iter()
        .position(|line| line["type"] == "header" && line["part"] == 0 && line != &lines[0])
        .expect("the second run's header");
    let first_end = lines[..second_at]
        .iter()
        .filter_map(|line| match line["type"].as_str() {
            Some("tick") => Some(ns(line, "/end/monotonic_ns")),
            Some("clock") => Some(ns(line, "/at/monotonic_ns")),
            _ => None,
        })
        .fold(f64::MIN, f64::max);
    let resumed = ns(headers[1], "/started/monotonic_ns");
    let origin = ns(ticks[0], "/start/monotonic_ns");
    let (gap_from, gap_to) = (first_end - origin, resumed - origin);
    assert!(gap_to - gap_from >= 0.8, "a gap of {} s", gap_to - gap_from);

    let report_path = temp_file("gap.html");
    let page = picture("report", &out, &report_path);
    let row = page
        .split("<dt>not recorded</dt><dd>")
        .nth(1)
        .and_then(|rest| rest.split("</dd>").next())
        .expect("a not recorded row");
    // The picture's stretch is the recording's, to the ms it prints.
    let (from, to) = row
        .split_once(' ')
        .and_then(|(span, _)| span.split_once("s–"))
        .map(|(from, to)| {
            (
                from.parse::<f64>().expect("from"),
                to.trim_end_matches('s').parse::<f64>().expect("to"),
            )
        })
        .unwrap_or_else(|| panic!("no stretch in {row:?}"));
    assert!(
        (from - gap_from).abs() < 0.002 && (to - gap_to).abs() < 0.002,
        "shown {from}–{to} s, recorded {gap_from}–{gap_to} s"
    );
    let _ = std::fs::remove_file(&out);
    let _ = std::fs::remove_file(&report_path);
}
