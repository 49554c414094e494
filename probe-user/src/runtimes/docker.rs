//! Docker's containers, from the Engine API on its socket (`/var/run/docker.sock`): the
//! containers there at start (`GET /containers/json?all=1`), then each one made after
//! (the `create` events of `GET /events`, which carry its name and image). A thread follows
//! the event stream, so a container that lived 0.2 s is known before the agent's next tick
//! asks; a daemon that restarts is followed again.
//!
//! The requests are HTTP/1.0, so the daemon answers with plain bodies (no chunking) and
//! closes each connection when done; a small reader suffices and no HTTP stack is pulled in.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    io::{BufRead as _, BufReader, Read as _, Write as _},
    os::unix::net::UnixStream,
    path::Path,
    sync::{Arc, Mutex},
    time::Duration,
};

use serde::Deserialize;

use crate::model::identity::{ContainerInfo, PodNames};

/// Where dockerd listens by default.
pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

/// Oldest Engine API the requests need (Docker 20.10 speaks 1.41; 1.24 is Docker 1.12).
const API: &str = "/v1.24";

/// How many containers stay known (those made last): enough for any node's churn between
/// a container's start and its exit summary.
const MAX_KNOWN: usize = 4096;

/// How long a request may take before the daemon is taken for absent.
const TIMEOUT: Duration = Duration::from_secs(2);

/// Docker's containers, as its API told them.
pub struct Docker {
    known: Arc<Mutex<Known>>,
}

#[derive(Default)]
struct Known {
    by_id: HashMap<String, ContainerInfo>,
    /// Ids in the order learnt: the oldest are forgotten beyond [`MAX_KNOWN`].
    order: VecDeque<String>,
}

impl Known {
    fn learn(&mut self, info: ContainerInfo) {
        if self.by_id.insert(info.id.clone(), info.clone()).is_none() {
            self.order.push_back(info.id);
        }
        while self.order.len() > MAX_KNOWN {
            if let Some(oldest) = self.order.pop_front() {
                self.by_id.remove(&oldest);
            }
        }
    }
}

/// One entry of `GET /containers/json`.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ListedContainer {
    id: String,
    #[serde(default)]
    names: Vec<String>,
    #[serde(default)]
    image: Option<String>,
    #[serde(rename = "ImageID", default)]
    image_id: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

/// One line of `GET /events`.
#[derive(Deserialize)]
struct Event {
    #[serde(rename = "Type", default)]
    kind: String,
    #[serde(rename = "Action", default)]
    action: String,
    #[serde(rename = "Actor")]
    actor: Option<Actor>,
}

#[derive(Deserialize)]
struct Actor {
    #[serde(rename = "ID")]
    id: String,
    #[serde(rename = "Attributes", default)]
    attributes: BTreeMap<String, String>,
}

impl Docker {
    /// Starts following the daemon at `socket`; `None` when no daemon listens there.
    pub fn start(socket: &Path) -> Option<Self> {
        if !socket.exists() {
            return None;
        }
        // The events first, so no container made while the list is read is missed.
        let events = match subscribe(socket) {
            Ok(events) => events,
            Err(Failure::Absent) => return None,
            Err(Failure::Refused(reason)) => {
                crate::say!(
                    "workerprobe: Docker containers are named by id only: {} did not answer ({reason})",
                    socket.display()
                );
                return None;
            }
        };
        let known = Arc::new(Mutex::new(Known::default()));
        if let Ok(listed) = list(socket)
            && let Ok(mut known) = known.lock()
        {
            for info in listed {
                known.learn(info);
            }
        }
        let followed = Arc::clone(&known);
        let socket = socket.to_path_buf();
        let spawned = std::thread::Builder::new()
            .name("docker-names".into())
            .spawn(move || follow(&socket, events, &followed));
        if spawned.is_err() {
            crate::say!(
                "workerprobe: Docker containers made from now on are named by id only: no thread could follow the daemon"
            );
        }
        Some(Self { known })
    }

    /// The container with this full id, if Docker told of it.
    pub fn describe(&self, id: &str) -> Option<ContainerInfo> {
        self.known.lock().ok()?.by_id.get(id).cloned()
    }
}

/// Reads create events until the stream ends, then subscribes again (the daemon restarted),
/// listing what was made meanwhile.
fn follow(socket: &Path, mut events: BufReader<UnixStream>, known: &Mutex<Known>) {
    loop {
        let mut line = String::new();
        while events.read_line(&mut line).is_ok_and(|read| read > 0) {
            if let Some(info) = parse_event(&line)
                && let Ok(mut known) = known.lock()
            {
                known.learn(info);
            }
            line.clear();
        }
        // A stopped daemon: look again now and then, quietly.
        loop {
            std::thread::sleep(Duration::from_secs(5));
            if let Ok(again) = subscribe(socket) {
                events = again;
                if let (Ok(listed), Ok(mut known)) = (list(socket), known.lock()) {
                    for info in listed {
                        known.learn(info);
                    }
                }
                break;
            }
        }
    }
}

/// `GET path` over HTTP/1.0 on the socket: the stream positioned at the body, once the
/// status said 200.
fn get(socket: &Path, path: &str) -> Result<BufReader<UnixStream>, Failure> {
    let mut stream = UnixStream::connect(socket).map_err(|error| match error.kind() {
        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound => Failure::Absent,
        _ => Failure::Refused(error.to_string()),
    })?;
    stream
        .set_write_timeout(Some(TIMEOUT))
        .and_then(|()| stream.set_read_timeout(Some(TIMEOUT)))
        .map_err(refused)?;
    write!(stream, "GET {API}{path} HTTP/1.0\r\nHost: docker\r\n\r\n").map_err(refused)?;
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status).map_err(refused)?;
    let code = status.split_whitespace().nth(1).unwrap_or("");
    if code != "200" {
        return Err(Failure::Refused(format!("HTTP status {code:?} for {path}")));
    }
    loop {
        let mut header = String::new();
        let read = reader.read_line(&mut header).map_err(refused)?;
        if read == 0 || header.trim().is_empty() {
            return Ok(reader);
        }
    }
}

/// Why the daemon gave no answer.
enum Failure {
    /// Nothing listens on the socket (a daemon that is stopped, or never ran): said nowhere.
    Absent,
    /// It answered, but not as expected.
    Refused(String),
}

fn refused(error: std::io::Error) -> Failure {
    Failure::Refused(error.to_string())
}

/// The containers there now.
fn list(socket: &Path) -> Result<Vec<ContainerInfo>, Failure> {
    let mut body = String::new();
    get(socket, "/containers/json?all=1")?
        .read_to_string(&mut body)
        .map_err(refused)?;
    parse_list(&body).map_err(Failure::Refused)
}

/// The event stream of containers made, waiting without end for the next one.
fn subscribe(socket: &Path) -> Result<BufReader<UnixStream>, Failure> {
    // {"type":["container"],"event":["create"]}, URL-encoded.
    let events = get(
        socket,
        "/events?filters=%7B%22type%22%3A%5B%22container%22%5D%2C%22event%22%3A%5B%22create%22%5D%7D",
    )?;
    events.get_ref().set_read_timeout(None).map_err(refused)?;
    Ok(events)
}

fn parse_list(body: &str) -> Result<Vec<ContainerInfo>, String> {
    let listed: Vec<ListedContainer> =
        serde_json::from_str(body).map_err(|error| format!("not the JSON expected: {error}"))?;
    Ok(listed
        .into_iter()
        .map(|mut container| {
            let docker_name = container
                .names
                .first()
                .map(|name| name.trim_start_matches('/').to_owned())
                .unwrap_or_default();
            let (name, pod) = kubernetes_names(&mut container.labels, docker_name);
            ContainerInfo {
                runtime: "docker".into(),
                name,
                id: container.id,
                image: container.image,
                image_id: container.image_id,
                pod,
            }
        })
        .collect())
}

/// The container's Kubernetes name and pod, when the kubelet's Docker shim (cri-dockerd)
/// labelled it; else its Docker name and no pod.
fn kubernetes_names(
    labels: &mut BTreeMap<String, String>,
    docker_name: String,
) -> (String, Option<PodNames>) {
    let pod_name = labels.remove("io.kubernetes.pod.name");
    let namespace = labels.remove("io.kubernetes.pod.namespace");
    let container = labels.remove("io.kubernetes.container.name");
    match (pod_name, namespace) {
        (Some(name), Some(namespace)) => (
            container.unwrap_or(docker_name),
            Some(PodNames { name, namespace }),
        ),
        _ => (docker_name, None),
    }
}

/// The container a `create` event tells of.
fn parse_event(line: &str) -> Option<ContainerInfo> {
    let event: Event = serde_json::from_str(line.trim()).ok()?;
    if event.kind != "container" || event.action != "create" {
        return None;
    }
    let mut actor = event.actor?;
    // The attributes hold the labels too.
    let docker_name = actor.attributes.remove("name").unwrap_or_default();
    let (name, pod) = kubernetes_names(&mut actor.attributes, docker_name);
    Some(ContainerInfo {
        runtime: "docker".into(),
        id: actor.id,
        name,
        image: actor.attributes.remove("image"),
        image_id: None,
        pod,
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixListener;

    use super::*;

    /// Docker 20.10.24's answers on this machine, recorded with curl on its socket.
    const LIST: &str = include_str!("testdata/docker-20.10-containers.json");
    const EVENTS: &str = include_str!("testdata/docker-20.10-events.jsonl");
    const LISTED_ID: &str = "c4cea240a8b102c2ec5ec17dd1f087ff316f5d40ad4def83ccd9328ed0b195c3";
    const MADE_ID: &str = "09e805fe92e7b59dad0857952199a1e34ca3471d8926a087dc88b84228ef02ba";

    /// A daemon that answers the list and the events with the recorded bodies, then keeps
    /// the event stream open, as dockerd does.
    fn fake_daemon(socket: &Path) {
        let listener = UnixListener::bind(socket).expect("bind the fake socket");
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut request = String::new();
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let _ = reader.read_line(&mut request);
                let head = "HTTP/1.0 200 OK\r\nApi-Version: 1.41\r\nContent-Type: application/json\r\nServer: Docker/20.10.24+dfsg1 (linux)\r\n\r\n";
                if request.starts_with("GET /v1.24/containers/json?all=1 ") {
                    let _ = write!(stream, "{head}{LIST}");
                } else if request.starts_with("GET /v1.24/events?") {
                    let _ = write!(stream, "{head}{EVENTS}");
                    // Held open: the stream waits for the next event.
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_secs(30));
                        drop(stream);
                    });
                } else {
                    let _ = write!(stream, "HTTP/1.0 404 Not Found\r\n\r\n");
                }
            }
        });
    }

    #[test]
    fn names_listed_containers_and_those_made_after_from_the_engine_api() {
        let dir = std::env::temp_dir().join(format!("wp-docker-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("make a directory");
        let socket = dir.join("docker.sock");
        let _ = std::fs::remove_file(&socket);
        fake_daemon(&socket);
        let docker = Docker::start(&socket).expect("the fake daemon answers");
        let listed = docker.describe(LISTED_ID).expect("the listed container");
        assert_eq!(listed.name, "wp-dock");
        assert_eq!(listed.image.as_deref(), Some("wp-busybox:test"));
        assert_eq!(
            listed.image_id.as_deref(),
            Some("sha256:d33215f35528ce8d92e690af4c64c30428c5df17b20fc5717f8193a5e3ff69f3")
        );
        // The one made after arrives on the event stream, read by the thread.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let made = loop {
            if let Some(made) = docker.describe(MADE_ID) {
                break made;
            }
            assert!(std::time::Instant::now() < deadline, "no create event read");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(made.name, "wp-dock-short");
        assert_eq!(made.image.as_deref(), Some("wp-busybox:test"));
        assert_eq!(made.runtime, "docker");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_container_the_kubelet_labelled_gets_its_pod_names() {
        // Docker 20.10.24's answers for a container labelled as cri-dockerd labels them.
        let listed =
            parse_list(include_str!("testdata/docker-20.10-k8s-containers.json")).expect("parses");
        let made = parse_event(include_str!("testdata/docker-20.10-k8s-events.jsonl"))
            .expect("a create event");
        for info in [&listed[0], &made] {
            assert_eq!(info.name, "ingest");
            assert_eq!(
                info.pod,
                Some(PodNames {
                    name: "ingest-7f9c".into(),
                    namespace: "batch".into()
                })
            );
        }
        let path = format!(
            "/kubepods/burstable/pod7c1f9e0a-3b2d-4e5f-8a6b-0c9d1e2f3a4b/docker-{}.scope",
            made.id
        );
        let identity = crate::model::identity::identify(&path);
        assert_eq!(identity.ids["runtime"], "docker");
        let named = identity.named_by(&made);
        assert_eq!(named.name, "batch/ingest-7f9c/ingest");
        assert_eq!(named.ids["pod_name"], "ingest-7f9c");
        assert_eq!(named.ids["namespace"], "batch");
        assert_eq!(named.ids["container_name"], "ingest");
        assert_eq!(named.ids["pod_uid"], "7c1f9e0a-3b2d-4e5f-8a6b-0c9d1e2f3a4b");
    }

    #[test]
    fn no_daemon_costs_nothing_and_other_events_are_ignored() {
        assert!(Docker::start(Path::new("/nonexistent/docker.sock")).is_none());
        assert!(
            parse_event(r#"{"Type":"container","Action":"start","Actor":{"ID":"x"}}"#).is_none()
        );
        assert!(parse_event("not json").is_none());
        assert!(parse_list("{").is_err());
    }
}
