//! Restart without loss: with `--pin DIR` the programs stay attached and the maps keep
//! counting between agents, so a worker's CPU and bytes across an agent restart (clean exit or
//! SIGKILL) equal what it did; `workerprobe unpin DIR` removes everything.

use std::{
    io::BufRead as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use workerprobe_tests::{
    TestCgroup, field, read_first_json_line, require_root, start_agent, wait_json, workerprobe_path,
};

const BPFFS: &str = "/sys/fs/bpf";

/// Mounts bpffs at /sys/fs/bpf when nothing is mounted there (as systemd does at boot).
fn ensure_bpffs() {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let mounted = mountinfo.lines().any(|line| {
        let (left, right) = line.split_once(" - ").unwrap_or(("", ""));
        left.split_whitespace().nth(4) == Some(BPFFS) && right.starts_with("bpf ")
    });
    if !mounted {
        let status = Command::new("mount")
            .args(["-t", "bpf", "bpf", BPFFS])
            .status()
            .expect("run mount");
        assert!(status.success(), "mount -t bpf bpf {BPFFS} failed");
    }
}

/// A pin directory for one test; unpinned (ignoring errors) on drop, so a failing test leaves
/// nothing attached.
struct PinDir(PathBuf);

impl PinDir {
    fn new(name: &str) -> Self {
        ensure_bpffs();
        let dir = PathBuf::from(format!("{BPFFS}/wp-test-{}-{name}", std::process::id()));
        let pin = Self(dir);
        pin.unpin_quietly();
        pin
    }

    fn arg(&self) -> &str {
        self.0.to_str().expect("utf-8 path")
    }

    /// Unpins if there is anything, retrying for a few seconds while an agent (a first
    /// agent's timed snapshot) still holds the set.
    fn unpin_quietly(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.0.exists() && Instant::now() < deadline {
            let _ = Command::new(workerprobe_path())
                .args(["unpin", self.arg()])
                .stderr(Stdio::null())
                .status();
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        self.unpin_quietly();
    }
}

fn bpftool_json(args: &[&str]) -> Option<serde_json::Value> {
    let output = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .stderr(Stdio::null())
        .output()
        .expect("run bpftool (install it: `cargo xtask setup`)");
    if !output.status.success() {
        return None;
    }
    serde_json::from_slice(&output.stdout).ok()
}

/// (program name, program id) of every link pinned in `dir`.
fn pinned_programs(dir: &Path) -> Vec<(String, u64)> {
    let mut programs = Vec::new();
    for entry in std::fs::read_dir(dir).expect("list pin dir") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(program) = name.strip_prefix("link_") else {
            continue;
        };
        let link = bpftool_json(&["link", "show", "pinned", path.to_str().unwrap()])
            .unwrap_or_else(|| panic!("bpftool link show pinned {}", path.display()));
        let id = link["prog_id"].as_u64().expect("prog_id");
        programs.push((program.to_string(), id));
    }
    programs.sort();
    programs
}

/// The program with this id, if it is loaded.
fn program(id: u64) -> Option<serde_json::Value> {
    bpftool_json(&["prog", "show", "id", &id.to_string()])
}

/// An agent killed on drop, so a failing test does not leave it holding the pin set's lock
/// (declared after the [`PinDir`], it is dropped before it).
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Reads an agent's stdout lines on a thread, so the test can wait with a deadline.
fn lines_of(agent: &mut Child) -> mpsc::Receiver<String> {
    let stdout = agent.stdout.take().expect("agent stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

fn terminate(agent: &mut Child) {
    // SAFETY: kill on a child we started.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if agent.try_wait().expect("wait agent").is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = agent.kill();
    let _ = agent.wait();
}

fn send(worker: &TestCgroup, addr: &str, total: u64) -> u64 {
    let sent =
        wait_json(worker.spawn_workload(&["send", "tcp", addr, &total.to_string(), "4096,65536"]));
    field(&sent, "sent_bytes")
}

fn restart(name: &str, kill_first: bool) {
    require_root();
    let pin = PinDir::new(name);
    let receiver = TestCgroup::new(&format!("{name}-recv"));
    let mut recv1 = receiver.spawn_workload(&["recv", "tcp", "127.0.0.1:0", "0"]);
    let mut recv2 = receiver.spawn_workload(&["recv", "tcp", "127.0.0.1:0", "0"]);
    let addr = |recv: &mut Child| {
        read_first_json_line(recv)["addr"]
            .as_str()
            .expect("receiver address")
            .to_string()
    };
    let (addr1, addr2) = (addr(&mut recv1), addr(&mut recv2));
    let worker = TestCgroup::new(name);
    let worker_id = worker.id;

    // First agent: makes the pin set.
    let mut first = start_agent(
        &["snapshot", "--json", "--duration", "2s", "--pin", pin.arg()],
        "attached",
    );
    let spin = worker.spawn_workload(&["spin", "3000", "1"]);
    let sent1 = send(&worker, &addr1, 3_000_000);
    let programs = pinned_programs(&pin.0);
    let names: Vec<&str> = programs.iter().map(|(name, _)| name.as_str()).collect();
    assert!(
        names.iter().any(|name| name.starts_with("switch_"))
            // The socket-length tracepoint (6.3+) or the fexit variant before it.
            && names
                .iter()
                .any(|name| *name == "sock_send" || name.starts_with("sock_tx_")),
        "pinned programs: {names:?}"
    );
    if kill_first {
        first.kill().expect("SIGKILL the first agent");
        let _ = first.wait();
    } else {
        let output = first.wait_with_output().expect("first agent");
        assert!(output.status.success(), "first agent: {:?}", output.status);
        let document: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("snapshot JSON");
        let seen = document["workers"]
            .as_array()
            .expect("workers")
            .iter()
            .find(|w| w["cgroup_id"].as_u64() == Some(worker_id))
            .expect("worker in the first agent's snapshot");
        assert_eq!(
            seen["net"]["sent_bytes"].as_u64(),
            Some(sent1),
            "first window"
        );
    }

    // No agent runs: the pinned links keep every program attached, held by no process.
    for (name, id) in &programs {
        let info = program(*id).unwrap_or_else(|| panic!("program {name} ({id}) was detached"));
        let holders = info["pids"].as_array().map_or(0, Vec::len);
        assert_eq!(holders, 0, "program {name} is held by a process: {info}");
    }
    // The second half of the bytes is sent while no agent runs.
    let sent2 = send(&worker, &addr2, 2_000_000);

    // Second agent: continues the same maps, loads nothing.
    let mut second = Agent(start_agent(
        &["watch", "--json", "--pin", pin.arg()],
        "attached",
    ));
    assert_eq!(
        pinned_programs(&pin.0),
        programs,
        "the restart loaded or attached programs"
    );
    let lines = lines_of(&mut second.0);
    let mut spin = spin;
    let spun = spin.wait().expect("wait for the spinning workload");
    assert!(spun.success(), "spin failed: {spun:?}");
    // Let the last threads leave, then read the kernel's total for the worker and remove it.
    std::thread::sleep(Duration::from_millis(200));
    let usage_usec = worker.cpu_stat().usage_usec;
    drop(worker);
    let deadline = Instant::now() + Duration::from_secs(15);
    let exit = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines
            .recv_timeout(left)
            .expect("no exit summary for the worker within 15s");
        let value: serde_json::Value = serde_json::from_str(&line).expect("watch JSON line");
        if value["type"] == "exit" && value["cgroup_id"].as_u64() == Some(worker_id) {
            break value;
        }
    };
    terminate(&mut second.0);
    let received =
        field(&wait_json(recv1), "received_bytes") + field(&wait_json(recv2), "received_bytes");

    let cpu_seconds = exit["cpu"]["total_seconds"].as_f64().expect("cpu total");
    let expected = usage_usec as f64 / 1e6;
    eprintln!(
        "{name}: cpu {cpu_seconds:.4}s vs cpu.stat {expected:.4}s; sent {} vs {}+{}",
        exit["net"]["sent_bytes"], sent1, sent2
    );
    assert!(
        (cpu_seconds - expected).abs() <= expected * 0.01,
        "CPU across the restart: {cpu_seconds}s, cpu.stat says {expected}s"
    );
    assert_eq!(
        exit["net"]["sent_bytes"].as_u64(),
        Some(sent1 + sent2),
        "bytes across the restart"
    );
    assert_eq!(received, sent1 + sent2, "the receivers got every byte");

    // Unpin: the programs go, and so does the directory.
    let status = Command::new(workerprobe_path())
        .args(["unpin", pin.arg()])
        .status()
        .expect("run unpin");
    assert!(status.success(), "unpin failed: {status:?}");
    assert!(!pin.0.exists(), "unpin left {}", pin.0.display());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<_> = programs
            .iter()
            .filter(|(_, id)| program(*id).is_some())
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still loaded after unpin: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn restart_after_exit_continues_counters() {
    restart("restart-exit", false);
}

#[test]
fn restart_after_sigkill_continues_counters() {
    restart("restart-kill", true);
}

#[test]
fn bad_pin_dirs_exit_2_with_one_sentence() {
    require_root();
    ensure_bpffs();
    let run = |args: &[&str]| {
        let output = Command::new(workerprobe_path())
            .args(args)
            .output()
            .expect("run workerprobe");
        (
            output.status.code(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (code, stderr) = run(&["snapshot", "--pin", "/tmp/wp-not-bpffs"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("not under a bpffs mount"), "{stderr}");
    let missing = format!("{BPFFS}/wp-test-{}-missing", std::process::id());
    let (code, stderr) = run(&["unpin", &missing]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("not a workerprobe pin set"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

/// A pin set made by an older agent, whose drop counters had 8 slots (this one names 10): the
/// new agent continues it, showing the slots the set lacks as 0 (its programs count none
/// there), instead of failing every sample on the missing ones.
#[test]
fn a_pin_set_with_fewer_drop_slots_is_continued() {
    require_root();
    let pin = PinDir::new("old-drops");
    let first = Command::new(workerprobe_path())
        .args(["snapshot", "--duration", "200ms", "--pin", pin.arg()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run the first agent");
    assert!(first.success(), "the first agent failed: {first:?}");
    // The older layout: DROPS as the agents before the iterator made it.
    let drops = pin.0.join("DROPS");
    std::fs::remove_file(&drops).expect("unpin DROPS");
    let made = Command::new("bpftool")
        .args(["map", "create"])
        .arg(&drops)
        .args([
            "type",
            "percpu_array",
            "key",
            "4",
            "value",
            "8",
            "entries",
            "8",
        ])
        .args(["name", "DROPS"])
        .status()
        .expect("run bpftool (install it: `cargo xtask setup`)");
    assert!(made.success(), "bpftool map create failed");
    let output = Command::new(workerprobe_path())
        .args([
            "snapshot",
            "--json",
            "--duration",
            "300ms",
            "--pin",
            pin.arg(),
        ])
        .output()
        .expect("run the second agent");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the second agent failed: {stderr}");
    let document: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(
        document["drops"]["cpu_now"]["total"], 0,
        "{}",
        document["drops"]
    );
}
