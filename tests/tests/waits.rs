//! Where the waiting went: each sleep's reason against what the workload itself timed, and
//! bytes and waits per remote endpoint against what the client counted.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpListener,
    process::Command,
    time::Duration,
};

use probe_common::wait::WAIT_NAMES;
use workerprobe::{collect::Source as _, model};
use workerprobe_tests::{
    TIMED_REASONS, TestCgroup, close_to_timed, collector, field, require_root, run_reasons,
    settled_sample, temp_path, workerprobe_path, workload_path,
};

#[test]
fn each_sleep_is_charged_to_what_the_thread_waited_on() {
    let mut collector = collector();
    let worker = TestCgroup::new("reasons");
    let mut before = None;
    let (_, timed) = run_reasons(&worker, || {
        before = Some(collector.sample().expect("sample"));
    });
    let before = before.expect("sampled before the start");
    let after = settled_sample(&mut collector, worker.id);
    let stats = model::diff(Some(&before), &after)
        .workers
        .into_iter()
        .find(|w| w.cgroup_id == worker.id)
        .expect("worker seen");
    let delays = &stats.delays;
    let reason_ns =
        |name: &str| delays.wait_ns[WAIT_NAMES.iter().position(|n| *n == name).expect("reason")];
    eprintln!(
        "reasons: {}; workload timed {timed}; on-CPU {:.1} ms, run-queue {:.1} ms; drops {:?} → {:?}",
        WAIT_NAMES
            .iter()
            .map(|name| format!("{name} {:.1} ms", reason_ns(name) as f64 / 1e6))
            .collect::<Vec<_>>()
            .join(", "),
        stats.cpu_ns() as f64 / 1e6,
        delays.runqueue_wait_ns as f64 / 1e6,
        before.drops.by_map,
        after.drops.by_map
    );
    // The reasons split blocked I/O plus sleep, exactly.
    assert_eq!(
        delays.wait_ns.iter().sum::<u64>(),
        delays.blocked_io_ns + delays.sleep_ns,
        "reasons do not add up to blocked + sleep"
    );
    for (reason, key) in TIMED_REASONS {
        let (ours, theirs) = (reason_ns(reason), field(&timed, key));
        assert!(
            close_to_timed(ours, theirs),
            "{reason}: {ours} ns, the workload timed {theirs} ns"
        );
    }
    // Every sleep in the file's life (fsync's in the disk and the journal) is disk.
    let (disk, off_cpu) = (reason_ns("disk"), field(&timed, "disk_ns"));
    assert!(
        disk > 0 && close_to_timed(disk, off_cpu),
        "disk {disk} ns; the workload was off the CPU for {off_cpu} ns of its file's life"
    );
}

/// A server that answers each `GET n` line with n bytes after `delay`, then closes.
fn delayed_store(
    listener: TcpListener,
    requests: usize,
    delay: Duration,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for _ in 0..requests {
            let (stream, _) = listener.accept().expect("accept");
            let mut reader = BufReader::new(stream);
            let mut line = String::new();
            reader.read_line(&mut line).expect("request");
            let bytes: usize = line
                .trim()
                .trim_start_matches("GET ")
                .parse()
                .expect("size");
            std::thread::sleep(delay);
            let mut stream = reader.into_inner();
            let block = vec![9u8; 1 << 16];
            let mut left = bytes;
            while left > 0 {
                let n = left.min(block.len());
                stream.write_all(&block[..n]).expect("answer");
                left -= n;
            }
        }
    })
}

/// A server that reads each connection to its end, then answers `ok`.
fn sink(listener: TcpListener, connections: usize) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for _ in 0..connections {
            let (mut stream, _) = listener.accept().expect("accept");
            let mut buf = vec![0u8; 1 << 16];
            while stream.read(&mut buf).expect("read") > 0 {}
            stream.write_all(b"ok").expect("ok");
        }
    })
}

/// `workerprobe exec --json` of the workload with `workload` arguments; its summary and the
/// workload's own last line.
fn exec_json(agent_args: &[String], workload: &[String]) -> (serde_json::Value, serde_json::Value) {
    let out = temp_path("waits", "summary.json");
    let output = Command::new(workerprobe_path())
        .arg("exec")
        .arg("--json")
        .arg("--output")
        .arg(&out)
        .args(agent_args)
        .arg("--")
        .arg(workload_path())
        .args(workload)
        .output()
        .expect("run workerprobe exec");
    assert!(
        output.status.success(),
        "exec failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("summary")).expect("JSON");
    let _ = std::fs::remove_file(&out);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let counted: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("workload output")).expect("JSON");
    (summary, counted)
}

fn endpoint<'a>(summary: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    summary["endpoints"]
        .as_array()
        .expect("endpoints")
        .iter()
        .find(|e| e["endpoint"] == name)
        .unwrap_or_else(|| panic!("no endpoint {name} in {}", summary["endpoints"]))
}

#[test]
fn bytes_and_waits_per_endpoint_are_the_clients() {
    require_root();
    const REQUESTS: usize = 6;
    const DELAY: Duration = Duration::from_millis(200);
    let store = TcpListener::bind("127.0.0.2:0").expect("bind the store on 127.0.0.2");
    // The peer on IPv6, so each family's address is read from the socket and matched.
    let peer = TcpListener::bind("[::1]:0").expect("bind the peer on ::1");
    let (store_addr, peer_addr) = (
        store.local_addr().expect("addr").to_string(),
        peer.local_addr().expect("addr").to_string(),
    );
    let store_thread = delayed_store(store, REQUESTS, DELAY);
    let peer_thread = sink(peer, 1);
    let (summary, counted) = exec_json(
        &[
            "--endpoint".into(),
            "store=127.0.0.2/32".into(),
            "--endpoint".into(),
            "peer=::1/128".into(),
        ],
        &[
            "fetch".into(),
            store_addr,
            REQUESTS.to_string(),
            "5000000".into(),
            peer_addr,
            "10000000".into(),
        ],
    );
    store_thread.join().expect("store");
    peer_thread.join().expect("peer");
    eprintln!(
        "endpoints {}; client counted {counted}",
        summary["endpoints"]
    );
    let store = endpoint(&summary, "store");
    let peer = endpoint(&summary, "peer");
    assert_eq!(store["received_bytes"], counted["store_received"]);
    assert_eq!(store["sent_bytes"], counted["store_sent"]);
    assert_eq!(peer["sent_bytes"], counted["peer_sent"]);
    assert_eq!(peer["received_bytes"], counted["peer_received"]);
    let store_wait = store["wait_seconds"].as_f64().expect("store wait");
    let peer_wait = peer["wait_seconds"].as_f64().expect("peer wait");
    let injected = REQUESTS as f64 * DELAY.as_secs_f64();
    assert!(
        store_wait >= 0.95 * injected,
        "the store's wait {store_wait}s is short of the injected {injected}s"
    );
    assert!(
        peer_wait < DELAY.as_secs_f64(),
        "the peer was charged {peer_wait}s, like a store delay"
    );
    // The network reason covers the endpoints' waits.
    let network = summary["time"]["waits"]["network"]["seconds"]
        .as_f64()
        .expect("network wait");
    assert!(
        network + 1e-6 >= store_wait + peer_wait,
        "network {network}s"
    );
}

#[test]
fn more_endpoints_than_the_bound_go_to_other_and_totals_stay_exact() {
    require_root();
    const PEERS: usize = 10;
    const BOUND: usize = 4;
    let mut rules = vec!["--max-endpoints-per-worker".to_string(), BOUND.to_string()];
    let mut addrs = Vec::new();
    let mut threads = Vec::new();
    for index in 0..PEERS {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        rules.push("--endpoint".into());
        rules.push(format!("p{index}=:{}", addr.port()));
        addrs.push(addr.to_string());
        threads.push(sink(listener, 1));
    }
    let mut workload = vec!["fanout".to_string()];
    workload.extend(addrs);
    workload.push("100000".into());
    let (summary, counted) = exec_json(&rules, &workload);
    for thread in threads {
        thread.join().expect("sink");
    }
    let endpoints = summary["endpoints"].as_array().expect("endpoints");
    eprintln!("endpoints {endpoints:?}");
    let sum = |key: &str| {
        endpoints
            .iter()
            .map(|e| e[key].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    assert_eq!(
        sum("sent_bytes"),
        field(&counted, "sent_bytes"),
        "sent over all endpoints"
    );
    assert_eq!(sum("received_bytes"), field(&counted, "received_bytes"));
    let named = endpoints
        .iter()
        .filter(|e| e["endpoint"] != "other")
        .count();
    assert!(
        named <= BOUND,
        "{named} endpoints kept, the bound is {BOUND}"
    );
    let other = endpoint(&summary, "other");
    assert!(
        other["sent_calls"].as_u64().is_some_and(|calls| calls > 0),
        "{other}"
    );
}

#[test]
fn endpoints_beyond_the_slots_and_in_reused_slots_are_counted_exactly() {
    // More peers than slots: each worker's first endpoints take slots, the rest go to the
    // hash. The slots are given back when the worker is finished, so every round gets some;
    // two may be taken meanwhile by the node's own sockets for good.
    const SLOTS: u32 = 3;
    const PEERS: usize = 5;
    let mut collector = workerprobe_tests::collector_with(workerprobe::loader::LoadOptions {
        endpoint_slots: Some(SLOTS),
        ..Default::default()
    });
    // Peers that never read: only the workers' sends take endpoints.
    let peers: Vec<std::net::UdpSocket> = (0..PEERS)
        .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").expect("bind udp"))
        .collect();
    for round in 0..3 {
        let worker = TestCgroup::new(&format!("endpoint-slots-{round}"));
        let mut sent = Vec::new();
        for (index, peer) in peers.iter().enumerate() {
            let addr = peer.local_addr().expect("addr");
            let bytes = (1_000 * (index + 1)).to_string();
            let child = worker.spawn_workload(&["send", "udp", &addr.to_string(), &bytes, "100"]);
            let output = child.wait_with_output().expect("wait");
            assert!(output.status.success(), "send to {addr}");
            let stdout = String::from_utf8_lossy(&output.stdout);
            let counted: serde_json::Value =
                serde_json::from_str(stdout.lines().last().expect("output")).expect("JSON");
            sent.push((addr.port(), counted));
        }
        let slots = collector.endpoint_slots_of(worker.id);
        let sample = collector.sample().expect("sample");
        let live = sample.workers.get(&worker.id).expect("worker sampled");
        let id = worker.id;
        drop(worker);
        let finished = collector.finish(id).expect("worker counted");
        eprintln!("round {round}: slots {slots:?}");
        assert!(
            !slots.is_empty() && slots.len() < PEERS,
            "round {round}: slots {slots:?} (a slot given back and not reused leaves none)"
        );
        for (name, endpoints) in [
            ("sampled", &live.endpoints),
            ("finished", &finished.endpoints),
        ] {
            assert_eq!(endpoints.len(), PEERS, "{name}: {endpoints:?}");
            for (port, counted) in &sent {
                let ours = endpoints
                    .iter()
                    .find(|e| e.key.port == *port)
                    .unwrap_or_else(|| panic!("{name}: no endpoint :{port} in {endpoints:?}"));
                assert_eq!(
                    ours.stats.sent_bytes,
                    field(counted, "sent_bytes"),
                    "{name} :{port}"
                );
                assert_eq!(
                    ours.stats.sent_calls,
                    field(counted, "sent_calls"),
                    "{name} :{port}"
                );
            }
        }
    }
}
