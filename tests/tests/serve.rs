//! `workerprobe serve` end to end: a real Prometheus scraping the agent, the shipped Grafana
//! dashboard's every query asked of it, `promtool check metrics` on its exposition, a burst
//! of requests while workers run, exited workers' grace period, and the error sentences of
//! bad flags.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use workerprobe_tests::{
    TestCgroup, field, read_first_json_line, require_root, wait_for_cpu, wait_json,
    workerprobe_path,
};

/// Debian's `prometheus` package (installed by `cargo xtask setup`).
const PROMETHEUS: &str = "/usr/bin/prometheus";
/// `promtool`, from the same package.
const PROMTOOL: &str = "/usr/bin/promtool";

/// A running `workerprobe serve`, stopped with SIGTERM on drop.
struct Agent {
    child: Child,
    addr: SocketAddr,
}

impl Agent {
    /// Starts the agent on a free loopback port and waits until it says it is serving.
    fn start(extra: &[&str]) -> Self {
        require_root();
        let mut child = Command::new(workerprobe_path())
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start workerprobe serve");
        let stderr = BufReader::new(child.stderr.take().expect("stderr"));
        match wait_for_serving(stderr) {
            Ok(addr) => Self { child, addr },
            Err(said) => {
                let _ = child.kill();
                let status = child.wait().expect("wait for the agent");
                panic!("workerprobe serve ended ({status}) before serving; it said: {said}");
            }
        }
    }

    /// `GET path` on the agent.
    fn get(&self, path: &str) -> Response {
        http_get(self.addr, path, None)
    }

    /// The exposition in the classic text format, checked to be a 200.
    fn metrics(&self) -> String {
        let response = self.get("/metrics");
        assert_eq!(response.status, 200, "GET /metrics: {response:?}");
        response.body
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // SAFETY: kill has no memory-safety preconditions; the pid is our own child's.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads the agent's stderr until its "serving" line; the address it serves, or everything it
/// said if it ended first. Then keeps draining stderr so the agent never blocks on the pipe.
fn wait_for_serving(
    mut stderr: BufReader<std::process::ChildStderr>,
) -> Result<SocketAddr, String> {
    let mut said = String::new();
    loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap_or(0) == 0 {
            return Err(said);
        }
        said.push_str(&line);
        let addr = line
            .trim()
            .strip_prefix("workerprobe: serving http://")
            .and_then(|rest| rest.strip_suffix("/metrics"))
            .and_then(|addr| addr.parse().ok());
        if let Some(addr) = addr {
            std::thread::spawn(move || {
                let mut rest = String::new();
                let _ = stderr.read_to_string(&mut rest);
                if !rest.is_empty() {
                    eprintln!("agent stderr: {rest}");
                }
            });
            return Ok(addr);
        }
    }
}

/// An HTTP response, as far as the tests need it.
#[derive(Debug)]
struct Response {
    status: u16,
    /// Header lines, lower-cased.
    headers: String,
    body: String,
}

/// A tiny HTTP/1.1 GET over loopback (one request per connection).
fn http_get(addr: SocketAddr, path: &str, accept: Option<&str>) -> Response {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .unwrap_or_else(|err| panic!("connect to {addr}: {err}"));
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let accept = accept.map_or(String::new(), |accept| format!("Accept: {accept}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n"
    )
    .expect("send request");
    let mut raw = Vec::new();
    stream
        .read_to_end(&mut raw)
        .unwrap_or_else(|err| panic!("read response to GET {path}: {err}"));
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {text:?}"));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let headers = head.to_ascii_lowercase();
    let body = if headers.contains("transfer-encoding: chunked") {
        dechunk(body)
    } else {
        body.to_string()
    };
    Response {
        status,
        headers,
        body,
    }
}

/// Decodes a chunked body.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").expect("chunk size line");
        let size = usize::from_str_radix(size.trim(), 16).expect("chunk size");
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
}

/// Percent-encodes a query parameter.
fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// A port nobody listens on now (bound, then released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// A real Prometheus on loopback scraping one target every second; stopped and its data
/// removed on drop.
struct Prometheus {
    child: Child,
    addr: SocketAddr,
    dir: PathBuf,
}

impl Prometheus {
    fn start(target: SocketAddr) -> Self {
        assert!(
            Path::new(PROMETHEUS).exists(),
            "{PROMETHEUS} is missing: install Debian's prometheus package (`cargo xtask setup` does, or `apt-get install prometheus`)"
        );
        let dir =
            std::env::temp_dir().join(format!("workerprobe-prometheus-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).expect("make the Prometheus directory");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: workerprobe\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write prometheus.yml");
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port())
            .parse()
            .expect("address");
        let log = std::fs::File::create(dir.join("prometheus.log")).expect("log file");
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let prometheus = Self { child, addr, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
                && http_get(addr, "/-/ready", None).status == 200;
            if ready {
                return prometheus;
            }
            assert!(
                Instant::now() < deadline,
                "Prometheus not ready at {addr} within 60 s; its log: {}",
                prometheus.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }

    /// The value of an instant query that gives one series, or `None` when it gives none.
    fn query(&self, query: &str) -> Option<f64> {
        let path = format!("/api/v1/query?query={}", url_encode(query));
        let response = http_get(self.addr, &path, None);
        assert_eq!(response.status, 200, "{query}: {response:?}");
        let json: serde_json::Value = serde_json::from_str(&response.body)
            .unwrap_or_else(|err| panic!("{query}: {err} in {}", response.body));
        assert_eq!(json["status"], "success", "{query}: {json}");
        let result = json["data"]["result"].as_array().expect("result vector");
        assert!(result.len() <= 1, "{query} gave several series: {json}");
        let value = result.first()?["value"][1].as_str().expect("sample value");
        Some(value.parse().expect("a number"))
    }
}

impl Prometheus {
    /// Every series an instant query gives: its labels and value.
    fn query_all(&self, query: &str) -> Vec<(serde_json::Value, f64)> {
        let path = format!("/api/v1/query?query={}", url_encode(query));
        let response = http_get(self.addr, &path, None);
        assert_eq!(response.status, 200, "{query}: {response:?}");
        let json: serde_json::Value = serde_json::from_str(&response.body)
            .unwrap_or_else(|err| panic!("{query}: {err} in {}", response.body));
        assert_eq!(json["status"], "success", "{query}: {json}");
        json["data"]["result"]
            .as_array()
            .expect("result vector")
            .iter()
            .map(|series| {
                let value = series["value"][1].as_str().expect("sample value");
                (series["metric"].clone(), value.parse().expect("a number"))
            })
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The cgroup path (the `worker` label) of a test cgroup.
fn worker_label(cgroup: &TestCgroup) -> String {
    format!("/{}", cgroup.name())
}

/// The sum of a metric's samples whose labels contain `labels` (exposition text).
fn exposed(text: &str, name: &str, labels: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) || !rest.contains(labels) {
            continue;
        }
        let value: f64 = rest
            .rsplit_once(' ')
            .and_then(|(_, value)| value.parse().ok())
            .unwrap_or_else(|| panic!("no value in {line:?}"));
        *found.get_or_insert(0.0) += value;
    }
    found
}

/// The known work: `worker` burns 1.5 s of CPU, then sends 3 MB over TCP to a receiver in
/// `receiver`; returns what the sender counted.
fn spin_then_send(worker: &TestCgroup, receiver: &TestCgroup) -> serde_json::Value {
    let spin = worker.spawn_workload(&["spin", "1500", "1"]);
    assert!(spin.wait_with_output().expect("wait").status.success());
    let mut recv = receiver.spawn_workload(&["recv", "tcp", "127.0.0.1:0", "0"]);
    let addr = read_first_json_line(&mut recv)["addr"]
        .as_str()
        .expect("receiver address")
        .to_string();
    let send = worker.spawn_workload(&["send", "tcp", &addr, "3000000", "4096,65536,1000"]);
    let sent = wait_json(send);
    let _ = wait_json(recv);
    sent
}

#[test]
fn prometheus_scrapes_cpu_and_bytes_that_match_the_kernel() {
    let agent = Agent::start(&["--interval", "500ms"]);
    let prometheus = Prometheus::start(agent.addr);
    let worker = TestCgroup::new("serve-prom");
    let receiver = TestCgroup::new("serve-prom-recv");
    let label = worker_label(&worker);
    let cpu_query = format!("sum(workerprobe_cpu_seconds_total{{worker=\"{label}\"}})");
    let bytes_query =
        format!("sum(workerprobe_network_bytes_total{{worker=\"{label}\",direction=\"sent\"}})");

    // Before the work: Prometheus scrapes the agent, and the new worker has done nothing.
    let deadline = Instant::now() + Duration::from_secs(30);
    while prometheus.query("up{job=\"workerprobe\"}") != Some(1.0) {
        assert!(
            Instant::now() < deadline,
            "Prometheus never scraped the agent; its log: {}",
            prometheus.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let cpu_before = prometheus.query(&cpu_query).unwrap_or(0.0);
    let bytes_before = prometheus.query(&bytes_query).unwrap_or(0.0);

    let sent = spin_then_send(&worker, &receiver);
    let sent_bytes = field(&sent, "sent_bytes");
    let kernel_seconds = worker.cpu_stat().usage_usec as f64 / 1e6;

    // A few scrapes after the work has finished, the stored counters have caught up.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (cpu_rose, bytes_rose) = loop {
        let cpu = prometheus.query(&cpu_query).unwrap_or(0.0) - cpu_before;
        let bytes = prometheus.query(&bytes_query).unwrap_or(0.0) - bytes_before;
        let settled =
            (cpu - kernel_seconds).abs() <= 0.02 * kernel_seconds && bytes == sent_bytes as f64;
        if settled || Instant::now() >= deadline {
            break (cpu, bytes);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    eprintln!(
        "Prometheus: cpu rose {cpu_rose:.6}s (cpu.stat {kernel_seconds:.6}s), bytes rose {bytes_rose} (workload sent {sent_bytes})"
    );
    assert!(
        kernel_seconds > 1.2,
        "the spin used {kernel_seconds}s of CPU"
    );
    assert!(
        (cpu_rose - kernel_seconds).abs() <= 0.02 * kernel_seconds,
        "workerprobe_cpu_seconds_total rose by {cpu_rose}s, cpu.stat says {kernel_seconds}s"
    );
    assert_eq!(
        bytes_rose, sent_bytes as f64,
        "bytes sent, through Prometheus"
    );

    // The info metric joins on the same worker label.
    let info = prometheus.query(&format!(
        "workerprobe_worker_info{{worker=\"{label}\",kind=\"cgroup\"}}"
    ));
    assert_eq!(info, Some(1.0), "info metric of {label}");
    // Prometheus asked for OpenMetrics; the agent's own cost came through too.
    assert!(
        prometheus
            .query("workerprobe_agent_cpu_seconds_total")
            .is_some()
    );
    assert!(
        prometheus
            .query("workerprobe_agent_resident_memory_bytes")
            .is_some_and(|bytes| bytes > 1e6)
    );
}

#[test]
fn promtool_accepts_the_exposition() {
    assert!(
        Path::new(PROMTOOL).exists(),
        "{PROMTOOL} is missing: install Debian's prometheus package (`cargo xtask setup` does)"
    );
    let agent = Agent::start(&["--interval", "200ms"]);
    // A worker with CPU time, a histogram and bytes, so every family has samples.
    let worker = TestCgroup::new("serve-promtool");
    let receiver = TestCgroup::new("serve-promtool-recv");
    let mut recv = receiver.spawn_workload(&["recv", "tcp", "127.0.0.1:0", "0"]);
    let addr = read_first_json_line(&mut recv)["addr"]
        .as_str()
        .expect("receiver address")
        .to_string();
    let _ = wait_json(worker.spawn_workload(&["send", "tcp", &addr, "100000", "1000"]));
    let _ = wait_json(recv);
    let spin = worker.spawn_workload(&["spin", "200", "2"]);
    assert!(spin.wait_with_output().expect("wait").status.success());
    std::thread::sleep(Duration::from_millis(600));

    for (accept, expected_type) in [
        (None, "text/plain; version=0.0.4"),
        (Some("*/*"), "text/plain; version=0.0.4"),
        (
            Some("application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5"),
            "application/openmetrics-text; version=1.0.0",
        ),
    ] {
        let response = http_get(agent.addr, "/metrics", accept);
        assert_eq!(response.status, 200);
        assert!(
            response
                .headers
                .contains(&format!("content-type: {expected_type}")),
            "Accept {accept:?}: {}",
            response.headers
        );
        if expected_type.starts_with("text/plain") {
            let mut promtool = Command::new(PROMTOOL)
                .args(["check", "metrics"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("start promtool");
            promtool
                .stdin
                .take()
                .expect("stdin")
                .write_all(response.body.as_bytes())
                .expect("feed promtool");
            let output = promtool.wait_with_output().expect("promtool");
            assert!(
                output.status.success(),
                "promtool check metrics: {}{}\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr),
                response.body
            );
        } else {
            assert!(response.body.ends_with("# EOF\n"));
        }
    }

    let text = agent.metrics();
    let label = format!("worker=\"{}\"", worker_label(&worker));
    for family in [
        "workerprobe_cpu_seconds_total",
        "workerprobe_cpu_user_seconds_total",
        "workerprobe_cpu_system_seconds_total",
        "workerprobe_context_switches_total",
        "workerprobe_runqueue_wait_seconds_count",
        "workerprobe_blocked_seconds_total",
        "workerprobe_network_bytes_total",
        "workerprobe_network_calls_total",
        "workerprobe_memory_peak_bytes",
        "workerprobe_worker_info",
    ] {
        assert!(
            exposed(&text, family, &label).is_some(),
            "{family}{{{label}}} missing in\n{text}"
        );
    }
    for family in [
        "workerprobe_workers",
        "workerprobe_worker_exits_total",
        "workerprobe_map_drops_total",
        "workerprobe_collection_duration_seconds",
        "workerprobe_agent_cpu_seconds_total",
        "workerprobe_agent_resident_memory_bytes",
    ] {
        assert!(exposed(&text, family, "").is_some(), "{family} missing");
    }
    let sent = exposed(
        &text,
        "workerprobe_network_bytes_total",
        &format!("{label},direction=\"sent\",family=\"ipv4\""),
    );
    assert_eq!(sent, Some(100_000.0));
    let bpf_stats = std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
        .is_ok_and(|text| text.trim() == "1");
    if bpf_stats {
        // Whichever sched_switch variant the default groups planned (switch_waits with wait
        // reasons).
        let runs = exposed(&text, "workerprobe_program_runs_total", "program=\"switch_");
        assert!(runs.is_some_and(|runs| runs > 0.0), "{text}");
    }
}

#[test]
fn a_burst_of_requests_is_answered_while_workers_run() {
    const REQUESTS: usize = 2_000;
    const CLIENTS: usize = 4;
    let agent = Agent::start(&["--interval", "100ms"]);
    let worker = TestCgroup::new("serve-burst");
    let napper = TestCgroup::new("serve-burst-nap");
    let spin = worker.spawn_workload(&["spin", "20000", "1"]);
    let nap = napper.spawn_workload(&["nap", "2000", "5"]);
    let started = Instant::now();
    let addr = agent.addr;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                for _ in 0..REQUESTS / CLIENTS {
                    let response = http_get(addr, "/metrics", None);
                    if response.status != 200 || !response.body.contains("\nworkerprobe_workers ") {
                        failures.push(format!("{} {:.200}", response.status, response.body));
                    }
                }
                failures
            })
        })
        .collect();
    let failures: Vec<String> = clients
        .into_iter()
        .flat_map(|client| client.join().expect("client thread"))
        .collect();
    let elapsed = started.elapsed();
    let health = agent.get("/healthz");
    // The spinner's CPU time, not the burst's length, decides what it has done: wait for
    // 0.6 s of it, then for the agent's next samples to show it.
    wait_for_cpu(&worker, 0, 600_000_000, Duration::from_secs(120));
    let label = format!("worker=\"{}\"", worker_label(&worker));
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let text = agent.metrics();
        let cpu = exposed(&text, "workerprobe_cpu_seconds_total", &label).unwrap_or(0.0);
        if cpu > 0.5 || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for mut child in [spin, nap] {
        let _ = child.kill();
        let _ = child.wait();
    }
    eprintln!(
        "{REQUESTS} requests in {:.2}s ({:.0}/s)",
        elapsed.as_secs_f64(),
        REQUESTS as f64 / elapsed.as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} failed, e.g. {:?}",
        failures.len(),
        failures.first()
    );
    assert!(
        elapsed < Duration::from_secs(60),
        "{REQUESTS} requests took {elapsed:?}"
    );
    assert_eq!((health.status, health.body.as_str()), (200, "ok\n"));
    // The workers were measured meanwhile.
    let cpu = exposed(&text, "workerprobe_cpu_seconds_total", &label).unwrap_or(0.0);
    assert!(cpu > 0.5, "the spinning worker shows {cpu}s");
    // Nothing but GET is served.
    let mut stream = TcpStream::connect(agent.addr).expect("connect");
    write!(
        stream,
        "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut reply = String::new();
    let _ = stream.read_to_string(&mut reply);
    assert!(reply.starts_with("HTTP/1.1 405"), "{reply}");
    assert_eq!(agent.get("/other").status, 404);
}

#[test]
fn an_exited_worker_stays_for_the_grace_period_then_goes() {
    // Only this test's worker: the exits counter counts every selected worker, and other
    // tests' workers exit meanwhile.
    let agent = Agent::start(&[
        "--interval",
        "200ms",
        "--exit-grace",
        "3s",
        "--workers",
        "*-serve-exit",
    ]);
    let exits_before =
        exposed(&agent.metrics(), "workerprobe_worker_exits_total", "").expect("exits counter");
    let worker = TestCgroup::new("serve-exit");
    let label = format!("worker=\"{}\"", worker_label(&worker));
    let spin = worker.spawn_workload(&["spin", "300", "1"]);
    assert!(spin.wait_with_output().expect("wait").status.success());
    let kernel_seconds = worker.cpu_stat().usage_usec as f64 / 1e6;
    drop(worker); // removes the cgroup: the worker exits
    let removed = Instant::now();

    // Its final counters are shown after the exit...
    let text = loop {
        let text = agent.metrics();
        let exits = exposed(&text, "workerprobe_worker_exits_total", "").unwrap_or(0.0);
        if exits > exits_before {
            break text;
        }
        assert!(
            removed.elapsed() < Duration::from_secs(3),
            "no exit counted within 3 s:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let cpu = exposed(&text, "workerprobe_cpu_seconds_total", &label)
        .unwrap_or_else(|| panic!("the exited worker is gone at once:\n{text}"));
    assert!(
        (cpu - kernel_seconds).abs() <= 0.02 * kernel_seconds,
        "final CPU {cpu}s, cpu.stat {kernel_seconds}s"
    );
    assert!(exposed(&text, "workerprobe_memory_bytes", &label).is_none());
    // ...and go once the grace period is over.
    std::thread::sleep(Duration::from_secs(3).saturating_sub(removed.elapsed()));
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let text = agent.metrics();
        if !text.contains(&label) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still exposed {:?} after the exit:\n{text}",
            removed.elapsed()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let exits_after =
        exposed(&agent.metrics(), "workerprobe_worker_exits_total", "").expect("exits counter");
    assert!(exits_after > exits_before, "the exit count stays");
}

#[test]
fn a_worker_that_lived_between_two_samples_is_still_exposed() {
    // Samples 10 s apart: the worker is made, works and exits between two of them.
    let agent = Agent::start(&["--interval", "10s", "--exit-grace", "1m"]);
    let worker = TestCgroup::new("serve-short");
    let label = format!("worker=\"{}\"", worker_label(&worker));
    let spin = worker.spawn_workload(&["spin", "50", "1"]);
    assert!(spin.wait_with_output().expect("wait").status.success());
    let kernel_seconds = worker.cpu_stat().usage_usec as f64 / 1e6;
    drop(worker);
    let removed = Instant::now();
    loop {
        let text = agent.metrics();
        if let Some(cpu) = exposed(&text, "workerprobe_cpu_seconds_total", &label) {
            assert!(
                (cpu - kernel_seconds).abs() <= 0.02 * kernel_seconds,
                "CPU {cpu}s, cpu.stat {kernel_seconds}s"
            );
            assert!(exposed(&text, "workerprobe_worker_info", &label).is_some());
            break;
        }
        assert!(
            removed.elapsed() < Duration::from_secs(3),
            "the short worker never showed:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `workerprobe serve` with `args` and returns (exit code, stderr).
fn serve_fails(args: &[&str]) -> (Option<i32>, String) {
    let output = Command::new(workerprobe_path())
        .arg("serve")
        .args(args)
        .output()
        .expect("run workerprobe serve");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn bad_listen_or_interval_names_the_flag_and_exits_2() {
    for (args, flag, hint) in [
        (&["--listen", "localhost"][..], "--listen", "127.0.0.1:9464"),
        (
            &["--listen", "127.0.0.1:99999"][..],
            "--listen",
            "127.0.0.1:9464",
        ),
        (&["--interval", "fast"][..], "--interval", "like 1s"),
        (&["--interval", "10ms"][..], "--interval", "100ms minimum"),
        (
            &["--exit-grace", "0s"][..],
            "--exit-grace",
            "more than zero",
        ),
    ] {
        let (code, stderr) = serve_fails(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
        assert!(stderr.contains(hint), "{args:?}: {stderr}");
    }
}

#[test]
fn an_address_in_use_is_one_sentence_and_exit_1() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("address").to_string();
    let (code, stderr) = serve_fails(&["--listen", &addr]);
    assert_eq!(code, Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one sentence: {stderr}");
    assert!(stderr.contains(&addr), "{stderr}");
    assert!(stderr.contains("--listen"), "{stderr}");
    assert!(stderr.contains("another program is using"), "{stderr}");
}

/// The dashboard shipped for fleets (deploy/grafana/workerprobe.json).
fn dashboard() -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/workerprobe.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|err| panic!("read {}: {err}", path.display()));
    serde_json::from_str(&text).expect("the dashboard is JSON")
}

/// A dashboard expression with Grafana's variables filled in as it would for this node and
/// these workers over the last `range`.
fn filled(expr: &str, node: &str, workers: &str, range: &str) -> String {
    expr.replace("$node", node)
        .replace("$worker", workers)
        .replace("$__rate_interval", "4s")
        .replace("$__range", range)
}

#[test]
fn every_dashboard_query_answers_from_a_real_prometheus() {
    let agent = Agent::start(&["--interval", "500ms", "--node-name", "node-dash"]);
    let prometheus = Prometheus::start(agent.addr);
    let worker = TestCgroup::new("dash");
    let receiver = TestCgroup::new("dash-recv");
    let label = worker_label(&worker);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(30);
    while prometheus.query("up{job=\"workerprobe\"}") != Some(1.0) {
        assert!(
            Instant::now() < deadline,
            "Prometheus never scraped the agent"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // Work of every kind the panels show: memory held throughout (its series lasts while a
    // process is there; beside the worker, as holding costs a little CPU all along), CPU,
    // sleep, and bytes to a peer.
    let holder = TestCgroup::new("dash-mem");
    let mut hold = holder.spawn_workload(&["hold", "16", "120000"]);
    spin_then_send(&worker, &receiver);
    let kernel_seconds = worker.cpu_stat().usage_usec as f64 / 1e6;
    let raw = format!("sum(workerprobe_cpu_seconds_total{{worker=\"{label}\"}})");
    let deadline = Instant::now() + Duration::from_secs(20);
    while prometheus
        .query(&raw)
        .is_none_or(|cpu| (cpu - kernel_seconds).abs() > 0.02 * kernel_seconds)
    {
        assert!(
            Instant::now() < deadline,
            "Prometheus never caught up: {:?} against cpu.stat's {kernel_seconds}s",
            prometheus.query(&raw)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Rates need two samples inside their window after the work.
    std::thread::sleep(Duration::from_secs(3));

    let dashboard = dashboard();
    let workers = format!("{label}.*"); // the worker, its receiver and the holder
    // The range covers the whole test, and not more than Prometheus has.
    let range = format!("{}s", started.elapsed().as_secs() + 5);
    // The variables: node lists this agent's name, worker lists the test's workers.
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        let Some(definition) = variable["definition"].as_str() else {
            continue;
        };
        let (expr, label_name) = definition
            .strip_prefix("label_values(")
            .and_then(|rest| rest.strip_suffix(')'))
            .and_then(|inner| inner.rsplit_once(", "))
            .unwrap_or_else(|| panic!("unexpected variable query {definition}"));
        let values: Vec<String> = prometheus
            .query_all(&filled(expr, "node-dash", &workers, &range))
            .iter()
            .filter_map(|(labels, _)| labels[label_name].as_str().map(str::to_owned))
            .collect();
        let expected = if label_name == "node" {
            "node-dash"
        } else {
            label.as_str()
        };
        assert!(
            values.iter().any(|value| value == expected),
            "variable {label_name} ({definition}) offers {values:?}, not {expected}"
        );
    }
    // Every panel's query gives data for this node.
    let mut cpu_in_range = None;
    for panel in dashboard["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().expect("title");
        for target in panel["targets"].as_array().expect("targets") {
            let query = filled(
                target["expr"].as_str().expect("expr"),
                "node-dash",
                &workers,
                &range,
            );
            let series = prometheus.query_all(&query);
            assert!(!series.is_empty(), "panel {title:?} has no data: {query}");
            assert!(
                series
                    .iter()
                    .all(|(labels, _)| labels["node"] == "node-dash"),
                "panel {title:?} has series of another node: {series:?}"
            );
            if title == "CPU seconds in the range" {
                cpu_in_range = series
                    .iter()
                    .find(|(labels, _)| labels["worker"] == label.as_str())
                    .map(|(_, value)| *value);
            }
        }
    }
    let _ = hold.kill();
    let _ = hold.wait();
    // The CPU panel tells the worker's CPU as its cgroup counted it.
    let cpu = cpu_in_range.expect("the CPU panel shows the worker");
    eprintln!("dashboard: CPU in range {cpu:.6}s, cpu.stat {kernel_seconds:.6}s");
    assert!(
        (cpu - kernel_seconds).abs() <= 0.02 * kernel_seconds,
        "the CPU panel says {cpu}s, cpu.stat {kernel_seconds}s"
    );
}
