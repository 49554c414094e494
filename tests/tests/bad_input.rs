//! Bad input through the real binary: every flag value a user can get wrong ends in one
//! sentence naming the flag and exit code 2, never a panic; a corrupt recording line is skipped
//! and counted. No root needed (the flag values are refused before anything is loaded), except
//! where a test says so.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    sync::mpsc,
    time::Duration,
};

use workerprobe_tests::{require_root, temp_path, workerprobe_path};

/// Longest a refused command may take: it must stop at the flags, long before any window.
const DEADLINE: Duration = Duration::from_secs(20);

/// Runs `workerprobe ARGS…` in `dir` with stdin closed; panics if it outlives [`DEADLINE`].
fn run_in(dir: &Path, args: &[&str]) -> Output {
    let child = Command::new(workerprobe_path())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start workerprobe");
    let pid = child.id();
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match result.recv_timeout(DEADLINE) {
        Ok(output) => output.expect("wait for workerprobe"),
        Err(_) => {
            // SAFETY: kill has no memory preconditions; the pid is our child's.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!(
                "`workerprobe {}` ran longer than {DEADLINE:?}",
                args.join(" ")
            );
        }
    }
}

/// A directory of files the cases name: `rec.jsonl` (a small valid recording) and `adir/`.
struct Fixture {
    dir: PathBuf,
}

impl Fixture {
    fn new(test: &str) -> Self {
        let dir = temp_path(test, "dir");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("adir")).expect("make the fixture directory");
        std::fs::write(
            dir.join("rec.jsonl"),
            recording(&[&tick_line(1, 10), &tick_line(2, 11)]),
        )
        .expect("write the recording");
        std::fs::write(dir.join("notes.txt"), "my notes\n").expect("write a foreign file");
        Fixture { dir }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A header line as docs/recording.md describes it.
const HEADER: &str = r#"{"type":"header","schema_version":1,"format":"workerprobe-recording","agent_version":"0.1.0","node":{"hostname":"vm","kernel":"6.18","cpus":2,"cpu_model":"x","memory_bytes":1,"boot_time_epoch_secs":1},"started":{"monotonic_ns":1,"wall_unix_ns":1,"time":"1970-01-01T00:00:00.000000001Z"},"run_started":{"monotonic_ns":1,"wall_unix_ns":1,"time":"1970-01-01T00:00:00.000000001Z"},"part":0,"interval_seconds":1.0,"worker_patterns":[],"programs":["cpu"]}"#;

/// One worker's tick line ending at `end_s` seconds.
fn tick_line(tick: u64, end_s: u64) -> String {
    let (start, end) = ((end_s - 1) * 1_000_000_000, end_s * 1_000_000_000);
    let total = tick * 500_000_000;
    format!(
        concat!(
            r#"{{"type":"tick","schema_version":1,"tick":{tick},"#,
            r#""start":{{"monotonic_ns":{start},"wall_unix_ns":{start},"time":"1970-01-01T00:00:{s:02}Z"}},"#,
            r#""end":{{"monotonic_ns":{end},"wall_unix_ns":{end},"time":"1970-01-01T00:00:{e:02}Z"}},"#,
            r#""interval_seconds":1.0,"cgroup_id":7,"path":"/demo.slice/job.service","name":"job","kind":"systemd_service","#,
            r#""cpu":{{"seconds":0.5,"per_cpu_seconds":[0.5,0.0],"user_seconds":null,"system_seconds":null,"voluntary_switches":1,"involuntary_switches":0}},"#,
            r#""time":{{"on_cpu_seconds":0.5,"runqueue_wait_seconds":0.0,"blocked_io_seconds":0.0,"sleep_seconds":0.0,"wakeups":0,"runqueue_waits":0}},"#,
            r#""net":{{"sent_bytes":0,"received_bytes":0,"sent_calls":0,"received_calls":0}},"#,
            r#""memory":null,"#,
            r#""totals":{{"on_cpu_ns":{total},"on_cpu_ns_per_cpu":[{total},0],"voluntary_switches":5,"involuntary_switches":0,"runqueue_wait_ns":0,"blocked_io_ns":0,"sleep_ns":0,"wakeups":0,"sent_bytes":0,"received_bytes":0,"cpu_stat":null}},"#,
            r#""drops":{{}},"drops_total":{{}}}}"#
        ),
        tick = tick,
        start = start,
        end = end,
        s = end_s - 1,
        e = end_s,
        total = total,
    )
}

/// A recording: the header, then `lines`, each ending with a newline.
fn recording(lines: &[&str]) -> String {
    std::iter::once(HEADER)
        .chain(lines.iter().copied())
        .map(|line| format!("{line}\n"))
        .collect()
}

/// Asserts that stderr has no panic or backtrace in it.
fn assert_no_panic(args: &[&str], stderr: &str) {
    // Nor a parser's own text without the form expected.
    for text in [
        "panicked",
        "RUST_BACKTRACE",
        "stack backtrace",
        "invalid digit",
        "number too large",
    ] {
        assert!(
            !stderr.contains(text),
            "`workerprobe {}` printed {text:?}: {stderr}",
            args.join(" ")
        );
    }
}

/// Asserts a usage error: exit 2, clap's message naming `flag`, no panic.
fn assert_refused(output: &Output, args: &[&str], flag: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let shown = args.join(" ");
    assert_eq!(
        output.status.code(),
        Some(2),
        "`workerprobe {shown}` should exit 2: {stderr}"
    );
    assert_no_panic(args, &stderr);
    assert!(
        stderr.starts_with("error:") && stderr.contains(flag),
        "`workerprobe {shown}`: clap's message should name {flag}: {stderr}"
    );
    assert!(
        stderr.lines().filter(|l| !l.trim().is_empty()).count() <= 6,
        "`workerprobe {shown}`: a short message, not a dump: {stderr}"
    );
}

/// Asserts one of workerprobe's own sentences: exactly one line, starting `Error:`, no panic.
fn assert_one_sentence(output: &Output, args: &[&str], expected: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_no_panic(args, &stderr);
    assert_eq!(
        stderr.lines().count(),
        1,
        "`workerprobe {}`: one sentence: {stderr}",
        args.join(" ")
    );
    assert!(
        stderr.starts_with("Error: ") && stderr.contains(expected),
        "`workerprobe {}`: expected {expected:?} in {stderr}",
        args.join(" ")
    );
}

/// Every bad flag value found in the audit, with the flag the message must name.
const CASES: &[(&[&str], &str)] = &[
    // Intervals: not a duration, zero, too short, empty, out of range.
    (&["top", "--interval", "fast"], "--interval"),
    (&["top", "--interval", "10ms"], "--interval"),
    (&["top", "--interval", "0s"], "--interval"),
    (&["top", "--interval", ""], "--interval"),
    (
        &["top", "--interval", "99999999999999999999s"],
        "--interval",
    ),
    (&["watch", "--interval", "1ms"], "--interval"),
    (&["serve", "--interval", "1ms"], "--interval"),
    (
        &["record", "--out", "r.jsonl", "--interval", "1ms"],
        "--interval",
    ),
    // Durations.
    (&["snapshot", "--duration", "0"], "--duration"),
    (&["snapshot", "--duration", "1x"], "--duration"),
    (&["watch", "--duration", "0s"], "--duration"),
    (
        &["record", "--out", "r.jsonl", "--duration", "0s"],
        "--duration",
    ),
    (&["serve", "--exit-grace", "0"], "--exit-grace"),
    (&["serve", "--exit-grace", "soon"], "--exit-grace"),
    // Listen addresses: no port, a name, a port out of range.
    (&["serve", "--listen", "localhost"], "--listen"),
    (&["serve", "--listen", "127.0.0.1"], "--listen"),
    (&["serve", "--listen", "127.0.0.1:99999"], "--listen"),
    (&["serve", "--listen", ""], "--listen"),
    // Worker patterns.
    (&["top", "--workers", ""], "--workers"),
    (&["top", "--workers", "[a"], "--workers"),
    (&["snapshot", "--workers", "a{b"], "--workers"),
    (&["snapshot", "--worker", "a{b"], "--workers"),
    (&["snapshot", "--workers", "container:"], "--workers"),
    (&["watch", "--workers", "pod:[x"], "--workers"),
    (&["snapshot", "--node-name", "a b"], "--node-name"),
    (&["serve", "--node-name", ""], "--node-name"),
    (&["replay", "rec.jsonl", "--worker", "[a"], "--workers"),
    (&["replay", "rec.jsonl", "--workers", "[a"], "--workers"),
    (
        &["plot", "rec.jsonl", "--out", "x.svg", "--worker", ""],
        "--workers",
    ),
    // Names.
    (&["exec", "--name", "a/b", "--", "true"], "--name"),
    (&["exec", "--name", "", "--", "true"], "--name"),
    (&["exec", "--name", "..", "--", "true"], "--name"),
    (
        &[
            "exec",
            "--name",
            "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
            "--",
            "true",
        ],
        "--name",
    ),
    // Numbers.
    (&["top", "--max-workers", "0"], "--max-workers"),
    (&["top", "--max-workers", "99999999"], "--max-workers"),
    (&["top", "--limit", "0"], "--limit"),
    (&["top", "--limit", "x"], "--limit"),
    (&["snapshot", "--depth", "two"], "--depth"),
    (&["top", "--depth", "65"], "--depth"),
    (
        &["record", "--out", "r.jsonl", "--rotate-mb", "0"],
        "--rotate-mb",
    ),
    (
        &["plot", "rec.jsonl", "--out", "x.svg", "--busiest", "0"],
        "--busiest",
    ),
    (
        &["report", "rec.jsonl", "--out", "x.html", "--busiest", "999"],
        "--busiest",
    ),
    (&["top", "--programs", "bogus"], "--programs"),
    (&["top", "--programs", "cpu,,net"], "--programs"),
    // Times in a recording.
    (&["replay", "rec.jsonl", "--at", "bogus"], "--at"),
    (
        &["plot", "rec.jsonl", "--out", "x.svg", "--from", "bogus"],
        "--from",
    ),
    (
        &["trace", "rec.jsonl", "--out", "x.json", "--to", "later"],
        "--to",
    ),
    // Numbers: the form expected, never the number parser's own text.
    (
        &["record", "--out", "r.jsonl", "--rotate-mb", "abc"],
        "not a whole number from 1 to 1000000",
    ),
    (
        &["top", "--max-workers", "1e3"],
        "not a whole number from 1 to 1048576",
    ),
    (
        &["plot", "rec.jsonl", "--out", "x.svg", "--busiest", "x"],
        "not a whole number from 1 to 200",
    ),
    // Files to write: in a directory that does not exist, or a directory.
    (&["record", "--out", "no/such/dir/r.jsonl"], "--out"),
    (&["record", "--out", "adir"], "--out"),
    (&["record", "--out", "adir/"], "--out"),
    (&["plot", "rec.jsonl", "--out", "no/such/x.svg"], "--out"),
    (&["plot", "rec.jsonl", "--out", "adir"], "--out"),
    (&["trace", "rec.jsonl", "--out", "no/such/x.json"], "--out"),
    (&["trace", "rec.jsonl", "--out", "adir"], "--out"),
    (&["report", "rec.jsonl", "--out", "no/such/x.html"], "--out"),
    (&["report", "rec.jsonl", "--out", "adir"], "--out"),
    (
        &["exec", "--output", "no/such/o.txt", "--", "true"],
        "--output",
    ),
    (&["exec", "--output", "adir", "--", "true"], "--output"),
    // Recordings to read: missing, or a directory.
    (&["replay", "missing.jsonl"], "<FILE>"),
    (&["replay", "adir"], "<FILE>"),
    (&["plot", "missing.jsonl", "--out", "x.svg"], "<FILE>"),
    (&["trace", "adir", "--out", "x.json"], "<FILE>"),
    (&["report", "missing.jsonl", "--out", "x.html"], "<FILE>"),
    // Missing values and unknown words.
    (&["record"], "--out"),
    (&["exec"], "<CMD>"),
    (&["bogus-command"], "bogus-command"),
];

#[test]
fn every_bad_flag_value_names_the_flag_and_exits_2() {
    let fixture = Fixture::new("bad-flags");
    for &(args, flag) in CASES {
        let output = run_in(&fixture.dir, args);
        assert_refused(&output, args, flag);
    }
    // Nothing was written where a refused command was pointed.
    for name in ["r.jsonl", "x.svg", "x.json", "x.html", "o.txt"] {
        assert!(
            !fixture.dir.join(name).exists(),
            "a refused command wrote {name}"
        );
    }
}

#[test]
fn plot_refuses_a_name_of_another_format() {
    let fixture = Fixture::new("plot-png");
    let args = &["plot", "rec.jsonl", "--out", "x.png"];
    let output = run_in(&fixture.dir, args);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert_one_sentence(&output, args, "plot draws SVG, not .png");
    assert!(!fixture.dir.join("x.png").exists(), "SVG written as x.png");
}

#[test]
fn record_adds_to_a_recording_only_with_append_and_never_to_other_files() {
    let fixture = Fixture::new("record-append");
    for (args, expected, file) in [
        (
            &["record", "--out", "rec.jsonl"][..],
            "add --append",
            "rec.jsonl",
        ),
        (
            &["record", "--out", "notes.txt", "--append"],
            "not a workerprobe recording",
            "notes.txt",
        ),
        // plot draws SVG and never writes it under another format's name.
        (
            &["plot", "rec.jsonl", "--out", "notes.txt"],
            "give a file name ending in .svg",
            "notes.txt",
        ),
    ] {
        let before = std::fs::read(fixture.dir.join(file)).expect("read");
        let output = run_in(&fixture.dir, args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        assert_one_sentence(&output, args, expected);
        assert_eq!(
            std::fs::read(fixture.dir.join(file)).expect("read"),
            before,
            "{file} changed"
        );
    }
}

#[test]
fn a_corrupt_recording_line_is_skipped_and_counted() {
    let fixture = Fixture::new("corrupt-line");
    let path = fixture.dir.join("corrupt.jsonl");
    std::fs::write(
        &path,
        recording(&[
            &tick_line(1, 10),
            "{\"type\":\"tick\",\"tick\":2,",
            &tick_line(2, 11),
        ]),
    )
    .expect("write the recording");
    let args = ["replay", "corrupt.jsonl"];
    let output = run_in(&fixture.dir, &args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "replay failed: {stderr}");
    assert_no_panic(&args, &stderr);
    assert!(stderr.contains("skipped 1 corrupt line"), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        stdout.matches("/demo.slice/job.service").count(),
        2,
        "both whole ticks are shown: {stdout}"
    );
}

#[test]
fn binary_garbage_after_the_header_is_skipped_not_fatal() {
    let fixture = Fixture::new("garbage");
    let mut bytes = recording(&[&tick_line(1, 10)]).into_bytes();
    bytes.extend_from_slice(b"\x00\xff\xfe{\"type\":\n\xc3\x28garbage\n");
    bytes.extend_from_slice(tick_line(2, 11).as_bytes());
    // The last line cut short, as a kill mid-write leaves it.
    bytes.extend_from_slice(b"\n{\"type\":\"tick\",\"schema_version\":1,\"tick\":3,\"sta");
    std::fs::write(fixture.dir.join("garbage.jsonl"), bytes).expect("write");
    for args in [
        &["replay", "garbage.jsonl"][..],
        &["replay", "garbage.jsonl", "--json"],
        &["trace", "garbage.jsonl", "--out", "t.json"],
    ] {
        let output = run_in(&fixture.dir, args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "{args:?}: {stderr}");
        assert_no_panic(args, &stderr);
        if args[0] == "replay" {
            assert!(stderr.contains("skipped 3 corrupt line"), "{stderr}");
        }
    }
}

#[test]
fn files_that_are_not_recordings_are_refused_with_one_sentence() {
    let fixture = Fixture::new("not-recordings");
    let newer = HEADER.replace(r#""schema_version":1"#, r#""schema_version":99"#);
    for (name, text, expected) in [
        ("empty.jsonl", String::new(), "is empty"),
        (
            "foreign.jsonl",
            "[package]\nname = \"x\"\n".to_owned(),
            "is not a workerprobe recording",
        ),
        (
            "newer.jsonl",
            format!("{newer}\n"),
            "newer than the 4 this workerprobe reads",
        ),
        ("no-ticks.jsonl", recording(&[]), "holds no ticks"),
    ] {
        std::fs::write(fixture.dir.join(name), text).expect("write");
        let args = ["replay", name];
        let output = run_in(&fixture.dir, &args);
        // A file that is not a recording is the user's input; today `replay` exits 1 for it
        // (the reader's error is not a `UserError::BadInput`), 2 once it is.
        assert!(
            matches!(output.status.code(), Some(1 | 2)),
            "{name}: {:?}",
            output.status
        );
        assert_one_sentence(&output, &args, expected);
    }
}

#[test]
fn an_unknown_user_is_one_sentence_and_exit_2() {
    // Resolving the user comes after the privilege checks.
    require_root();
    let fixture = Fixture::new("unknown-user");
    let args = [
        "snapshot",
        "--duration",
        "100ms",
        "--user",
        "no-such-user-wp",
    ];
    let output = run_in(&fixture.dir, &args);
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    assert_one_sentence(&output, &args, "--user");
}

#[test]
fn a_worker_pattern_matching_nothing_in_a_recording_is_bad_input() {
    let fixture = Fixture::new("unknown-worker");
    // One spelling everywhere: --workers (as on the live commands), --worker accepted too.
    for args in [
        &["replay", "rec.jsonl", "--worker", "/nope"][..],
        &["replay", "rec.jsonl", "--workers", "/nope"],
        &["plot", "rec.jsonl", "--out", "x.svg", "--worker", "/nope"],
        &[
            "report",
            "rec.jsonl",
            "--out",
            "x.html",
            "--workers",
            "/nope",
        ],
    ] {
        let output = run_in(&fixture.dir, args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        assert_one_sentence(&output, args, "/nope");
    }
}

#[test]
fn merge_refuses_what_it_cannot_merge_with_one_sentence_and_writes_nothing() {
    let fixture = Fixture::new("merge-refusals");
    std::fs::write(fixture.dir.join("notes.txt"), "hello\n").expect("write");
    // The same node (this header's host, no --node-name) in two files at once.
    std::fs::copy(
        fixture.dir.join("rec.jsonl"),
        fixture.dir.join("again.jsonl"),
    )
    .expect("copy");
    for (args, expected) in [
        (
            &["merge", "rec.jsonl", "notes.txt", "--out", "m.jsonl"][..],
            "notes.txt is not a workerprobe recording",
        ),
        (
            &["merge", "rec.jsonl", "again.jsonl", "--out", "m.jsonl"],
            "rec.jsonl and again.jsonl both hold node `vm` at the same time",
        ),
        (
            &["merge", "rec.jsonl", "./rec.jsonl", "--out", "m.jsonl"],
            "./rec.jsonl is given twice",
        ),
        (
            &["merge", "rec.jsonl", "again.jsonl", "--out", "again.jsonl"],
            "--out again.jsonl is one of the recordings to merge",
        ),
    ] {
        let output = run_in(&fixture.dir, args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {output:?}");
        assert_one_sentence(&output, args, expected);
        assert!(
            !fixture.dir.join("m.jsonl").exists(),
            "{args:?} left a file"
        );
        let leftovers: Vec<_> = std::fs::read_dir(&fixture.dir)
            .expect("list")
            .filter_map(|entry| entry.ok())
            .filter(|entry| entry.file_name().to_string_lossy().contains(".partial-"))
            .collect();
        assert!(leftovers.is_empty(), "{args:?} left {leftovers:?}");
    }
    let args = ["merge", "--out", "m.jsonl"];
    assert_refused(&run_in(&fixture.dir, &args), &args, "<FILES>");
}
