//! The agent must never be what breaks a node: maps fuller than their capacity, a SIGKILL
//! under load, and thousands of short workers made and removed while it runs. Every test is
//! bounded in time and fails (never skips) without root.

use std::{
    collections::BTreeSet,
    io::BufReader,
    path::{Path, PathBuf},
    process::{Child, ChildStderr, Command, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use workerprobe::cgroup;
use workerprobe_tests::{
    TestCgroup, read_first_json_line, require_root, status_field, workerprobe_path, workload_path,
};

/// Starts `workerprobe ARGS…` (stdout piped) and returns once a line on stderr contains
/// `ready`, with the rest of stderr still to read (the shared helper drops it, and a later
/// warning would then hit a closed pipe).
fn start_agent_with_stderr(args: &[&str], ready: &str) -> (Child, BufReader<ChildStderr>) {
    let mut agent = Command::new(workerprobe_path())
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start workerprobe");
    let mut stderr = BufReader::new(agent.stderr.take().expect("stderr"));
    workerprobe_tests::wait_until_ready(&mut stderr, ready);
    (agent, stderr)
}

/// Reads a stream to its end on a thread (a full pipe would stall the agent).
fn drain<R: std::io::Read + Send + 'static>(mut from: R) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        let _ = from.read_to_string(&mut text);
        text
    })
}

/// Waits for `child` at most `limit`; kills it and panics past that.
fn wait_bounded(child: &mut Child, limit: Duration, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, signal: i32) {
    // SAFETY: kill(2) on our own child's pid.
    let rc = unsafe { libc::kill(child.id() as i32, signal) };
    assert_eq!(rc, 0, "kill({}, {signal})", child.id());
}

/// `bpftool -j ARGS…` as JSON.
fn bpftool(args: &[&str]) -> serde_json::Value {
    let output = Command::new("bpftool")
        .arg("-j")
        .args(args)
        .output()
        .expect("run bpftool (install it: `cargo xtask setup`)");
    assert!(
        output.status.success(),
        "bpftool {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|err| panic!("bpftool {args:?} printed no JSON: {err}"))
}

/// Whether a `bpftool -j … show` object lists `pid` among its holders (when bpftool was
/// built with pid iterators; otherwise there is no `pids` field and this is false).
fn held_by(object: &serde_json::Value, pid: u32) -> bool {
    object["pids"].as_array().is_some_and(|pids| {
        pids.iter()
            .any(|holder| holder["pid"].as_u64() == Some(u64::from(pid)))
    })
}

/// The ids of `field` (`prog_id`, `map_id`, `link_id`) behind the descriptors a process holds,
/// from `/proc/PID/fdinfo` (exact, whatever bpftool was built with).
fn bpf_ids_held(pid: u32, field: &str) -> BTreeSet<u64> {
    let mut ids = BTreeSet::new();
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return ids;
    };
    let prefix = format!("{field}:");
    for entry in entries.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        for line in text.lines() {
            if let Some(id) = line.strip_prefix(&prefix) {
                ids.extend(id.trim().parse::<u64>().ok());
            }
        }
    }
    ids
}

/// Ids of the objects `bpftool -j KIND show` lists.
fn listed_ids(kind: &str) -> BTreeSet<u64> {
    bpftool(&[kind, "show"])
        .as_array()
        .map(|objects| objects.iter().filter_map(|o| o["id"].as_u64()).collect())
        .unwrap_or_default()
}

/// The id of the program, map or link pinned at `path`, if it is one.
fn pinned_id(path: &Path) -> Option<u64> {
    let path = path.to_str()?;
    ["prog", "map", "link"].into_iter().find_map(|kind| {
        let output = Command::new("bpftool")
            .args(["-j", kind, "show", "pinned", path])
            .output()
            .ok()?;
        let value: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
        output.status.success().then(|| value["id"].as_u64())?
    })
}

/// Every path under `dir`, recursively.
fn tree(dir: &Path) -> BTreeSet<PathBuf> {
    let mut found = BTreeSet::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                pending.push(path.clone());
            }
            found.insert(path);
        }
    }
    found
}

/// The resident set of a process, bytes.
fn rss_bytes(pid: u32) -> u64 {
    status_bytes(pid, "VmRSS:")
}

/// A size line of /proc/PID/status (`VmRSS:`, `RssAnon:`), in bytes.
fn status_bytes(pid: u32, field: &str) -> u64 {
    let kib = status_field(pid, field);
    let kib: u64 = kib
        .strip_suffix(" kB")
        .and_then(|kib| kib.parse().ok())
        .unwrap_or_else(|| panic!("{field} {kib:?} is not kB"));
    kib * 1024
}

#[test]
fn more_workers_than_the_maps_hold_are_counted_as_drops_with_one_warning() {
    // CPU time through the switch program, whose per-worker map fills.
    overfull_maps(&["--cpu-attach", "sched-switch"], "cpu_stats");
    // CPU time through the cgroup iterator, whose map of times per worker and CPU fills.
    overfull_maps(&[], "cpu_now");
}

/// Twenty workers where the maps hold eight: `map`'s drops are counted, and one warning
/// names it.
fn overfull_maps(flags: &[&str], map: &str) {
    require_root();
    let started = Instant::now();
    let mount = cgroup::find_cgroup2_mount().expect("cgroup2");
    let mut args = vec![
        "snapshot",
        "--json",
        "--duration",
        "3s",
        "--max-workers",
        "8",
        "--programs",
        "cpu,net",
    ];
    args.extend_from_slice(flags);
    let (mut agent, stderr) = start_agent_with_stderr(&args, "attached");
    let stdout = drain(agent.stdout.take().expect("stdout"));
    let stderr = drain(stderr);
    // Twenty workers, each spinning 300 ms, where the maps have room for eight cgroups.
    const WORKERS: usize = 20;
    let dirs: Vec<PathBuf> = (0..WORKERS)
        .map(|index| {
            let dir = mount.join(format!("wpcap-{}-{index}", std::process::id()));
            let _ = std::fs::remove_dir(&dir);
            std::fs::create_dir(&dir).expect("mkdir worker");
            dir
        })
        .collect();
    let mut spinners: Vec<Child> = dirs
        .iter()
        .map(|dir| {
            let mut command = Command::new(workload_path());
            command.args(["spin", "300", "1"]).stdout(Stdio::null());
            cgroup::spawn_in_cgroup(&mut command, dir).expect("spawn spinner")
        })
        .collect();
    for spinner in &mut spinners {
        assert!(wait_bounded(spinner, Duration::from_secs(20), "a spinner").success());
    }
    for dir in &dirs {
        cgroup::remove_cgroup(dir).expect("rmdir worker");
    }
    let status = wait_bounded(&mut agent, Duration::from_secs(20), "the snapshot");
    let stdout = stdout.join().expect("stdout reader");
    let stderr = stderr.join().expect("stderr reader");
    assert!(
        status.success(),
        "snapshot failed: {status:?}; stderr: {stderr}"
    );
    let document: serde_json::Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|err| panic!("snapshot printed {stdout:?}: {err}"));
    let drops = &document["drops"];
    let cpu_drops = drops[map]["total"]
        .as_u64()
        .unwrap_or_else(|| panic!("no drops.{map}.total in {drops}"));
    assert!(
        cpu_drops > 0,
        "20 workers in maps of 8 dropped nothing in {map}: {drops}"
    );
    assert!(drops["net_stats"]["total"].is_u64(), "{drops}");
    // (Workers still appear beyond eight: a slice running at a sample is read from /proc,
    // and cpu.stat is read for every cgroup; what the full map loses is the ended slices.)
    let workers = document["workers"].as_array().expect("workers").len();
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("warning:"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning, not {warnings:?}");
    assert!(
        warnings[0].starts_with(&format!("workerprobe: warning: {map} is full or busy: "))
            && warnings[0].ends_with("raise --max-workers (now 8)"),
        "{warnings:?}"
    );
    eprintln!(
        "capacity: {cpu_drops} {map} drops, {workers} workers kept, in {:.1}s",
        started.elapsed().as_secs_f64()
    );
}

#[test]
fn a_killed_agent_leaves_nothing_attached() {
    require_root();
    let bpffs_before = tree(Path::new("/sys/fs/bpf"));
    // `top` prints no "attached" line: it is attached once its programs are held.
    let mut agent = Command::new(workerprobe_path())
        .args(["top", "--interval", "200ms"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start workerprobe top");
    let stderr = drain(agent.stderr.take().expect("stderr"));
    let pid = agent.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = BTreeSet::new();
    let mut stable_polls = 0;
    let (progs, maps, links) = loop {
        let progs = bpf_ids_held(pid, "prog_id");
        let links = bpf_ids_held(pid, "link_id");
        // Attached: programs held, each through a link, bpftool lists them, and no more
        // arrive for a few polls.
        let attached =
            !progs.is_empty() && links.len() >= progs.len() && progs.is_subset(&listed_ids("prog"));
        stable_polls = if attached && progs == last {
            stable_polls + 1
        } else {
            0
        };
        if stable_polls >= 6 {
            break (progs, bpf_ids_held(pid, "map_id"), links);
        }
        last = progs;
        if let Some(status) = agent.try_wait().expect("wait") {
            panic!(
                "top exited ({status:?}) before attaching: {}",
                stderr.join().unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "top held no programs after 30 s");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!maps.is_empty(), "top holds programs but no maps");
    // bpftool built with pid iterators names the holder; where it does, it must agree.
    let listed = bpftool(&["prog", "show"]);
    for prog in listed.as_array().expect("prog list") {
        if held_by(prog, pid) {
            assert!(progs.contains(&prog["id"].as_u64().unwrap_or(0)), "{prog}");
        }
    }

    // Load: a spinner and a TCP transfer in a worker, so programs are busy when it dies.
    let worker = TestCgroup::new("crash");
    let mut spinner = worker.spawn_workload(&["spin", "3000", "1"]);
    let mut receiver = worker.spawn_workload(&["recv", "tcp", "127.0.0.1:0", "0"]);
    let addr = read_first_json_line(&mut receiver)["addr"]
        .as_str()
        .expect("addr")
        .to_string();
    let mut sender = worker.spawn_workload(&["send", "tcp", &addr, "200000000", "65536,1000"]);
    std::thread::sleep(Duration::from_millis(500));

    signal(&agent, libc::SIGKILL);
    let status = wait_bounded(&mut agent, Duration::from_secs(5), "the killed agent");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
    let killed_at = Instant::now();
    // Programs, links and maps are freed when their last descriptor closes (after an RCU
    // grace period): allow a few seconds.
    let deadline = killed_at + Duration::from_secs(5);
    let mut left;
    loop {
        let listed_progs = bpftool(&["prog", "show"]);
        let listed_maps = bpftool(&["map", "show"]);
        left = Vec::new();
        for prog in listed_progs.as_array().expect("prog list") {
            let id = prog["id"].as_u64().unwrap_or(0);
            if progs.contains(&id) || held_by(prog, pid) {
                left.push(format!("program {id} {}", prog["name"]));
            }
        }
        for map in listed_maps.as_array().expect("map list") {
            let id = map["id"].as_u64().unwrap_or(0);
            if maps.contains(&id) || held_by(map, pid) {
                left.push(format!("map {id} {}", map["name"]));
            }
        }
        let listed_links = listed_ids("link");
        left.extend(
            links
                .intersection(&listed_links)
                .map(|id| format!("link {id}")),
        );
        if left.is_empty() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let freed_after = killed_at.elapsed();
    for child in [&mut spinner, &mut sender, &mut receiver] {
        wait_bounded(child, Duration::from_secs(30), "a workload");
    }
    assert!(
        left.is_empty(),
        "5 s after SIGKILL the agent's objects remain: {left:?}"
    );
    // Nothing pinned: a pin would also have kept the ids above alive. Other tests may pin
    // their own sets meanwhile, so new pins are judged by what they hold.
    let bpffs_after = tree(Path::new("/sys/fs/bpf"));
    let ours: BTreeSet<u64> = progs.iter().chain(&maps).chain(&links).copied().collect();
    let pinned_ours: Vec<_> = bpffs_after
        .difference(&bpffs_before)
        .filter(|path| pinned_id(path).is_some_and(|id| ours.contains(&id)))
        .collect();
    assert!(
        pinned_ours.is_empty(),
        "the agent left pins in /sys/fs/bpf: {pinned_ours:?}"
    );
    let _ = stderr.join();
    eprintln!(
        "crash: {} programs, {} links, {} maps all gone {:.2}s after SIGKILL",
        progs.len(),
        links.len(),
        maps.len(),
        freed_after.as_secs_f64()
    );
}

#[test]
fn ten_thousand_short_workers_each_get_one_summary_in_bounded_memory() {
    require_root();
    const WORKERS: usize = 10_000;
    const THREADS: usize = 12;
    const EARLY: usize = 500;
    let mount = cgroup::find_cgroup2_mount().expect("cgroup2");
    let prefix = format!("wpchurn-{}-", std::process::id());
    let pattern = format!("/{prefix}*");
    let (mut agent, stderr) = start_agent_with_stderr(
        &[
            "watch",
            "--json",
            "--duration",
            "600s",
            "--workers",
            &pattern,
        ],
        "attached",
    );
    let pid = agent.id();
    // Nobody reads the agent's output until 90% of the workers are done (18,000 events, more
    // than the kernel's event ring holds): as under a slow consumer, and still no worker may go
    // missing. Their 9,000 lines wait in the agent, a burst it must give back once written.
    let done = std::sync::Arc::new(AtomicUsize::new(0));
    // Lines read so far: the agent has caught up once every worker's is in.
    let lines_read = std::sync::Arc::new(AtomicUsize::new(0));
    let stdout = {
        let (done, lines_read) = (
            std::sync::Arc::clone(&done),
            std::sync::Arc::clone(&lines_read),
        );
        let from = agent.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            while done.load(Ordering::Relaxed) < WORKERS * 9 / 10 {
                std::thread::sleep(Duration::from_millis(20));
            }
            let mut text = String::new();
            for line in std::io::BufRead::lines(std::io::BufReader::new(from)) {
                let Ok(line) = line else { break };
                text.push_str(&line);
                text.push('\n');
                lines_read.fetch_add(1, Ordering::Relaxed);
            }
            text
        })
    };
    let stderr = drain(stderr);
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let early_rss = std::sync::Mutex::new(None::<(u64, Duration)>);
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    if index >= WORKERS {
                        break;
                    }
                    let dir = mount.join(format!("{prefix}{index}"));
                    std::fs::create_dir(&dir).expect("mkdir worker");
                    let mut command = Command::new(workload_path());
                    // Their output would bury the test's own in ten thousand lines.
                    command
                        .args(["nap", "1", "1"])
                        .stdout(std::process::Stdio::null());
                    let status = cgroup::spawn_in_cgroup(&mut command, &dir)
                        .expect("spawn")
                        .wait()
                        .expect("wait");
                    assert!(status.success());
                    cgroup::remove_cgroup(&dir).expect("rmdir worker");
                    if done.fetch_add(1, Ordering::Relaxed) + 1 == EARLY {
                        *early_rss.lock().unwrap() = Some((rss_bytes(pid), started.elapsed()));
                    }
                }
            });
        }
    });
    let churn = started.elapsed();
    let rate = WORKERS as f64 / churn.as_secs_f64();
    // Let the last removals be summarised and written (a debug agent lags seconds behind the
    // churn), and six seconds more (the agent checks its heap every five): what it still
    // holds then is what it keeps.
    let caught_up = Instant::now() + Duration::from_secs(60);
    while lines_read.load(Ordering::Relaxed) < WORKERS && Instant::now() < caught_up {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(6));
    let end_rss = rss_bytes(pid);
    let end_anon = status_bytes(pid, "RssAnon:");
    let (early_rss, early_at) = early_rss.into_inner().unwrap().expect("early RSS");
    let cpu_stats = bpftool(&["map", "show"])
        .as_array()
        .expect("map list")
        .iter()
        .filter(|map| {
            map["name"]
                .as_str()
                .is_some_and(|name| name.starts_with("CPU_STATS"))
        })
        .filter(|map| {
            let id = map["id"].as_u64().unwrap_or(0);
            held_by(map, pid) || bpf_ids_held(pid, "map_id").contains(&id)
        })
        .map(|map| map["id"].as_u64().expect("map id"))
        .collect::<Vec<_>>();
    assert_eq!(
        cpu_stats.len(),
        1,
        "the agent's CPU_STATS map: {cpu_stats:?}"
    );
    let dump = bpftool(&["map", "dump", "id", &cpu_stats[0].to_string()]);
    let entries = dump.as_array().expect("map dump").len();

    signal(&agent, libc::SIGINT);
    let status = wait_bounded(&mut agent, Duration::from_secs(30), "the watch");
    let stdout = stdout.join().expect("stdout reader");
    let stderr = stderr.join().expect("stderr reader");
    assert!(
        status.success(),
        "watch failed: {status:?}; stderr: {stderr}"
    );
    let mut ids = BTreeSet::new();
    let mut exits = 0;
    for line in stdout.lines() {
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|err| panic!("{line:?}: {err}"));
        if value["type"] == "exit"
            && value["path"]
                .as_str()
                .is_some_and(|path| path.starts_with(&pattern[..pattern.len() - 1]))
        {
            exits += 1;
            ids.insert(value["cgroup_id"].as_u64().expect("cgroup id"));
        }
    }
    let growth = end_rss as i64 - early_rss as i64;
    eprintln!(
        "churn: {WORKERS} workers in {:.1}s ({rate:.0}/s, {THREADS} threads); agent RSS {:.1} MB after {EARLY} (at {:.1}s) → {:.1} MB at the end ({:+.2} MB; {:.1} MB of it anonymous); {entries} CPU_STATS entries left; {exits} exit lines, {} distinct; total {:.1}s",
        churn.as_secs_f64(),
        early_rss as f64 / 1e6,
        early_at.as_secs_f64(),
        end_rss as f64 / 1e6,
        growth as f64 / 1e6,
        end_anon as f64 / 1e6,
        ids.len(),
        started.elapsed().as_secs_f64()
    );
    // The rate is printed, not asserted: a loaded or emulated machine churns slower, and
    // what must hold is below.
    assert_eq!(exits, WORKERS, "one exit line per worker; stderr: {stderr}");
    assert_eq!(ids.len(), WORKERS, "no worker summarised twice");
    assert!(
        growth < 10 * 1024 * 1024,
        "the agent grew by {growth} bytes over {WORKERS} workers"
    );
    assert!(
        entries < 200,
        "{entries} CPU_STATS entries left after {WORKERS} workers came and went"
    );
    assert!(
        !stderr.contains("warning:"),
        "a drop warning during churn: {stderr}"
    );
}
