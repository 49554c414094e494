//! Real frameworks from PyPI (installed by `cargo xtask setup` into target/py/venv): a
//! Lithops map on the localhost backend, each call named by the `lithops` preset, against
//! what the calls counted and what wait4 says of each call's runner (Lithops starts it
//! through a wrapper that waits for it); a Dask LocalCluster's worker processes against
//! their tasks and the cgroup's cpu.stat.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde_json::Value;
use workerprobe::cgroup;
use workerprobe_tests::{TestCgroup, json_lines, require_root, watch_json_while, workload_path};

/// The virtual environment `cargo xtask setup` makes, next to the test binaries' target dir.
fn venv_python() -> PathBuf {
    let target = workload_path()
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf();
    let python = target.join("py").join("venv").join("bin").join("python");
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask setup`, which installs the frameworks these tests drive",
        python.display()
    );
    python
}

fn python_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python")
}

/// One framework at a time: each compares a process's CPU with what the process measured of
/// itself, and the work a framework does after that measurement (result pickling, teardown)
/// grows when the other framework's workers crowd the two CPUs.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn each_lithops_call_gets_its_own_record_with_its_true_cpu_and_bytes() {
    require_root();
    let _alone = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    const CALLS: usize = 8;
    const DOWNLOAD: u64 = 5_000_000;
    let python = venv_python();
    let rusage_dir = std::env::temp_dir().join(format!("wp-lithops-rusage-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&rusage_dir);
    std::fs::create_dir_all(&rusage_dir).expect("rusage dir");

    // Lithops starts each runner as `RUNTIME runner.py run_job TASK`: the runtime is a
    // wrapper that runs the venv's Python as its child and writes its wait4 rusage.
    let wrapper = rusage_dir.join("python-measured");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec {} rusage-of {} {} \"$@\"\n",
            workload_path().display(),
            rusage_dir.display(),
            python.display()
        ),
    )
    .expect("write the wrapper");
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod the wrapper");
    let mut driver = None;
    let lines = watch_json_while(&["--process", "lithops"], || {
        driver = Some(
            Command::new(&python)
                .arg(python_dir().join("lithops_map.py"))
                .args([CALLS.to_string(), "0.3".into(), DOWNLOAD.to_string()])
                .env("WP_LITHOPS_RUNTIME", &wrapper)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .output()
                .expect("run the Lithops map"),
        );
    });
    let driver = driver.expect("the Lithops map ran");
    assert!(
        driver.status.success(),
        "the Lithops map failed: {}",
        String::from_utf8_lossy(&driver.stderr)
    );

    // Lithops prints a blank line of its own.
    let calls = json_lines(&String::from_utf8_lossy(&driver.stdout));
    assert_eq!(calls.len(), CALLS);
    // What wait4 said of each call's runner, by its command line.
    let rusage: HashMap<String, Value> = std::fs::read_dir(&rusage_dir)
        .expect("rusage dir")
        .filter_map(|entry| {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|ext| ext != "json") {
                return None;
            }
            let text = std::fs::read_to_string(path).expect("read");
            let value: Value = serde_json::from_str(&text).expect("rusage JSON");
            let args = value["args"].as_str().expect("args").to_string();
            args.contains(" run_job ").then_some((args, value))
        })
        .collect();
    assert_eq!(rusage.len(), CALLS, "one rusage record per runner");

    let exit_rss_measured = workerprobe_tests::exit_tracepoint_passes_group_dead();
    let key = |value: &Value| {
        (
            value["executor_id"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            value["job_id"].as_str().unwrap_or_default().to_string(),
            value["call_id"].as_str().unwrap_or_default().to_string(),
        )
    };
    let records: HashMap<_, &Value> = lines
        .iter()
        .filter(|line| line["type"] == "lithops_call")
        .map(|line| (key(line), line))
        .collect();
    assert_eq!(records.len(), CALLS, "one record per call: {lines:?}");
    for call in &calls {
        let (executor, job, call_id) = key(call);
        let record = records
            .get(&(executor.clone(), job.clone(), call_id.clone()))
            .unwrap_or_else(|| panic!("no record for {executor}/{job}/{call_id}"));
        let result = &call["result"];
        // Bytes: exactly what the call's processes received (its download, headers and all).
        assert_eq!(
            record["worker_func_recv_net_io"].as_u64(),
            result["received"].as_u64(),
            "{record}"
        );
        assert!(result["received"].as_u64().unwrap() > DOWNLOAD);
        // CPU: the whole tree's rusage: the runner's as the wrapper reaped it (its function
        // process included: it waits for it) and the wrapper's own since its fork, which is
        // mostly a few milliseconds but was once 24 ms (its time in the Python parent's image
        // between fork and exec).
        let task = format!("{executor}-{job}/{call_id}.task");
        let runner = rusage
            .iter()
            .find(|(args, _)| args.ends_with(&task))
            .map(|(_, value)| value)
            .unwrap_or_else(|| panic!("no rusage for {task}: {rusage:?}"));
        let kernel_s = runner["cpu_s"].as_f64().unwrap() + runner["own_cpu_s"].as_f64().unwrap();
        let ours_s = record["worker_func_cpu_time"].as_f64().unwrap();
        assert!(
            (ours_s - kernel_s).abs() <= kernel_s * 0.02,
            "call {call_id}: CPU {ours_s:.6} s vs the tree's rusage {kernel_s:.6} s: {record}"
        );
        assert_eq!(
            record["processes"], 3,
            "wrapper, runner, function: {record}"
        );
        // Per core, % of the call's wall time: each within a core's 100%, together the CPU.
        let usage = record["worker_func_cpu_usage"]
            .as_array()
            .unwrap_or_else(|| panic!("no per-core use: {record}"));
        assert!(
            usage
                .iter()
                .all(|core| (0.0..=100.0).contains(&core.as_f64().unwrap()))
        );
        let user = record["worker_func_cpu_user_time"].as_f64().unwrap();
        let system = record["worker_func_cpu_system_time"].as_f64().unwrap();
        assert!((user + system - ours_s).abs() < 1e-6);
        // The function's own process: what the function measured of its process.
        assert_eq!(record["function_pid"], result["pid"], "{record}");
        // Its resident set as it ended: at most its peak, where the kernel tells it.
        let peak = record["worker_peak_memory_end"].as_u64().unwrap();
        match record["worker_func_rss"].as_u64() {
            Some(rss) => {
                assert!(exit_rss_measured, "{record}");
                assert!(rss > 0 && rss <= peak, "{record}");
            }
            None => assert!(!exit_rss_measured, "{record}"),
        }
        let function_s = record["function_cpu_time"].as_f64().unwrap();
        let measured_s = result["process_cpu_s"].as_f64().unwrap();
        // The function reads its process's CPU before it returns; the process then still
        // sends its result and exits, which ours counts too: 4 to 6 ms on this machine, once
        // 6.4 ms (2.05%) past a bound of 2% alone. A wrong process or a lost slice would be
        // off by far more.
        const AFTER_THE_READING_S: f64 = 0.010;
        assert!(
            function_s >= measured_s * 0.98
                && function_s <= measured_s * 1.02 + AFTER_THE_READING_S,
            "call {call_id}: function process CPU {function_s:.6} s vs its process_time {measured_s:.6} s"
        );
        eprintln!(
            "call {executor}/{job}/{call_id}: received {} B; CPU {ours_s:.4} s (rusage {kernel_s:.4} s); function {function_s:.4} s (process_time {measured_s:.4} s); Lithops said recv {} B, user {} s",
            record["worker_func_recv_net_io"],
            call["stats"]["worker_func_recv_net_io"],
            call["stats"]["worker_func_cpu_user_time"],
        );
    }
    let _ = std::fs::remove_dir_all(&rusage_dir);
}

#[test]
fn each_dask_worker_process_gets_its_cpu_and_bytes_and_they_add_up_to_the_cgroup() {
    require_root();
    let _alone = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    const TASKS: u64 = 8;
    const DOWNLOAD: u64 = 5_000_000;
    let python = venv_python();
    let cgroup = TestCgroup::new("dask");
    let path = format!("/{}", cgroup.name());
    // The downloads' server gets a port known before the agent starts, so a rule can name it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let downloads_rule = format!("--endpoint=downloads=127.0.0.1:{port}");
    let mut command = Command::new(&python);
    command
        .arg(python_dir().join("dask_map.py"))
        .args([
            "2".to_string(),
            TASKS.to_string(),
            "0.3".into(),
            DOWNLOAD.to_string(),
            port.to_string(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut driver = None;
    let lines = watch_json_while(
        &["--processes", "--workers", &path, &downloads_rule],
        || {
            driver = Some(
                cgroup::spawn_in_cgroup(&mut command, &cgroup.dir)
                    .expect("start the Dask client")
                    .wait_with_output()
                    .expect("wait for the Dask client"),
            );
        },
    );
    let driver = driver.expect("the Dask run ran");
    assert!(
        driver.status.success(),
        "the Dask run failed: {}",
        String::from_utf8_lossy(&driver.stderr)
    );
    let usage_usec = cgroup.cpu_stat().usage_usec;
    let told = json_lines(&String::from_utf8_lossy(&driver.stdout));
    let (tasks, pids) = told.split_at(told.len() - 1);
    assert_eq!(tasks.len() as u64, TASKS);
    let processes: Vec<&Value> = lines
        .iter()
        .filter(|line| line["type"] == "process_exit" && line["path"] == path.as_str())
        .collect();
    // Every process that ran in the cgroup ended in it: together they are its cpu.stat.
    let summed_usec = processes
        .iter()
        .map(|process| process["counters"]["cpu_ns"].as_u64().unwrap())
        .sum::<u64>()
        / 1_000;
    assert!(
        summed_usec.abs_diff(usage_usec) * 100 <= usage_usec,
        "{} processes sum to {summed_usec} µs, the cgroup's cpu.stat says {usage_usec} µs",
        processes.len()
    );
    for pid in pids[0]["worker_pids"].as_array().expect("worker pids") {
        let worker = processes
            .iter()
            .find(|process| process["pid"] == *pid)
            .unwrap_or_else(|| panic!("no summary of Dask worker {pid}"));
        let mine: Vec<&Value> = tasks.iter().filter(|task| task["pid"] == *pid).collect();
        let downloaded: u64 = mine
            .iter()
            .map(|task| task["received"].as_u64().unwrap())
            .sum();
        let burned: f64 = mine
            .iter()
            .map(|task| task["burned_s"].as_f64().unwrap())
            .sum();
        let requested: u64 = mine.iter().map(|task| task["sent"].as_u64().unwrap()).sum();
        let received = worker["counters"]["received_bytes"].as_u64().unwrap();
        let cpu_s = worker["counters"]["cpu_ns"].as_u64().unwrap() as f64 / 1e9;
        // By endpoint, the downloads are exactly what the tasks counted, apart from the
        // cluster's own traffic, and the endpoints add up to the totals.
        let endpoints = worker["endpoints"].as_array().expect("endpoints");
        let downloads = endpoints
            .iter()
            .find(|e| e["endpoint"] == "downloads")
            .unwrap_or_else(|| panic!("worker {pid}: no downloads endpoint: {worker}"));
        assert_eq!(
            downloads["received_bytes"].as_u64(),
            Some(downloaded),
            "{worker}"
        );
        assert_eq!(
            downloads["sent_bytes"].as_u64(),
            Some(requested),
            "{worker}"
        );
        let over_endpoints =
            |field: &str| -> u64 { endpoints.iter().map(|e| e[field].as_u64().unwrap()).sum() };
        assert_eq!(over_endpoints("received_bytes"), received, "{worker}");
        assert_eq!(
            over_endpoints("sent_bytes"),
            worker["counters"]["sent_bytes"].as_u64().unwrap(),
            "{worker}"
        );
        assert!(
            received >= downloaded,
            "worker {pid}: received {received} < {downloaded}"
        );
        assert!(
            cpu_s >= burned,
            "worker {pid}: CPU {cpu_s} s < its tasks' {burned} s"
        );
        eprintln!(
            "Dask worker {pid}: {} tasks; CPU {cpu_s:.3} s (tasks {burned:.3} s); received {received} B ({downloaded} B from the downloads endpoint, exactly the tasks' count; {} B the cluster's own, on other endpoints)",
            mine.len(),
            received - downloaded
        );
    }
    eprintln!(
        "{} processes in the cgroup: {summed_usec} µs, cpu.stat {usage_usec} µs",
        processes.len()
    );
}
