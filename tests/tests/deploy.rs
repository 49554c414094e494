//! The Kubernetes DaemonSet in deploy/kubernetes, run on this host as a kubelet would run it:
//! its command line (with `$(NODE_NAME)` filled in from its env), inside a pod-like cgroup
//! and mount namespace of its own, with only the capabilities it adds, and its volume of the
//! host's cgroup2 hierarchy. The agent must start, answer its liveness probe, drop to its
//! `--user`, and measure a worker outside the pod: it sees the node, not only itself.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use workerprobe::cgroup;
use workerprobe_tests::{TestCgroup, require_root, status_field, workerprobe_path};

/// The manifest's DaemonSet, as JSON.
fn daemonset() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/kubernetes/workerprobe.yaml"
    );
    let text = std::fs::read_to_string(path).expect("read the manifest");
    serde_yaml_ng::Deserializer::from_str(&text)
        .map(|document| serde::Deserialize::deserialize(document).expect("every document is YAML"))
        .find(|document: &Value| document["kind"] == "DaemonSet")
        .expect("a DaemonSet in the manifest")
}

/// `GET path` over HTTP/1.0: the status code and body.
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, text.split_once("\r\n\r\n")?.1.to_owned()))
}

struct Pod {
    agent: Child,
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.agent.kill();
        let _ = self.agent.wait();
    }
}

#[test]
fn the_daemonsets_container_runs_here_answers_healthz_and_sees_the_node() {
    require_root();
    let spec = &daemonset()["spec"]["template"]["spec"];
    assert_eq!(spec["hostPID"], true, "the agent must see the host's pids");
    let container = &spec["containers"][0];
    let security = &container["securityContext"];
    assert_eq!(security["privileged"], false, "not privileged");
    let added: Vec<String> = security["capabilities"]["add"]
        .as_array()
        .expect("capabilities to add")
        .iter()
        .map(|cap| cap.as_str().expect("a name").to_lowercase())
        .collect();
    assert_eq!(security["capabilities"]["drop"][0], "ALL");

    // The command line as the kubelet makes it: $(NODE_NAME) from the env (the node's name),
    // and the port from the manifest, moved to a free one.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let manifest_port = container["ports"][0]["containerPort"]
        .as_u64()
        .expect("a port");
    let args: Vec<String> = container["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|arg| {
            arg.as_str()
                .expect("text")
                .replace("$(NODE_NAME)", "deploy-test-node")
                .replace(&format!(":{manifest_port}"), &format!(":{port}"))
        })
        .collect();
    assert_eq!(args[0], "serve");
    assert!(
        args.iter().any(|arg| arg == "--user"),
        "the agent drops privileges"
    );
    let health_path = container["livenessProbe"]["httpGet"]["path"]
        .as_str()
        .expect("a liveness probe");

    // The pod: a cgroup of its own and its own cgroup and mount namespaces (as runc gives
    // on cgroup2: its own cgroup2 mount on /sys/fs/cgroup, in place of the host's, which the
    // kernel will not stack on itself), the host's hierarchy mounted where the manifest's volume says (under a
    // scratch root, since this host's root may be read-only), only the capabilities added.
    let mount = &container["volumeMounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .find(|mount| mount["name"] == "host-cgroup")
        .expect("the host's cgroup2 volume")["mountPath"];
    let host_cgroup2 = cgroup::find_cgroup2_mount().expect("cgroup2");
    let pod_cgroup = TestCgroup::new("deploy-pod");
    let pod_root = std::env::temp_dir().join(format!("wp-deploy-{}", std::process::id()));
    let volume = pod_root.join(mount.as_str().expect("a path").trim_start_matches('/'));
    std::fs::create_dir_all(&volume).expect("make the volume's mount point");
    let caps = added
        .iter()
        .map(|cap| format!("+{cap}"))
        .collect::<Vec<_>>()
        .join(",");
    let script = format!(
        "echo $$ > {pod}/cgroup.procs && exec unshare --cgroup --mount --propagation private sh -c '\
         mount --bind -o ro {host} {volume} && umount -l /sys/fs/cgroup && \
         mount -t cgroup2 cgroup2 /sys/fs/cgroup && \
         exec setpriv --bounding-set -all,{caps} \"$0\" \"$@\"' {agent} {args}",
        pod = pod_cgroup.dir.display(),
        host = host_cgroup2.display(),
        volume = volume.display(),
        agent = workerprobe_path().display(),
        args = args.join(" "),
    );
    let mut pod = Pod {
        agent: Command::new("sh")
            .args(["-c", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the pod"),
    };
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("address");
    let started = Instant::now();
    let health = loop {
        if let Some(answer) = get(addr, health_path) {
            break answer;
        }
        if let Ok(Some(status)) = pod.agent.try_wait() {
            let mut stderr = String::new();
            let _ = pod
                .agent
                .stderr
                .take()
                .map(|mut e| e.read_to_string(&mut stderr));
            panic!("the container exited with {status}: {stderr}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no answer on {health_path}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(health.0, 200, "liveness probe: {health:?}");
    let agent_pid = pod.agent.id();
    assert_eq!(
        status_field(agent_pid, "Uid:").split_whitespace().next(),
        Some("65534"),
        "the agent runs as nobody"
    );
    assert_eq!(
        u64::from_str_radix(&status_field(agent_pid, "CapEff:"), 16),
        Ok(0)
    );

    // A worker outside the pod, measured to the kernel's count: the agent sees the node.
    let worker = TestCgroup::new("deploy-worker");
    let spin = worker.spawn_workload(&["spin", "500", "1"]);
    assert!(spin.wait_with_output().expect("wait").status.success());
    let kernel_s = worker.cpu_stat().usage_usec as f64 / 1e6;
    let label = format!("worker=\"/{}\"", worker.name());
    let started = Instant::now();
    let ours_s = loop {
        let (status, metrics) = get(addr, "/metrics").expect("metrics");
        assert_eq!(status, 200);
        assert!(
            metrics.contains("node=\"deploy-test-node\""),
            "no node_info for the node's name"
        );
        let value = metrics
            .lines()
            .filter(|line| {
                line.starts_with("workerprobe_cpu_seconds_total{") && line.contains(&label)
            })
            .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>();
        if (value - kernel_s).abs() <= kernel_s * 0.01 {
            break value;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the worker outside the pod: {value} s exposed, cpu.stat {kernel_s} s"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    eprintln!("outside the pod: {ours_s:.6} s exposed, cpu.stat {kernel_s:.6} s");
    drop(pod);
    let _ = std::fs::remove_dir_all(&pod_root);
}
