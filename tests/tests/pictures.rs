//! `workerprobe plot`, `trace` and `report` end to end, from a recording of real workers:
//! the SVG is well-formed XML with one series per worker, the trace meets the trace-event
//! format, the HTML page renders in headless Chromium to a picture that is not blank, and
//! bad input is refused with one sentence.
//!
//! Series are counted by the marks `plot` puts on them (documented in
//! `sink::picture::svg`): `<g class="series" data-panel="P" data-worker="PATH">` per worker
//! per panel, `<g class="gantt-row" …>` per Gantt row.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use workerprobe_tests::{
    TestCgroup, read_first_json_line, require_root, start_agent, wait_json, workerprobe_path,
};

/// A fresh path in the temp directory for this test.
fn temp_path(name: &str) -> PathBuf {
    workerprobe_tests::temp_path("pictures", name)
}

/// How long Chromium may take to draw the page before it is killed.
const CHROMIUM_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts `workerprobe record --out out` with `extra` flags and returns once it records.
fn start_record(out: &Path, extra: &[&str]) -> Child {
    let mut args: Vec<&std::ffi::OsStr> =
        vec!["record".as_ref(), "--out".as_ref(), out.as_os_str()];
    args.extend(extra.iter().map(|arg| std::ffi::OsStr::new(*arg)));
    start_agent(&args, "recording to")
}

/// `workerprobe COMMAND args…`.
fn workerprobe(command: &str, args: &[&str]) -> Output {
    Command::new(workerprobe_path())
        .arg(command)
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("run workerprobe {command}: {err}"))
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn text(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Records ~3 s of three workers: a sender that also spins, a receiver, and a short one
/// made and removed during the run (so it has an exit line). Returns the recording and the
/// workers' paths.
fn record_three_workers() -> (PathBuf, Vec<String>) {
    let out = temp_path("run.jsonl");
    let pattern = format!("/workerprobe-test-{}-pic-*", std::process::id());
    let agent = start_record(
        &out,
        &[
            "--interval",
            "200ms",
            "--duration",
            "3s",
            "--workers",
            &pattern,
        ],
    );
    let sender = TestCgroup::new("pic-send");
    let receiver = TestCgroup::new("pic-recv");
    let mut recv = receiver.spawn_workload(&["recv", "tcp", "127.0.0.1:0", "0"]);
    let addr = read_first_json_line(&mut recv)["addr"]
        .as_str()
        .expect("addr")
        .to_string();
    let send = sender.spawn_workload(&["send", "tcp", &addr, "20000000", "65536"]);
    let short = TestCgroup::new("pic-short");
    let life = short.spawn_workload(&["life", "300"]);
    assert!(life.wait_with_output().expect("wait life").status.success());
    let paths: Vec<String> = [&sender, &receiver, &short]
        .iter()
        .map(|cgroup| {
            format!(
                "/{}",
                cgroup.dir.file_name().expect("name").to_string_lossy()
            )
        })
        .collect();
    drop(short); // removed during the run: its exit line is written a tick later
    wait_json(send);
    wait_json(recv);
    let spin = sender.spawn_workload(&["spin", "700", "1"]);
    assert!(spin.wait_with_output().expect("wait spin").status.success());
    let mut agent = agent;
    assert!(
        agent.wait().expect("wait for record").success(),
        "record failed"
    );
    drop((sender, receiver));
    let recording = std::fs::read_to_string(&out).expect("read recording");
    assert!(
        recording.contains(r#""type":"exit""#),
        "the short worker has no exit line"
    );
    (out, paths)
}

#[test]
fn plot_trace_and_report_draw_a_real_recording() {
    require_root();
    let chromium = chromium_path();
    let (recording, workers) = record_three_workers();

    // plot: well-formed XML, one series per worker in every panel.
    let svg_path = temp_path("plot.svg");
    let output = workerprobe("plot", &[text(&recording), "--out", text(&svg_path)]);
    assert!(
        output.status.success(),
        "plot failed: {}",
        stderr_of(&output)
    );
    assert_well_formed_xml(&svg_path);
    let svg = std::fs::read_to_string(&svg_path).expect("read svg");
    assert_eq!(svg.matches(r#"class="gantt-row""#).count(), 3, "Gantt rows");
    for worker in &workers {
        let mark = format!(r#"data-worker="{worker}""#);
        assert_eq!(
            svg.matches(&format!(r#"class="gantt-row" data-panel="gantt" {mark}"#))
                .count(),
            1,
            "{worker} in the Gantt"
        );
        for panel in ["cpu", "time-breakdown", "send", "receive", "memory"] {
            let series = format!(r#"class="series" data-panel="{panel}" {mark}"#);
            assert_eq!(svg.matches(&series).count(), 1, "{worker} in panel {panel}");
        }
    }
    for label in [
        "cores",
        "bytes/s",
        "time since the first tick (s)",
        "on CPU",
        "run-queue",
        "network",
    ] {
        assert!(svg.contains(label), "the plot has no {label:?}");
    }
    // Bytes in IEC units, as every text of workerprobe writes them.
    assert!(svg.contains("iB"), "no IEC unit in the plot");
    for si in [" kB<", " MB<", " GB<", " kB/s<", " MB/s<"] {
        assert!(!svg.contains(si), "an SI unit ({si:?}) in the plot");
    }
    // --worker keeps one; --from/--to cut the window.
    let one = temp_path("one.svg");
    let short_pattern = format!("*{}", workers[2].rsplit('-').next().expect("suffix"));
    let output = workerprobe(
        "plot",
        &[
            text(&recording),
            "--out",
            text(&one),
            "--worker",
            &short_pattern,
            "--from",
            "0.1",
            "--to",
            "600ms",
        ],
    );
    assert!(
        output.status.success(),
        "plot --worker failed: {}",
        stderr_of(&output)
    );
    let one = std::fs::read_to_string(&one).expect("read svg");
    assert_eq!(one.matches(r#"class="gantt-row""#).count(), 1);

    // trace: the trace-event format.
    let trace_path = temp_path("trace.json");
    let output = workerprobe("trace", &[text(&recording), "--out", text(&trace_path)]);
    assert!(
        output.status.success(),
        "trace failed: {}",
        stderr_of(&output)
    );
    check_trace(&trace_path, &workers);

    // report: self-contained, and Chromium draws it.
    let html_path = temp_path("report.html");
    let output = workerprobe("report", &[text(&recording), "--out", text(&html_path)]);
    assert!(
        output.status.success(),
        "report failed: {}",
        stderr_of(&output)
    );
    let page = std::fs::read_to_string(&html_path).expect("read html");
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "the report names an external address"
    );
    assert!(page.contains("<svg") && page.contains(r#"id="exits""#));
    let png = temp_path("report.png");
    screenshot(&chromium, &html_path, &png);
    let colors = distinct_colors(&png);
    assert!(
        colors > 2,
        "the report rendered blank: {colors} distinct colors in {}",
        png.display()
    );

    for path in [recording, svg_path, trace_path, html_path, png] {
        let _ = std::fs::remove_file(path);
    }
}

/// Parses the file with Python's XML parser (no Rust XML crate in this workspace).
fn assert_well_formed_xml(path: &Path) {
    let output = Command::new("python3")
        .args([
            "-c",
            "import sys, xml.dom.minidom; xml.dom.minidom.parse(sys.argv[1])",
            text(path),
        ])
        .output()
        .expect("run python3 (needed to check the SVG is XML)");
    assert!(
        output.status.success(),
        "{} is not well-formed XML: {}",
        path.display(),
        stderr_of(&output)
    );
}

/// Required fields, time order, one span per worker, and balanced B/E pairs.
fn check_trace(path: &Path, workers: &[String]) {
    let text = std::fs::read_to_string(path).expect("read trace");
    let document: serde_json::Value = serde_json::from_str(&text).expect("trace is JSON");
    assert_eq!(document["displayTimeUnit"], "ms");
    let events = document["traceEvents"]
        .as_array()
        .expect("traceEvents array");
    let mut last_ts = f64::NEG_INFINITY;
    let mut open_spans = 0i64;
    for event in events {
        for field in ["name", "ph", "ts", "pid", "tid"] {
            assert!(!event[field].is_null(), "{field} missing in {event}");
        }
        let ts = event["ts"].as_f64().expect("ts is a number");
        assert!(ts >= last_ts, "ts goes back at {event}");
        last_ts = ts;
        match event["ph"].as_str().expect("ph") {
            "X" => assert!(event["dur"].as_f64().expect("dur") > 0.0, "{event}"),
            "B" => open_spans += 1,
            "E" => open_spans -= 1,
            "M" | "C" | "i" => {}
            other => panic!("unexpected phase {other} in {event}"),
        }
        assert!(open_spans >= 0, "E before its B at {event}");
    }
    assert_eq!(open_spans, 0, "unbalanced B/E events");
    let spans: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(spans.len(), workers.len(), "one life span per worker");
    for worker in workers {
        assert_eq!(
            spans
                .iter()
                .filter(|span| span["args"]["path"] == worker.as_str())
                .count(),
            1,
            "{worker} has no life span"
        );
    }
    let exits = events
        .iter()
        .filter(|e| e["ph"] == "i" && e["name"] == "exit");
    assert!(exits.count() >= 1, "no exit instant event");
    for counter in ["cores", "time shares %", "net bytes/s", "memory bytes"] {
        assert!(
            events
                .iter()
                .any(|e| e["ph"] == "C" && e["name"] == counter),
            "no {counter} counter"
        );
    }
}

/// Chromium, or a panic saying how to install it: this test never passes without it.
fn chromium_path() -> PathBuf {
    let candidates = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    candidates
        .iter()
        .map(|dir| dir.join("chromium"))
        .chain([PathBuf::from("/usr/bin/chromium")])
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("chromium is not installed: run `cargo xtask setup`"))
}

/// Renders `html` to `png` with headless Chromium, killing it after [`CHROMIUM_TIMEOUT`].
fn screenshot(chromium: &Path, html: &Path, png: &Path) {
    let profile = std::env::temp_dir().join(format!("wp-pictures-{}-chromium", std::process::id()));
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1200,900",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", html.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|err| panic!("start {}: {err}", chromium.display()));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for chromium") {
            break status;
        }
        if started.elapsed() > CHROMIUM_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "chromium did not draw {} within {CHROMIUM_TIMEOUT:?}",
                html.display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = std::fs::remove_dir_all(&profile);
    assert!(status.success(), "chromium failed: {status}");
    let size = std::fs::metadata(png)
        .unwrap_or_else(|err| panic!("chromium wrote no {}: {err}", png.display()))
        .len();
    assert!(size > 4096, "{} is only {size} bytes", png.display());
}

/// Decodes an 8-bit PNG (zlib from Python's standard library) and prints how many distinct
/// pixel values it holds.
const COUNT_COLORS: &str = r#"
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat = 8, b""
while pos < len(data):
    length, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + length]
    if kind == b"IHDR":
        width, height, depth, color = struct.unpack(">IIBB", body[:10])
    elif kind == b"IDAT":
        idat += body
    pos += 12 + length
assert depth == 8, "bit depth %d" % depth
bpp = {0: 1, 2: 3, 4: 2, 6: 4}[color]
raw = zlib.decompress(idat)
stride = width * bpp
previous = bytearray(stride)
colors = set()
for row in range(height):
    start = row * (stride + 1)
    kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b = previous[i]
        c = previous[i - bpp] if i >= bpp else 0
        if kind == 1: line[i] = (line[i] + a) & 255
        elif kind == 2: line[i] = (line[i] + b) & 255
        elif kind == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif kind == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    if row % 4 == 0:
        for i in range(0, stride, bpp * 2):
            colors.add(bytes(line[i:i + bpp]))
    previous = line
print(len(colors))
"#;

/// How many distinct pixel values the PNG holds (sampled: every 4th row, every 2nd pixel).
fn distinct_colors(png: &Path) -> usize {
    let output = Command::new("python3")
        .args(["-c", COUNT_COLORS, text(png)])
        .output()
        .expect("run python3 (needed to decode the screenshot)");
    assert!(
        output.status.success(),
        "cannot decode {}: {}",
        png.display(),
        stderr_of(&output)
    );
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .expect("a count")
}

#[test]
fn bad_input_is_one_sentence() {
    let empty = temp_path("empty.jsonl");
    std::fs::write(&empty, "").expect("write empty file");
    let truncated = temp_path("truncated.jsonl");
    std::fs::write(
        &truncated,
        r#"{"type":"header","schema_version":1,"format":"workerpr"#,
    )
    .expect("write truncated file");
    let cargo_toml = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let missing = temp_path("missing.jsonl");
    let out = temp_path("bad.svg");
    let cases = [
        (&empty, "is empty"),
        (&truncated, "is not a workerprobe recording"),
        (&cargo_toml, "is not a workerprobe recording"),
        (&missing, "does not exist"),
    ];
    for command in ["plot", "trace", "report"] {
        for (input, expected) in &cases {
            let output = workerprobe(command, &[text(input), "--out", text(&out)]);
            let stderr = stderr_of(&output);
            // A file that is not a recording is bad input, like a bad flag value.
            assert_eq!(
                output.status.code(),
                Some(2),
                "{command} {}: {stderr}",
                input.display()
            );
            // One sentence (clap adds its "try --help" line to a bad argument).
            assert_eq!(
                stderr
                    .lines()
                    .filter(|line| !line.trim().is_empty() && !line.contains("--help"))
                    .count(),
                1,
                "{command} {}: {stderr}",
                input.display()
            );
            assert!(
                stderr.contains(expected),
                "{command} {}: {stderr}",
                input.display()
            );
            assert!(!stderr.contains("panicked"), "{stderr}");
            assert!(
                !out.exists(),
                "{command} wrote {} from bad input",
                out.display()
            );
        }
    }
    let output = workerprobe(
        "plot",
        &[text(&cargo_toml), "--out", text(&out), "--from", "soon"],
    );
    assert_eq!(
        output.status.code(),
        Some(2),
        "a bad --from is a usage error"
    );
    assert!(
        stderr_of(&output).contains("`soon` is not a time"),
        "{}",
        stderr_of(&output)
    );
    for path in [empty, truncated] {
        let _ = std::fs::remove_file(path);
    }
}
