//! Workers as first-class: exit summaries from the kernel's cgroup lifecycle, names from
//! known layouts, and `workerprobe exec`.

use std::{
    io::{BufRead as _, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use workerprobe::cgroup;
use workerprobe_tests::{
    KillOnDrop, TestCgroup, field, read_first_json_line, require_root, start_agent, temp_path,
    wait_json, workerprobe_path, workload_path,
};

/// A running `workerprobe watch --json`, its output read as it comes (a full pipe would
/// stall it).
struct Watch {
    agent: Child,
    lines: std::thread::JoinHandle<Vec<String>>,
}

/// Starts `workerprobe watch --json` and returns once it is attached.
fn start_watch(extra: &[&str]) -> Watch {
    let args: Vec<&str> = ["watch", "--json", "--duration", "120s"]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let mut agent = start_agent(&args, "attached");
    let stdout = BufReader::new(agent.stdout.take().expect("stdout"));
    let lines = std::thread::spawn(move || stdout.lines().map_while(Result::ok).collect());
    Watch { agent, lines }
}

/// Stops a watch (SIGINT: it settles and prints the last exits) and returns its JSON lines.
fn stop_watch(watch: Watch) -> Vec<serde_json::Value> {
    let Watch { mut agent, lines } = watch;
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(agent.id() as i32, libc::SIGINT) };
    let status = agent.wait().expect("wait for watch");
    assert!(status.success(), "watch failed: {status:?}");
    lines
        .join()
        .expect("reader")
        .iter()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|err| panic!("{line:?}: {err}")))
        .collect()
}

fn exits<'a>(lines: &'a [serde_json::Value], path_prefix: &str) -> Vec<&'a serde_json::Value> {
    lines
        .iter()
        .filter(|line| line["type"] == "exit")
        .filter(|line| {
            line["path"]
                .as_str()
                .is_some_and(|p| p.starts_with(path_prefix))
        })
        .collect()
}

#[test]
fn five_hundred_short_workers_give_five_hundred_summaries() {
    require_root();
    let mount = cgroup::find_cgroup2_mount().expect("cgroup2");
    let prefix = format!("/wp500-{}-", std::process::id());
    let agent = start_watch(&["--workers", &format!("{prefix}*")]);
    const WORKERS: usize = 500;
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= WORKERS {
                        break;
                    }
                    let dir = mount.join(format!("{}{index}", prefix.trim_start_matches('/')));
                    std::fs::create_dir(&dir).expect("mkdir worker");
                    // About 50 ms of life, 20 of them computing.
                    let mut command = Command::new(workload_path());
                    command.args(["life", "25"]);
                    let status = cgroup::spawn_in_cgroup(&mut command, &dir)
                        .expect("spawn")
                        .wait()
                        .expect("wait");
                    assert!(status.success());
                    cgroup::remove_cgroup(&dir).expect("rmdir worker");
                }
            });
        }
    });
    let lines = stop_watch(agent);
    assert_eq!(lines[0]["type"], "header");
    assert!(
        lines[0]["node"]["cpus"]
            .as_u64()
            .is_some_and(|cpus| cpus > 0)
    );
    let summaries = exits(&lines, &prefix);
    if summaries.len() != WORKERS {
        let mut seen: Vec<&str> = summaries
            .iter()
            .filter_map(|s| s["path"].as_str())
            .collect();
        seen.sort_unstable();
        eprintln!("{} lines; summaries for {seen:?}", lines.len());
    }
    assert_eq!(summaries.len(), WORKERS, "one summary per worker");
    let mut ids: Vec<u64> = summaries
        .iter()
        .map(|s| s["cgroup_id"].as_u64().expect("id"))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), WORKERS, "no worker summarised twice");
    for summary in &summaries {
        let cpu = summary["cpu"]["total_seconds"].as_f64().expect("cpu");
        assert!(cpu > 0.0, "a worker with no CPU: {summary}");
        assert_eq!(summary["start_observed"], true);
        assert!(summary["wall_seconds"].as_f64().expect("wall") > 0.0);
        assert!(
            summary["lithops"]["worker_func_cpu_total_time"]
                .as_f64()
                .expect("lithops")
                > 0.0
        );
    }
}

#[test]
fn known_layouts_are_named() {
    require_root();
    let mount = cgroup::find_cgroup2_mount().expect("cgroup2");
    let root = format!("wpnames-{}", std::process::id());
    let container = "4f3a9c1e7b2d4f3a9c1e7b2d4f3a9c1e7b2d4f3a9c1e7b2d4f3a9c1e7b2d4f3a";
    let pod = "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d";
    let leaves = [
        format!("{root}/system.slice/docker-{container}.scope"),
        format!(
            "{root}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{container}.scope",
            pod.replace('-', "_")
        ),
        format!("{root}/system.slice/billing-worker.service"),
    ];
    let agent = start_watch(&["--workers", &format!("/{root}/**")]);
    for leaf in &leaves {
        let dir = mount.join(leaf);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let mut command = Command::new(workload_path());
        command.args(["spin", "20", "1"]);
        assert!(
            cgroup::spawn_in_cgroup(&mut command, &dir)
                .expect("spawn")
                .wait()
                .expect("wait")
                .success()
        );
        cgroup::remove_cgroup(&dir).expect("rmdir");
    }
    let lines = stop_watch(agent);
    // Remove the parents, deepest first.
    let mut parents: Vec<_> = leaves
        .iter()
        .flat_map(|leaf| {
            Path::new(leaf)
                .ancestors()
                .skip(1)
                .map(Path::to_path_buf)
                .collect::<Vec<_>>()
        })
        .filter(|p| !p.as_os_str().is_empty())
        .collect();
    parents.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    parents.dedup();
    for parent in parents {
        let _ = std::fs::remove_dir(mount.join(parent));
    }
    let find = |suffix: &str| {
        exits(&lines, &format!("/{root}"))
            .into_iter()
            .find(|s| s["path"].as_str().is_some_and(|p| p.ends_with(suffix)))
            .unwrap_or_else(|| panic!("no summary for …{suffix} in {lines:?}"))
            .clone()
    };
    let docker = find(&format!("system.slice/docker-{container}.scope"));
    assert_eq!(docker["kind"], "docker");
    assert_eq!(docker["ids"]["container_id"], container);
    assert_eq!(docker["name"], &container[..12]);
    let kube = find(&format!("cri-containerd-{container}.scope"));
    assert_eq!(kube["kind"], "kubernetes");
    assert_eq!(kube["ids"]["pod_uid"], pod);
    assert_eq!(kube["ids"]["container_id"], container);
    assert_eq!(kube["ids"]["qos"], "burstable");
    let unit = find("billing-worker.service");
    assert_eq!(unit["kind"], "systemd_service");
    assert_eq!(unit["name"], "billing-worker");
    assert_eq!(unit["ids"]["unit"], "billing-worker.service");
}

/// Runs `workerprobe exec --json --output FILE -- args…`; returns its status, its stdout and
/// the summary.
fn exec(args: &[&str]) -> (std::process::ExitStatus, String, serde_json::Value) {
    exec_with(&[], args)
}

/// [`exec`] with more of exec's options (`flags`) before the command.
fn exec_with(
    flags: &[&str],
    args: &[&str],
) -> (std::process::ExitStatus, String, serde_json::Value) {
    let summary_file = std::env::temp_dir().join(format!("wp-exec-{}.json", std::process::id()));
    let output = Command::new(workerprobe_path())
        .arg("exec")
        .arg("--json")
        .args(flags)
        .arg("--output")
        .arg(&summary_file)
        .arg("--")
        .args(args)
        .output()
        .expect("run workerprobe exec");
    let text = std::fs::read_to_string(&summary_file).unwrap_or_default();
    let _ = std::fs::remove_file(&summary_file);
    let summary = serde_json::from_str(text.trim()).unwrap_or(serde_json::Value::Null);
    (
        output.status,
        String::from_utf8_lossy(&output.stdout).into_owned(),
        summary,
    )
}

/// `exec` with CPU time alone (`--programs cpu,workers`): the kernel's own accounting read by
/// the cgroup iterator, ended before the command's cgroup is removed, equals the cgroup's share
/// of its parent's `cpu.stat`; context switches are not measured (null, never 0).
#[test]
fn exec_with_cpu_alone_reports_the_kernels_cpu_and_no_switches() {
    require_root();
    let mount = cgroup::find_cgroup2_mount().expect("cgroup2");
    let parent = mount.join("workerprobe");
    std::fs::create_dir_all(&parent).expect("exec parent");
    let before = cgroup::read_cpu_stat(&parent).expect("cpu.stat").usage_usec;
    let workload = workload_path().display().to_string();
    let (status, _, summary) = exec_with(
        &["--programs", "cpu,workers"],
        &[&workload, "spin", "300", "2"],
    );
    let after = cgroup::read_cpu_stat(&parent).expect("cpu.stat").usage_usec;
    assert!(status.success(), "exec failed: {status:?}");
    let kernel_s = (after - before) as f64 / 1e6;
    let ours_s = summary["cpu"]["total_seconds"].as_f64().expect("cpu");
    eprintln!("exec, cpu alone: ours {ours_s}s, cpu.stat {kernel_s}s");
    assert!(kernel_s > 0.2, "the command barely ran: {kernel_s}s");
    assert!(
        (ours_s - kernel_s).abs() <= kernel_s * 0.005,
        "CPU {ours_s}s vs cpu.stat {kernel_s}s"
    );
    assert!(
        summary["context_switches"].is_null(),
        "switches are not measured: {summary}"
    );
}

#[test]
fn exec_reports_cpu_like_cpu_stat_and_exact_bytes() {
    require_root();
    let mount = cgroup::find_cgroup2_mount().expect("cgroup2");
    // Another agent attached at the same time must not matter.
    let other = Command::new(workerprobe_path())
        .args(["snapshot", "--duration", "30s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start another agent");
    let receiver = TestCgroup::new("exec-recv");
    let mut recv = receiver.spawn_workload(&["recv", "tcp", "127.0.0.1:0", "0"]);
    let addr = read_first_json_line(&mut recv)["addr"]
        .as_str()
        .expect("addr")
        .to_string();
    // exec's cgroups live under <cgroup2>/workerprobe, whose cpu.stat keeps its removed
    // children's usage: the kernel's own figure for the command.
    let parent = mount.join("workerprobe");
    std::fs::create_dir_all(&parent).expect("exec parent");
    let before = cgroup::read_cpu_stat(&parent).expect("cpu.stat").usage_usec;
    let script = format!(
        "{w} spin 400 2 && {w} send tcp {addr} 30000000 1000,65536,4096",
        w = workload_path().display()
    );
    let (status, stdout, summary) = exec(&["sh", "-c", &script]);
    let after = cgroup::read_cpu_stat(&parent).expect("cpu.stat").usage_usec;
    let received = wait_json(recv);
    let mut other = other;
    let _ = other.kill();
    let _ = other.wait();
    assert!(status.success(), "exec failed: {status:?}");
    let sent: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("workload output")).expect("json");
    let kernel_s = (after - before) as f64 / 1e6;
    let ours_s = summary["cpu"]["total_seconds"].as_f64().expect("cpu");
    eprintln!("exec: ours {ours_s}s, cpu.stat {kernel_s}s; summary {summary}");
    assert!(kernel_s > 0.2, "the command barely ran: {kernel_s}s");
    assert!(
        (ours_s - kernel_s).abs() <= kernel_s * 0.02,
        "CPU {ours_s}s vs cpu.stat {kernel_s}s"
    );
    assert_eq!(
        summary["net"]["sent_bytes"].as_u64(),
        Some(field(&sent, "sent_bytes"))
    );
    assert_eq!(
        summary["net"]["sent_calls"].as_u64(),
        Some(field(&sent, "sent_calls"))
    );
    // Per family, the same four figures in the same shape as a tick line and a snapshot.
    assert_eq!(
        summary["net"]["families"]["ipv4"]["sent_bytes"].as_u64(),
        Some(field(&sent, "sent_bytes"))
    );
    assert_eq!(
        summary["net"]["families"]["ipv4"]["sent_calls"].as_u64(),
        Some(field(&sent, "sent_calls"))
    );
    assert_eq!(
        field(&received, "received_bytes"),
        field(&sent, "sent_bytes")
    );
    assert_eq!(
        summary["lithops"]["worker_func_sent_net_io"].as_u64(),
        Some(field(&sent, "sent_bytes"))
    );
    assert_eq!(summary["exec"]["exit_code"], 0);
    assert_eq!(summary["kind"], "exec");
    let per_cpu: f64 = summary["cpu"]["per_cpu_seconds"]
        .as_array()
        .expect("per cpu")
        .iter()
        .map(|v| v.as_f64().expect("f64"))
        .sum();
    assert!((per_cpu - ours_s).abs() < 1e-6);
    assert!(
        summary["memory"]["peak_bytes"]
            .as_u64()
            .is_some_and(|peak| peak > 0),
        "{summary}"
    );
    // Lithops' own name for the peak at the call's end.
    assert_eq!(
        summary["lithops"]["worker_peak_memory_end"],
        summary["memory"]["peak_bytes"]
    );
    assert!(summary["lithops"].get("worker_peak_memory").is_none());
    // Where cgroup2 has the memory controller (pure cgroup2 hosts), exec turns it on for its
    // cgroups and the peak is the kernel's own memory.peak; on hybrid hosts, the v1 cgroup's.
    let cgroup2_memory = cgroup::read_controllers(&mount.join("cgroup.controllers"))
        .iter()
        .any(|c| c == "memory");
    let expected = if cgroup2_memory { "cgroup2" } else { "cgroup1" };
    assert_eq!(summary["memory"]["source"], expected, "{summary}");
    assert_no_exec_cgroups_left(&mount);
}

#[test]
fn exec_passes_exit_codes_and_signals_through() {
    require_root();
    let mount = cgroup::find_cgroup2_mount().expect("cgroup2");
    // What an agent killed with SIGKILL leaves: the next exec removes it.
    let mut gone = Command::new("true").spawn().expect("true");
    let gone_pid = gone.id();
    gone.wait().expect("true");
    let abandoned = mount.join(format!("workerprobe/exec-{gone_pid}-abandoned"));
    std::fs::create_dir_all(&abandoned).expect("make an abandoned exec cgroup");
    let (status, _, summary) = exec(&["true"]);
    assert_eq!(status.code(), Some(0));
    assert!(
        !abandoned.exists(),
        "exec left {} behind",
        abandoned.display()
    );
    assert_eq!(summary["exec"]["exit_code"], 0);
    let (status, _, summary) = exec(&["sh", "-c", "exit 3"]);
    assert_eq!(status.code(), Some(3));
    assert_eq!(summary["exec"]["exit_code"], 3);
    let (status, _, summary) = exec(&["sh", "-c", "kill -9 $$"]);
    assert_eq!(status.code(), Some(128 + 9));
    assert_eq!(summary["exec"]["signal"], 9);
    let (status, _, _) = exec(&["/nonexistent/command"]);
    assert_eq!(status.code(), Some(127));
    assert_no_exec_cgroups_left(&mount);
}

/// Fails on an exec cgroup whose agent has ended: each agent removes its own, and sweeps
/// those of agents killed before they could.
fn assert_no_exec_cgroups_left(mount: &Path) {
    let left: Vec<_> = std::fs::read_dir(mount.join("workerprobe"))
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| {
                    let agent = name
                        .strip_prefix("exec-")
                        .and_then(|rest| rest.split_once('-'))
                        .map(|(pid, _)| pid.to_owned());
                    // Agents of tests running alongside are still at work.
                    agent.is_some_and(|pid| !Path::new("/proc").join(pid).exists())
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "stray exec cgroups: {left:?}");
}

fn exec_spawn(args: &[&str], summary: &Path) -> std::process::Child {
    Command::new(workerprobe_path())
        .arg("exec")
        .arg("--json")
        .arg("--output")
        .arg(summary)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start workerprobe exec")
}

#[test]
fn sigterm_reaches_the_command_and_the_summary_is_still_written() {
    require_root();
    let mount = cgroup::find_cgroup2_mount().expect("cgroup2");
    let summary_path = temp_path("workers", "sigterm.json");
    let workload = workload_path();
    // Ten seconds of naps: the signal ends it.
    let agent = exec_spawn(
        &["--", workload.to_str().expect("path"), "nap", "100", "100"],
        &summary_path,
    );
    // Once the command runs in its cgroup.
    let deadline = Instant::now() + Duration::from_secs(120);
    while !exec_cgroup_has_processes(&mount, agent.id()) {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    let output = agent.wait_with_output().expect("wait for exec");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(128 + 15), "stderr: {stderr}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary_path).expect("summary"))
            .expect("JSON");
    assert_eq!(summary["exec"]["signal"], 15, "{summary}");
    let _ = std::fs::remove_file(&summary_path);
    assert_no_exec_cgroups_left(&mount);
}

#[test]
fn what_the_command_leaves_running_is_waited_for_and_counted() {
    require_root();
    let mount = cgroup::find_cgroup2_mount().expect("cgroup2");
    let summary_path = temp_path("workers", "linger.json");
    let workload = workload_path();
    // The shell exits at once; its background spinner runs 0.4 s of CPU after it.
    let script = format!("({} spin 400 1 > /dev/null &); exit 0", workload.display());
    let output = exec_spawn(&["--", "sh", "-c", &script], &summary_path)
        .wait_with_output()
        .expect("exec");
    assert_eq!(output.status.code(), Some(0));
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary_path).expect("summary"))
            .expect("JSON");
    let cpu = summary["cpu"]["total_seconds"].as_f64().expect("cpu");
    assert!(cpu >= 0.39, "the leftover's CPU is missing: {cpu}s");
    let _ = std::fs::remove_file(&summary_path);
    assert_no_exec_cgroups_left(&mount);

    // Past --linger, what is left is named and killed, and the cgroup still goes.
    let script = format!("({} nap 100 100 > /dev/null &); exit 0", workload.display());
    let output = exec_spawn(&["--linger", "1", "--", "sh", "-c", &script], &summary_path)
        .wait_with_output()
        .expect("exec");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "stderr: {stderr}");
    assert!(
        stderr.contains("outlived the command by --linger 1s") && stderr.contains("wp-workload"),
        "{stderr}"
    );
    let _ = std::fs::remove_file(&summary_path);
    assert_no_exec_cgroups_left(&mount);
}

/// Whether the exec agent `agent_pid` has its command running in its cgroup.
fn exec_cgroup_has_processes(mount: &Path, agent_pid: u32) -> bool {
    std::fs::read_dir(mount.join("workerprobe"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("exec-{agent_pid}-"))
        })
        .any(|e| {
            std::fs::read_to_string(e.path().join("cgroup.procs"))
                .is_ok_and(|procs| !procs.trim().is_empty())
        })
}

/// Runs `command` in `dir` and reaps it with wait4, for the kernel's own `ru_maxrss` (bytes).
#[expect(clippy::zombie_processes, reason = "reaped by wait4, for its rusage")]
fn run_for_max_rss(command: &mut Command, dir: &Path) -> u64 {
    command.stdout(Stdio::null());
    let child = cgroup::spawn_in_cgroup(command, dir).expect("spawn");
    let mut status = 0;
    // SAFETY: zeroed rusage is valid; wait4 on our own child fills it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let reaped = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(reaped, child.id() as i32, "wait4");
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    usage.ru_maxrss as u64 * 1024
}

#[test]
fn a_worker_shorter_than_a_sample_has_its_memory_peak() {
    require_root();
    let mount = cgroup::find_cgroup2_mount().expect("cgroup2");
    let prefix = format!("/wp-mem-{}-", std::process::id());
    let agent = start_watch(&["--workers", &format!("{prefix}*")]);
    let dir = mount.join(format!("{}short", prefix.trim_start_matches('/')));
    std::fs::create_dir(&dir).expect("mkdir worker");
    // 48 MiB touched, then gone at once: no sample of the agent's sees it alive.
    let max_rss_bytes = run_for_max_rss(
        Command::new(workload_path()).args(["hold", "48", "0"]),
        &dir,
    );
    // Where the worker has a memory controller of its own (pure cgroup2 hosts), the kernel's
    // memory.peak, read before the directory goes.
    let cgroup_peak_bytes: Option<u64> = std::fs::read_to_string(dir.join("memory.peak"))
        .ok()
        .and_then(|text| text.trim().parse().ok());
    cgroup::remove_cgroup(&dir).expect("rmdir worker");
    let lines = stop_watch(agent);
    let summaries = exits(&lines, &prefix);
    assert_eq!(summaries.len(), 1, "{lines:?}");
    let memory = &summaries[0]["memory"];
    eprintln!(
        "short worker: memory {memory}; its process's ru_maxrss {max_rss_bytes} B, memory.peak {cgroup_peak_bytes:?}"
    );
    assert!(
        max_rss_bytes >= 48 << 20,
        "the workload held less than it should"
    );
    match cgroup_peak_bytes {
        Some(peak) => {
            assert_eq!(memory["source"], "cgroup2");
            assert_eq!(memory["peak_bytes"].as_u64(), Some(peak));
        }
        None => {
            assert_eq!(memory["source"], "process_max_rss");
            assert_eq!(memory["peak_bytes"].as_u64(), Some(max_rss_bytes));
        }
    }
    assert_eq!(
        summaries[0]["lithops"]["worker_peak_memory_end"],
        memory["peak_bytes"]
    );
}

/// The worker with this cgroup id in a snapshot document, if there.
fn snapshot_worker(document: &serde_json::Value, id: u64) -> Option<&serde_json::Value> {
    document["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .find(|worker| worker["cgroup_id"] == id)
}

#[test]
fn a_parent_with_no_threads_of_its_own_is_a_worker_at_its_depth_summing_its_children() {
    require_root();
    let parent = TestCgroup::new("tree");
    let (left, right) = (parent.child("left"), parent.child("right"));
    // The test cgroups sit one level below the cgroup2 root.
    let folded = start_agent(
        &["snapshot", "--json", "--duration", "6s", "--depth", "1"],
        "attached",
    );
    let plain = start_agent(&["snapshot", "--json", "--duration", "6s"], "attached");
    let before_s = parent.cpu_seconds();
    left.spin("300");
    right.spin("500");
    let kernel_s = parent.cpu_seconds() - before_s;
    let document = |agent: Child| -> serde_json::Value {
        let output = agent.wait_with_output().expect("wait for agent");
        assert!(output.status.success(), "agent failed: {:?}", output.status);
        serde_json::from_slice(&output.stdout).expect("one JSON document")
    };
    let (folded, plain) = (document(folded), document(plain));

    assert_eq!(folded["depth"], 1);
    let subtree = snapshot_worker(&folded, parent.id).expect("the parent is a worker at depth 1");
    assert_eq!(subtree["scope"], "subtree");
    assert!(
        subtree["path"]
            .as_str()
            .expect("path")
            .ends_with(&parent.name())
    );
    let ours_s = subtree["cpu"]["seconds"].as_f64().expect("cpu seconds");
    let user_s = subtree["cpu"]["user_seconds"].as_f64().expect("user");
    let system_s = subtree["cpu"]["system_seconds"].as_f64().expect("system");
    eprintln!(
        "parent subtree: ours {ours_s} s, its cpu.stat {kernel_s} s (user {user_s}, system {system_s})"
    );
    assert!(kernel_s > 0.6, "the children barely ran: {kernel_s} s");
    assert!(
        (ours_s - kernel_s).abs() <= 0.01 + kernel_s * 0.01,
        "the parent's subtree {ours_s} s vs its cpu.stat {kernel_s} s"
    );
    assert!(
        (user_s + system_s - ours_s).abs() < 1e-5,
        "user + system = cpu"
    );
    for child in [&left, &right] {
        assert!(
            snapshot_worker(&folded, child.id).is_none(),
            "a child below the depth is folded into its parent, not shown twice"
        );
    }

    // Without --depth: each child with its own threads, the threadless parent absent.
    assert!(plain["depth"].is_null());
    assert!(snapshot_worker(&plain, parent.id).is_none());
    let children_s: f64 = [&left, &right]
        .iter()
        .map(|child| {
            let own = snapshot_worker(&plain, child.id).expect("each child is a worker");
            assert_eq!(own["scope"], "self");
            own["cpu"]["seconds"].as_f64().expect("cpu seconds")
        })
        .sum();
    let child_kernel_s: f64 = [&left, &right].iter().map(|c| c.cpu_seconds()).sum();
    assert!(
        (children_s - child_kernel_s).abs() <= 0.01 + child_kernel_s * 0.01,
        "children {children_s} s vs their cpu.stat {child_kernel_s} s"
    );
    drop((left, right));
}

#[test]
fn a_parents_exit_summary_at_its_depth_sums_its_children_and_they_have_none() {
    require_root();
    let folded = start_watch(&["--depth", "1"]);
    let plain = start_watch(&[]);
    let parent = TestCgroup::new("tree-exit");
    let (parent_id, parent_dir) = (parent.id, parent.dir.clone());
    let (left, right) = (parent.child("left"), parent.child("right"));
    left.spin("200");
    right.spin("400");
    let child_ids = [left.id, right.id];
    let child_kernel_s: Vec<f64> = [&left, &right].iter().map(|c| c.cpu_seconds()).collect();
    drop((left, right));
    let kernel_s = parent.cpu_seconds();
    drop(parent);
    assert!(!parent_dir.exists(), "the parent was removed");
    let (folded, plain) = (stop_watch(folded), stop_watch(plain));
    let prefix = parent_dir
        .file_name()
        .and_then(|name| name.to_str())
        .map(|name| format!("/{name}"))
        .expect("name");

    let folded_exits = exits(&folded, &prefix);
    assert_eq!(
        folded_exits.len(),
        1,
        "one summary, the parent's, with --depth 1: {folded_exits:?}"
    );
    let summary = folded_exits[0];
    assert_eq!(summary["cgroup_id"], parent_id);
    assert_eq!(summary["scope"], "subtree");
    let ours_s = summary["cpu"]["total_seconds"].as_f64().expect("cpu");
    eprintln!("parent's exit summary: {ours_s} s, its cpu.stat {kernel_s} s");
    assert!(kernel_s > 0.5, "the children barely ran: {kernel_s} s");
    assert!(
        (ours_s - kernel_s).abs() <= 0.01 + kernel_s * 0.01,
        "the parent's subtree {ours_s} s vs its cpu.stat {kernel_s} s"
    );
    let user_s = summary["cpu"]["user_seconds"].as_f64().expect("user");
    let system_s = summary["cpu"]["system_seconds"].as_f64().expect("system");
    assert!(
        (user_s + system_s - ours_s).abs() < 1e-5,
        "user + system = cpu"
    );
    // Its memory peak: its own memory cgroup's, or its children's processes' as the kernel
    // kept them.
    assert!(
        summary["memory"]["peak_bytes"]
            .as_u64()
            .is_some_and(|bytes| bytes > 0),
        "{}",
        summary["memory"]
    );

    // Without --depth: a summary per child (its own threads), none for the threadless parent.
    let plain_exits = exits(&plain, &prefix);
    assert_eq!(plain_exits.len(), 2, "{plain_exits:?}");
    for (id, kernel_s) in child_ids.iter().zip(child_kernel_s) {
        let own = plain_exits
            .iter()
            .find(|line| line["cgroup_id"] == *id)
            .expect("each child's summary");
        assert_eq!(own["scope"], "self");
        let ours_s = own["cpu"]["total_seconds"].as_f64().expect("cpu");
        assert!(
            (ours_s - kernel_s).abs() <= 0.01 + kernel_s * 0.01,
            "a child's {ours_s} s vs its cpu.stat {kernel_s} s"
        );
    }
}

/// Resident pages of process `pid` as /proc/PID/statm says (its second field).
fn statm_resident_pages(pid: u32) -> u64 {
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).expect("statm");
    statm
        .split_whitespace()
        .nth(1)
        .and_then(|pages| pages.parse().ok())
        .expect("statm's resident field")
}

/// Pages by which /proc/PID/statm may miss a process's resident set: none since Linux 6.16,
/// which sums each counter's per-CPU parts as the walk does; before, each of the three
/// counters' shared value may lag its parts by up to a batch (`max(32, 2 × CPUs)`) per CPU.
fn statm_lag_pages() -> u64 {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
    let mut numbers = release
        .split(['.', '-'])
        .map(|n| n.parse::<u64>().unwrap_or(0));
    let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    if (major, minor) >= (6, 16) {
        return 0;
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    3 * (2 * cpus).max(32) * cpus
}

/// A collector that runs the process walk on any host (the agent runs it only where cgroup2
/// has no memory controller).
fn process_walk_collector() -> workerprobe::collect::KernelCollector {
    workerprobe_tests::collector_with(workerprobe::loader::LoadOptions {
        process_rss_walk: true,
        ..Default::default()
    })
}

/// The process walk (how the agent reads workers' memory where cgroup2 has no memory
/// controller: hybrid hosts) sums the worker's processes' resident sets as /proc/PID/statm
/// gives each (exactly where /proc sums the counters' per-CPU parts too), on every kernel's
/// layout of the counters; a process that ends takes its pages along, and a cgroup without
/// processes has no entry.
#[test]
fn the_process_walk_sums_each_process_resident_set_as_statm_says() {
    require_root();
    let worker = TestCgroup::new("rss-walk");
    let empty = TestCgroup::new("rss-walk-empty");
    let mut holders: Vec<KillOnDrop> = [16u64, 32, 48]
        .iter()
        .map(|mib| {
            let mut holder = worker.spawn_workload(&["hold", &mib.to_string(), "120000"]);
            read_first_json_line(&mut holder);
            KillOnDrop(holder)
        })
        .collect();
    let mut collector = process_walk_collector();
    // SAFETY: sysconf only reads a constant of the system.
    let page_bytes = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).expect("page");
    let statm_sum = |holders: &[KillOnDrop]| -> u64 {
        holders
            .iter()
            .map(|holder| statm_resident_pages(holder.0.id()))
            .sum::<u64>()
            * page_bytes
    };
    let lag_bytes = statm_lag_pages() * page_bytes;
    use workerprobe::collect::Source as _;
    for round in 0..2 {
        // The holders touch nothing after their first line: /proc's figure is the same
        // before and after the walk, and the walk's must equal it.
        let before = statm_sum(&holders);
        collector.sample().expect("sample");
        let after = statm_sum(&holders);
        let walked = collector.take_walked_memory();
        let processes = walked.processes.expect("the process walk ran");
        let walked_worker = processes
            .get(&worker.id)
            .unwrap_or_else(|| panic!("round {round}: the worker is not in the walk"));
        // The process it names (to find its v1 memory cgroup by) is one of the worker's.
        let pids: Vec<u32> = holders.iter().map(|holder| holder.0.id()).collect();
        assert!(
            pids.contains(&walked_worker.pid),
            "round {round}: the walk names process {}, the worker's are {pids:?}",
            walked_worker.pid
        );
        // It names the cgroup holding that process's memory controller state, as the
        // kernel's files say: its v1 memory cgroup on hybrid hosts; on pure cgroup2 the
        // nearest cgroup at or above its own that has the controller.
        assert_eq!(
            walked_worker.memory_cgroup_id,
            Some(memory_cgroup_id_of(walked_worker.pid)),
            "round {round}: the walk's memory cgroup of process {}",
            walked_worker.pid
        );
        let ours = walked_worker.reading;
        eprintln!(
            "round {round}: {} processes: walk {} bytes, statm {before}..{after} (it may lag by {lag_bytes})",
            holders.len(),
            ours.current_bytes
        );
        let statm_range =
            before.min(after).saturating_sub(lag_bytes)..=before.max(after) + lag_bytes;
        assert!(
            statm_range.contains(&ours.current_bytes),
            "round {round}: the walk says {} bytes, /proc/PID/statm {before} then {after} (it may lag by {lag_bytes})",
            ours.current_bytes
        );
        assert!(ours.current_bytes >= (16 + 32 + 48 - 16 * round) << 20);
        assert_eq!(ours.source, workerprobe::model::MemorySource::Rss);
        assert!(
            !processes.contains_key(&empty.id),
            "an empty cgroup in the walk"
        );
        // One holder ends (killed and reaped): its pages leave the sum.
        drop(holders.remove(0));
    }
}

/// The id of the cgroup holding process `pid`'s memory controller state, from
/// /proc/PID/cgroup and the cgroup directories: its v1 memory cgroup where v1 has the
/// controller, else the nearest cgroup2 cgroup at or above its own whose `cgroup.controllers`
/// lists memory (the root has every controller).
fn memory_cgroup_id_of(pid: u32) -> u64 {
    let membership = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("membership");
    let reader = workerprobe::collect::memory::MemoryReader::new();
    if let Some(mount) = reader.v1_memory_mount() {
        let path = workerprobe::collect::memory::parse_v1_memory_membership(&membership)
            .expect("a v1 memory cgroup");
        return cgroup::cgroup_id(&mount.join(path.trim_start_matches('/'))).expect("its id");
    }
    let mount = cgroup::find_cgroup2_mount().expect("cgroup2 mount");
    let path = cgroup::parse_cgroup2_membership(&membership).expect("a cgroup2 cgroup");
    let mut dir = mount.join(path.trim_start_matches('/'));
    while dir != mount
        && !cgroup::read_controllers(&dir.join("cgroup.controllers"))
            .iter()
            .any(|controller| controller == "memory")
    {
        dir.pop();
    }
    cgroup::cgroup_id(&dir).expect("its id")
}

/// Each worker's memory from the best source its host has, as the kernel's files give it:
/// where cgroup2 has the memory controller, its `memory.current`; on hybrid hosts, the v1
/// memory cgroup its processes have to themselves, else (a v1 cgroup shared with other
/// processes, here the test's own) the process walk's sum. The second of two workers sharing
/// one v1 cgroup is told so without its process list being read.
#[test]
fn each_worker_memory_comes_from_its_own_v1_cgroup_or_else_the_process_walk() {
    require_root();
    let own = TestCgroup::new("v1-own");
    let sharing: Vec<TestCgroup> = (0..2)
        .map(|n| TestCgroup::new(&format!("v1-sharing-{n}")))
        .collect();
    let mut reader = workerprobe::collect::memory::MemoryReader::new();
    // On a hybrid host: a v1 memory cgroup for the first holder alone, joined before it
    // allocates (v1 charges stay where they were made); removed when dropped, as the test's
    // cgroup2 ones, after the holders (declared later, dropped first: killed and reaped).
    let v1_own = reader.v1_memory_mount().map(|mount| {
        let dir = mount.join(format!("workerprobe-test-{}-v1-own", std::process::id()));
        std::fs::create_dir_all(&dir).expect("make a v1 memory cgroup");
        let id = cgroup::cgroup_id(&dir).expect("the v1 cgroup's id");
        TestCgroup { dir, id }
    });
    let hold = [
        workload_path().display().to_string(),
        "hold".into(),
        "24".into(),
        "120000".into(),
    ];
    let _holders: Vec<KillOnDrop> = std::iter::once(&own)
        .chain(&sharing)
        .map(|worker| {
            let mut holder = match &v1_own {
                Some(v1_dir) if worker.id == own.id => {
                    let mut command = Command::new("sh");
                    command
                        .arg("-c")
                        .arg(r#"echo $$ > "$0/cgroup.procs" && exec "$@""#)
                        .arg(&v1_dir.dir)
                        .args(&hold)
                        .stdout(Stdio::piped());
                    cgroup::spawn_in_cgroup(&mut command, &worker.dir).expect("spawn")
                }
                _ => worker.spawn_workload(&["hold", "24", "120000"]),
            };
            read_first_json_line(&mut holder);
            KillOnDrop(holder)
        })
        .collect();
    let mut collector = process_walk_collector();
    use workerprobe::collect::Source as _;
    let read_u64 = |path: &Path| -> u64 {
        std::fs::read_to_string(path)
            .unwrap_or_else(|err| panic!("read {}: {err}", path.display()))
            .trim()
            .parse()
            .expect("a number")
    };
    for round in 0..2 {
        collector.sample().expect("sample");
        let walked = collector.take_walked_memory();
        let processes = walked.processes.as_ref().expect("the process walk ran");
        for (index, worker) in std::iter::once(&own).chain(&sharing).enumerate() {
            // The kernel's own figure, read around ours: the holders touch nothing now.
            use workerprobe::model::MemorySource;
            let (source, kernel_file) = if worker.dir.join("memory.current").exists() {
                (
                    MemorySource::Cgroup2,
                    Some(worker.dir.join("memory.current")),
                )
            } else if index == 0 {
                let v1_dir = v1_own.as_ref().expect("a v1 memory controller");
                (
                    MemorySource::Cgroup1,
                    Some(v1_dir.dir.join("memory.usage_in_bytes")),
                )
            } else {
                (MemorySource::Rss, None)
            };
            let before = kernel_file.as_deref().map(read_u64);
            let ours = reader
                .read_worker(
                    worker.id,
                    &format!("/{}", worker.name()),
                    &walked,
                    &mut |path| collector.cgroups().dir_of(path),
                )
                .unwrap_or_else(|| panic!("round {round}: no memory for worker {index}"));
            let after = kernel_file.as_deref().map(read_u64);
            eprintln!(
                "round {round}: worker {index}: {ours:?}, the kernel's {before:?}..{after:?}"
            );
            assert_eq!(ours.source, source, "round {round}: worker {index}");
            match (before, after) {
                (Some(before), Some(after)) => assert!(
                    (before.min(after)..=before.max(after)).contains(&ours.current_bytes),
                    "round {round}: worker {index}: ours {} bytes, the kernel's {before} then {after}",
                    ours.current_bytes
                ),
                _ => assert_eq!(
                    ours, processes[&worker.id].reading,
                    "round {round}: worker {index}: not the walk's sum"
                ),
            }
            assert!(ours.current_bytes >= 24 << 20, "round {round}: {ours:?}");
        }
    }
}
