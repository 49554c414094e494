//! Socket bytes and calls per cgroup against the workloads' own counts.

use workerprobe::collect::KernelCollector;
use workerprobe::{collect::Source as _, model::Sample};
use workerprobe_tests::{
    TestCgroup, collector, collector_with, counters, field, read_first_json_line, wait_json,
};

/// Per-family counters of a worker between two samples: (sent bytes, sent calls, received
/// bytes, received calls).
fn traffic(before: &Sample, after: &Sample, id: u64, family: usize) -> (u64, u64, u64, u64) {
    let b = counters(before, id).net.families[family];
    let a = counters(after, id).net.families[family];
    (
        a.sent_bytes - b.sent_bytes,
        a.sent_calls - b.sent_calls,
        a.received_bytes - b.received_bytes,
        a.received_calls - b.received_calls,
    )
}

/// Runs a receiver in one cgroup and a sender in another, and checks each side's counters
/// against what the workloads counted themselves.
fn exchange(proto: &str, listen: &str, total: u64, sizes: &str, family: usize) {
    exchange_with(collector(), proto, listen, total, sizes, family);
}

/// [`exchange`], read by `collector`.
fn exchange_with(
    mut collector: KernelCollector,
    proto: &str,
    listen: &str,
    total: u64,
    sizes: &str,
    family: usize,
) {
    let sender = TestCgroup::new(&format!("{proto}-send"));
    let receiver = TestCgroup::new(&format!("{proto}-recv"));
    let before = collector.sample().expect("sample");

    let datagrams = {
        let sizes: Vec<u64> = sizes.split(',').map(|s| s.parse().expect("size")).collect();
        let (mut n, mut sent, mut i) = (0u64, 0u64, 0usize);
        while sent < total {
            sent += sizes[i % sizes.len()].min(total - sent);
            n += 1;
            i += 1;
        }
        n
    };
    let mut recv = receiver.spawn_workload(&["recv", proto, listen, &datagrams.to_string()]);
    let addr = read_first_json_line(&mut recv)["addr"]
        .as_str()
        .expect("receiver address")
        .to_string();
    let send = sender.spawn_workload(&["send", proto, &addr, &total.to_string(), sizes]);
    let sent = wait_json(send);
    let received = wait_json(recv);
    let after = collector.sample().expect("sample");

    let (sent_bytes, sent_calls, sender_rx, _) = traffic(&before, &after, sender.id, family);
    let (receiver_tx, _, received_bytes, received_calls) =
        traffic(&before, &after, receiver.id, family);
    eprintln!(
        "{proto}: workload sent {sent} received {received}; ours sent {sent_bytes}/{sent_calls} received {received_bytes}/{received_calls}"
    );

    assert_eq!(
        field(&sent, "failed_sends"),
        1,
        "the failing send did not fail"
    );
    assert_eq!(sent_bytes, field(&sent, "sent_bytes"), "sent bytes");
    assert_eq!(
        sent_calls,
        field(&sent, "sent_calls"),
        "sent calls (the failed send must not count)"
    );
    assert_eq!(
        received_bytes,
        field(&received, "received_bytes"),
        "received bytes"
    );
    assert_eq!(
        received_calls,
        field(&received, "received_calls"),
        "received calls (MSG_PEEK must not count)"
    );
    assert!(
        field(&received, "peeked_bytes") > 0,
        "the receiver did not peek"
    );
    assert_eq!(sender_rx, 0, "the sender received nothing");
    assert_eq!(receiver_tx, 0, "the receiver sent nothing");
    // Nothing leaked into another family.
    for other in 0..probe_common::net::FAMILY_COUNT {
        if other != family {
            assert_eq!(traffic(&before, &after, sender.id, other), (0, 0, 0, 0));
            assert_eq!(traffic(&before, &after, receiver.id, other), (0, 0, 0, 0));
        }
    }
}

#[test]
fn tcp_bytes_are_exact() {
    // 64 MiB in writes of several sizes.
    exchange(
        "tcp",
        "127.0.0.1:0",
        64 << 20,
        "1,100,1448,4096,65536,1000000",
        probe_common::net::FAMILY_IPV4,
    );
}

/// With no slots, every worker's bytes go through the hash the programs make entries in on
/// demand, and each sample reads it: as exact.
#[test]
fn tcp_bytes_beyond_the_slots_are_exact() {
    let collector = collector_with(workerprobe::loader::LoadOptions {
        cpu_slots: Some(0),
        ..Default::default()
    });
    exchange_with(
        collector,
        "tcp",
        "127.0.0.1:0",
        8 << 20,
        "1,1448,65536",
        probe_common::net::FAMILY_IPV4,
    );
}

#[test]
fn tcp6_bytes_are_exact() {
    exchange(
        "tcp",
        "[::1]:0",
        8 << 20,
        "512,65536",
        probe_common::net::FAMILY_IPV6,
    );
}

#[test]
fn udp_datagrams_are_exact() {
    exchange(
        "udp",
        "127.0.0.1:0",
        2 << 20,
        "64,1200,8192,60000",
        probe_common::net::FAMILY_IPV4,
    );
}

#[test]
fn unix_stream_bytes_are_exact() {
    let path = std::env::temp_dir().join(format!("wp-test-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    exchange(
        "unix",
        path.to_str().expect("utf-8 path"),
        16 << 20,
        "10,4096,212992",
        probe_common::net::FAMILY_UNIX,
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn unix_datagrams_are_exact() {
    let path = std::env::temp_dir().join(format!("wp-test-{}.dgram", std::process::id()));
    let _ = std::fs::remove_file(&path);
    exchange(
        "unixgram",
        path.to_str().expect("utf-8 path"),
        4 << 20,
        "1,4096,65536",
        probe_common::net::FAMILY_UNIX,
    );
    let _ = std::fs::remove_file(&path);
}

#[test]
fn unix_seqpacket_messages_are_exact() {
    let path = std::env::temp_dir().join(format!("wp-test-{}.seq", std::process::id()));
    let _ = std::fs::remove_file(&path);
    exchange(
        "seqpacket",
        path.to_str().expect("utf-8 path"),
        4 << 20,
        "1,4096,65536",
        probe_common::net::FAMILY_UNIX,
    );
    let _ = std::fs::remove_file(&path);
}

/// sendmmsg repeating one address and recvmmsg take the kernel's shortcut past the socket
/// layer's security hook for all but the first message: every message must still count.
#[test]
fn udp_sendmmsg_and_recvmmsg_are_exact() {
    exchange(
        "udp-mmsg",
        "127.0.0.1:0",
        2 << 20,
        "64,1200,8192,60000",
        probe_common::net::FAMILY_IPV4,
    );
}

#[test]
fn bytes_sent_with_sendfile_are_exact() {
    let mut collector = collector();
    let sender = TestCgroup::new("sendfile-send");
    let receiver = TestCgroup::new("sendfile-recv");
    let before = collector.sample().expect("sample");
    let mut recv = receiver.spawn_workload(&["recv", "tcp", "127.0.0.1:0", "0"]);
    let addr = read_first_json_line(&mut recv)["addr"]
        .as_str()
        .expect("receiver address")
        .to_string();
    let sent = wait_json(sender.spawn_workload(&["sendfile", &addr, "9000001"]));
    let received = wait_json(recv);
    let after = collector.sample().expect("sample");
    let (sent_bytes, sent_calls, _, _) =
        traffic(&before, &after, sender.id, probe_common::net::FAMILY_IPV4);
    let (_, _, received_bytes, _) =
        traffic(&before, &after, receiver.id, probe_common::net::FAMILY_IPV4);
    eprintln!(
        "sendfile: workload sent {sent}, received {received}; ours sent {sent_bytes} in {sent_calls} calls, received {received_bytes}"
    );
    assert_eq!(
        sent_bytes,
        field(&sent, "sent_bytes"),
        "bytes sent by sendfile"
    );
    assert_eq!(received_bytes, field(&received, "received_bytes"));
    // A call is one pass through the socket layer: sendfile makes one per chunk it pushes.
    assert!(
        sent_calls >= field(&sent, "sendfile_calls"),
        "{sent_calls} calls"
    );
}

/// One stream sent by `send_mode` from one test cgroup and received by `recv_mode` in
/// another, with the workloads' own counts and ours.
struct Transfer {
    /// What the sender and the receiver counted themselves.
    sent: serde_json::Value,
    received: serde_json::Value,
    /// Ours for the sender (bytes sent, calls sent, bytes received) and the receiver (bytes
    /// received, calls received), in `family`.
    sender: (u64, u64, u64),
    receiver: (u64, u64),
}

fn transfer(
    collector: &mut workerprobe::collect::KernelCollector,
    (send_mode, recv_mode): (&str, &str),
    listen: &str,
    total: u64,
    sizes: &str,
    family: usize,
) -> Transfer {
    let sender = TestCgroup::new(&format!("{send_mode}-send"));
    let receiver = TestCgroup::new(&format!("{recv_mode}-{send_mode}-recv"));
    let before = collector.sample().expect("sample");
    let mut recv = receiver.spawn_workload(&["recv", recv_mode, listen, "0"]);
    let addr = read_first_json_line(&mut recv)["addr"]
        .as_str()
        .expect("receiver address")
        .to_string();
    let sent =
        wait_json(sender.spawn_workload(&["send", send_mode, &addr, &total.to_string(), sizes]));
    let received = wait_json(recv);
    let after = collector.sample().expect("sample");
    let (sent_bytes, sent_calls, sender_rx, _) = traffic(&before, &after, sender.id, family);
    let (_, _, received_bytes, received_calls) = traffic(&before, &after, receiver.id, family);
    eprintln!(
        "{send_mode} → {recv_mode}: workload sent {sent}, received {received}; ours sent {sent_bytes}/{sent_calls}, received {received_bytes}/{received_calls}"
    );
    assert_eq!(
        field(&received, "received_bytes"),
        field(&sent, "sent_bytes")
    );
    Transfer {
        sent,
        received,
        sender: (sent_bytes, sent_calls, sender_rx),
        receiver: (received_bytes, received_calls),
    }
}

#[test]
fn bytes_read_with_splice_are_exact_where_the_kernel_lets_them_be_counted() {
    let socket_path = std::env::temp_dir().join(format!("wp-splice-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&socket_path);
    let cases = [
        (
            "tcp",
            "127.0.0.1:0".to_string(),
            probe_common::net::FAMILY_IPV4,
        ),
        (
            "unix",
            socket_path.to_str().expect("utf-8").to_string(),
            probe_common::net::FAMILY_UNIX,
        ),
    ];
    let mut collector = collector();
    let measured = collector.measured().splice_reads;
    if std::env::var_os("WP_EXPECT_FEXIT").is_some() {
        assert!(
            measured,
            "this kernel allows fexit: splice reads must be counted"
        );
    }
    for (proto, listen, family) in cases {
        let splice_mode = format!("{proto}-splice");
        let done = transfer(
            &mut collector,
            (proto, &splice_mode),
            &listen,
            16 << 20,
            "1000,65536,1000000",
            family,
        );
        let ((bytes, calls), spliced) = (done.receiver, done.received);
        if measured {
            assert_eq!(
                bytes,
                field(&spliced, "received_bytes"),
                "{proto}: bytes spliced"
            );
            assert_eq!(
                calls,
                field(&spliced, "received_calls"),
                "{proto}: one call per splice"
            );
        } else {
            // Said at start as not counted (the notes), and indeed nothing was.
            assert_eq!(
                (bytes, calls),
                (0, 0),
                "{proto}: splice reads counted somewhere"
            );
        }
        let _ = std::fs::remove_file(&socket_path);
    }
    if !measured {
        let notes = workerprobe::loader::load_and_attach(&Default::default())
            .expect("load")
            .notes();
        assert!(
            notes
                .iter()
                .any(|note| note
                    .starts_with("bytes read from sockets with splice() are not counted")),
            "{notes:?}"
        );
    }
}

#[test]
fn zero_copy_and_io_uring_paths_are_exact() {
    let mut collector = collector();
    // (sender's way, receiver's way, whether one call of the workload is one of ours)
    for (send_proto, recv_proto, calls_match) in [
        ("tcp-zerocopy", "tcp", true),
        ("tcp-splice-in", "tcp", false),
        ("tcp-uring", "tcp-uring", true),
    ] {
        let Transfer {
            sent,
            received,
            sender: (sent_bytes, sent_calls, sender_rx),
            receiver: (received_bytes, received_calls),
        } = transfer(
            &mut collector,
            (send_proto, recv_proto),
            "127.0.0.1:0",
            8 << 20,
            "100,4096,65536,1000000",
            probe_common::net::FAMILY_IPV4,
        );
        assert_eq!(
            field(&sent, "failed_sends"),
            1,
            "{send_proto}: the failing send"
        );
        assert_eq!(
            sent_bytes,
            field(&sent, "sent_bytes"),
            "{send_proto}: bytes sent"
        );
        assert_eq!(
            received_bytes,
            field(&received, "received_bytes"),
            "{recv_proto}: bytes received"
        );
        assert_eq!(
            received_calls,
            field(&received, "received_calls"),
            "{recv_proto}: receive calls"
        );
        if calls_match {
            assert_eq!(
                sent_calls,
                field(&sent, "sent_calls"),
                "{send_proto}: send calls"
            );
        } else {
            // Splice into a socket: one call per chunk the kernel pushes.
            assert!(
                sent_calls >= field(&sent, "sent_calls"),
                "{send_proto}: {sent_calls} calls"
            );
        }
        // Zerocopy completions read off the error queue are not payload.
        assert_eq!(sender_rx, 0, "{send_proto}: the sender received nothing");
    }
}
