//! Containers by their names, with Debian's real podman and runc: a named container that
//! burns a known amount of CPU and one that lives a fraction of a second, seen by `top`,
//! `snapshot`, `watch` and `/metrics` under the names `podman run --name` gave them, and the
//! CPU of the first against its cgroup's own `cpu.stat`; `--workers container:GLOB` picks
//! them by those names.
//!
//! The image is made here, without a registry: `podman import` of a tarball holding only
//! busybox-static (installed by `cargo xtask setup`).

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use workerprobe::cgroup;
use workerprobe_tests::{KillOnDrop, require_root, start_agent, workerprobe_path};

const PODMAN: &str = "/usr/bin/podman";
/// Debian's busybox-static: one static binary, the whole of the image.
const BUSYBOX: &str = "/bin/busybox";
const IMAGE: &str = "localhost/workerprobe-test-busybox:1";

/// podman's defaults exceed this host's hard limits, and crun refuses its hybrid cgroups:
/// runc it is. No network: the containers only compute.
const RUN: &[&str] = &[
    "run",
    "--runtime",
    "runc",
    "--network",
    "none",
    "--ulimit",
    "nofile=1024:1024",
    "--ulimit",
    "nproc=1000:1000",
];

fn podman(args: &[&str]) -> String {
    let output = Command::new(PODMAN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|err| panic!("run podman {args:?}: {err}"));
    assert!(
        output.status.success(),
        "podman {args:?} failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// Imports the busybox image once per test run (podman keeps it between runs).
fn import_image() {
    let dir = std::env::temp_dir().join(format!("wp-image-{}", std::process::id()));
    let bin = dir.join("rootfs/bin");
    std::fs::create_dir_all(&bin).expect("make the rootfs");
    std::fs::copy(BUSYBOX, bin.join("busybox")).expect("copy busybox-static");
    for applet in ["sh", "sleep"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).expect("link an applet");
    }
    let tarball = dir.join("rootfs.tar");
    let status = Command::new("tar")
        .arg("-C")
        .arg(dir.join("rootfs"))
        .arg("-cf")
        .arg(&tarball)
        .arg(".")
        .status()
        .expect("run tar");
    assert!(status.success(), "tar of the rootfs failed");
    // The last run's image goes first: re-tagging would leave it behind, nameless.
    let _ = Command::new(PODMAN)
        .args(["rmi", "--force", IMAGE])
        .stdin(Stdio::null())
        .output();
    podman(&["import", tarball.to_str().expect("UTF-8 path"), IMAGE]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A shell loop of `iterations` additions: CPU time, in the container, no wall-clock wait.
fn spin(iterations: u64) -> String {
    format!("i=0; while [ $i -lt {iterations} ]; do i=$((i+1)); done")
}

/// The cgroup2 directory of a running container, from its init's /proc/PID/cgroup.
fn container_cgroup(name: &str) -> PathBuf {
    let pid = podman(&["inspect", "--format", "{{.State.Pid}}", name]);
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("read its cgroup");
    let relative = text
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .expect("a cgroup2 line");
    let mount = cgroup::find_cgroup2_mount().expect("cgroup2 mount");
    mount.join(relative.trim_start_matches('/'))
}

/// `cpu.stat` usage of `dir` once it stops growing (the container went to sleep).
fn settled_usage_usec(dir: &Path, limit: Duration) -> u64 {
    let started = Instant::now();
    let mut last = u64::MAX;
    loop {
        let now = cgroup::read_cpu_stat(dir)
            .unwrap_or_else(|| panic!("read {}/cpu.stat", dir.display()))
            .usage_usec;
        if now == last && now > 0 {
            return now;
        }
        assert!(started.elapsed() < limit, "the container never went idle");
        last = now;
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// The one worker of `document`'s `workers` whose name is `name`.
fn worker_named<'a>(workers: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    let found: Vec<&serde_json::Value> = workers.iter().filter(|w| w["name"] == name).collect();
    // All of them when it is missing: unnamed (its name not read in time) or not there at all.
    let seen: Vec<(&serde_json::Value, &serde_json::Value)> =
        workers.iter().map(|w| (&w["name"], &w["ids"])).collect();
    assert_eq!(
        found.len(),
        1,
        "workers named {name}: {found:?}; all workers (name, ids): {seen:?}"
    );
    found[0]
}

fn assert_named_podman(worker: &serde_json::Value, name: &str, id: &str) {
    assert_eq!(worker["kind"], "podman", "{worker}");
    assert_eq!(worker["ids"]["runtime"], "podman", "{worker}");
    assert_eq!(worker["ids"]["container_id"], id, "{worker}");
    assert_eq!(worker["ids"]["container_name"], name, "{worker}");
    assert_eq!(worker["ids"]["image"], IMAGE, "{worker}");
    assert!(
        worker["path"]
            .as_str()
            .is_some_and(|path| path.contains(id)),
        "{worker}"
    );
}

/// `GET /metrics` over HTTP/1.0 (so the answer is not chunked).
fn metrics(addr: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to serve");
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("send");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read");
    text
}

#[test]
fn podman_containers_appear_by_their_names() {
    require_root();
    import_image();
    // Leftovers of an interrupted run would make the names ambiguous.
    // One name a call: podman 4.3 removes nothing when one of several names is missing.
    for name in ["wp-test-burn", "wp-test-short"] {
        let _ = Command::new(PODMAN)
            .args(["rm", "-f", "-t", "0", name])
            .output();
    }

    let mut serve = KillOnDrop(
        Command::new(workerprobe_path())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start serve"),
    );
    let mut serve_err = BufReader::new(serve.0.stderr.take().expect("stderr"));
    let addr = loop {
        let mut line = String::new();
        assert!(
            serve_err.read_line(&mut line).expect("read serve") > 0,
            "serve ended before serving"
        );
        if let Some(rest) = line.trim().strip_prefix("workerprobe: serving http://") {
            break rest.trim_end_matches("/metrics").to_string();
        }
    };
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = serve_err.read_to_string(&mut rest);
    });
    let mut watch = KillOnDrop(start_agent(
        &[
            "watch",
            "--json",
            "--duration",
            "300s",
            "--workers",
            "container:wp-test-*",
        ],
        "attached",
    ));
    let watch_out = BufReader::new(watch.0.stdout.take().expect("stdout"));
    let watch_lines = std::thread::spawn(move || {
        watch_out
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<String>>()
    });
    let mut snapshot = start_agent(
        &[
            "snapshot",
            "--json",
            "--duration",
            "20s",
            "--workers",
            "container:wp-test-*",
        ],
        "attached",
    );

    // One that lives well under a second, gone before any agent's next tick.
    let mut run_short: Vec<&str> = RUN.to_vec();
    let short_spin = spin(20_000);
    run_short.extend([
        "--rm",
        "--name",
        "wp-test-short",
        IMAGE,
        "sh",
        "-c",
        &short_spin,
    ]);
    let started = Instant::now();
    podman(&run_short);
    eprintln!("the short container ran for {:?}", started.elapsed());

    // One that burns, then sleeps, so its cgroup's own count can be read after.
    let mut run_burn: Vec<&str> = RUN.to_vec();
    // Long enough for `top` below to attach and watch a whole interval on a loaded machine
    // (a debug agent takes seconds to attach while a VM runs beside it).
    let burn = format!("{}; exec sleep 600", spin(3_000_000));
    run_burn.extend(["-d", "--name", "wp-test-burn", IMAGE, "sh", "-c", &burn]);
    let burn_id = podman(&run_burn);
    let burn_dir = container_cgroup("wp-test-burn");

    // While it burns, `top` names it.
    let top = Command::new(workerprobe_path())
        .args(["top", "--once", "--workers", "*libpod*"])
        .output()
        .expect("run top");
    let top_text = String::from_utf8_lossy(&top.stdout);
    assert!(top.status.success(), "top failed: {top:?}");
    assert!(
        top_text.lines().any(|line| line.contains("wp-test-burn")),
        "top does not name the container:\n{top_text}"
    );

    let burn_usec = settled_usage_usec(&burn_dir, Duration::from_secs(120));
    let exposition = metrics(&addr);
    let info = exposition
        .lines()
        .find(|line| {
            line.starts_with("workerprobe_worker_info{")
                && line.contains("container_name=\"wp-test-burn\"")
        })
        .unwrap_or_else(|| panic!("no worker_info for wp-test-burn in:\n{exposition}"));
    for label in [
        "name=\"wp-test-burn\"",
        "kind=\"podman\"",
        "runtime=\"podman\"",
        &format!("container_id=\"{burn_id}\""),
        &format!("image=\"{IMAGE}\""),
    ] {
        assert!(info.contains(label), "{label} missing in {info}");
    }

    let snapshot_out = {
        let mut text = String::new();
        snapshot
            .stdout
            .take()
            .expect("stdout")
            .read_to_string(&mut text)
            .expect("read snapshot");
        assert!(snapshot.wait().expect("wait").success(), "snapshot failed");
        text
    };
    let document: serde_json::Value =
        serde_json::from_str(&snapshot_out).expect("snapshot is JSON");
    let workers = document["workers"].as_array().expect("workers");
    let burned = worker_named(workers, "wp-test-burn");
    assert_named_podman(burned, "wp-test-burn", &burn_id);
    let ours_usec = burned["cpu"]["seconds"].as_f64().expect("cpu seconds") * 1e6;
    let error = (ours_usec - burn_usec as f64).abs() / burn_usec as f64;
    eprintln!("wp-test-burn: {ours_usec:.0} µs, cpu.stat {burn_usec} µs");
    assert!(
        error < 0.01,
        "wp-test-burn: {ours_usec:.0} µs against cpu.stat's {burn_usec} µs"
    );
    // The short one is named too, though its cgroup was gone long before the window ended.
    let short = worker_named(workers, "wp-test-short");
    assert_eq!(short["kind"], "podman", "{short}");
    assert_eq!(short["ids"]["image"], IMAGE, "{short}");
    assert!(
        short["cpu"]["seconds"].as_f64().unwrap_or(0.0) > 0.0,
        "{short}"
    );

    podman(&["rm", "-f", "-t", "0", "wp-test-burn"]);
    // The watch's exit summaries name both, under the same names.
    let deadline = Instant::now() + Duration::from_secs(30);
    while burn_dir.exists() {
        assert!(Instant::now() < deadline, "the container's cgroup stayed");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill(2) on our own children.
    unsafe {
        libc::kill(watch.0.id() as i32, libc::SIGINT);
        libc::kill(serve.0.id() as i32, libc::SIGTERM);
    }
    assert!(
        watch.0.wait().expect("wait watch").success(),
        "watch failed"
    );
    let _ = serve.0.wait();
    let exits: Vec<serde_json::Value> = watch_lines
        .join()
        .expect("watch reader")
        .iter()
        .map(|line| serde_json::from_str(line).expect("JSON line"))
        .filter(|line: &serde_json::Value| line["type"] == "exit")
        .collect();
    let burn_exit = worker_named(&exits, "wp-test-burn");
    assert_named_podman(burn_exit, "wp-test-burn", &burn_id);
    let short_exit = worker_named(&exits, "wp-test-short");
    assert_eq!(short_exit["ids"]["container_name"], "wp-test-short");
}
