//! containerd's and CRI-O's containers, from the Kubernetes CRI API (gRPC
//! `runtime.v1.RuntimeService` on the runtime's socket), as kubelet and crictl ask:
//! `ListPodSandbox` gives each pod's name, namespace and uid, `ListContainers` each
//! container's name, image and pod. CRI v1 has no change stream every runtime offers, so a
//! thread lists both again every second, and at once (at most every 250 ms) when a container
//! it does not know yet is asked about.
//!
//! The socket is connected to before `--user` drops the agent's rights (it is root's); the
//! thread keeps that connection.

use std::{
    collections::{HashMap, VecDeque},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::model::identity::{ContainerInfo, PodNames};

/// Where the CRI runtimes listen by default, with the name each goes by.
pub const SOCKETS: [(&str, &str); 3] = [
    ("containerd", "/run/containerd/containerd.sock"),
    ("crio", "/run/crio/crio.sock"),
    ("crio", "/var/run/crio/crio.sock"),
];

/// How often the lists are read again.
const REFRESH: Duration = Duration::from_secs(1);
/// The soonest a miss asks again.
const MISS_REFRESH: Duration = Duration::from_millis(250);
/// How long one call may take before the runtime is taken for stuck.
const TIMEOUT: Duration = Duration::from_secs(2);
/// How many containers stay known (those listed last): enough for any node's churn between a
/// container's start and its exit summary.
const MAX_KNOWN: usize = 4096;

/// The runtime's containers and pods, as it last listed them.
pub struct Cri {
    known: Arc<Mutex<Known>>,
    wake: tokio::sync::mpsc::Sender<()>,
}

#[derive(Default)]
struct Known {
    /// Containers, and each pod's sandbox (its pause container, named `POD`), by id.
    containers: HashMap<String, ContainerInfo>,
    /// Ids in the order learnt: the oldest are forgotten beyond [`MAX_KNOWN`].
    order: VecDeque<String>,
    /// Pods by uid.
    pods: HashMap<String, PodNames>,
}

impl Known {
    fn learn(&mut self, mut info: ContainerInfo) {
        // A container listed before its sandbox in one round keeps the pod it had.
        if info.pod.is_none()
            && let Some(known) = self.containers.get(&info.id)
        {
            info.pod = known.pod.clone();
        }
        if self
            .containers
            .insert(info.id.clone(), info.clone())
            .is_none()
        {
            self.order.push_back(info.id);
        }
        while self.order.len() > MAX_KNOWN {
            if let Some(oldest) = self.order.pop_front() {
                self.containers.remove(&oldest);
            }
        }
    }
}

impl Cri {
    /// Starts following the runtime `runtime` on `socket`; `None` when nothing listens there.
    /// A runtime that refuses is said once, and its containers keep the names their paths
    /// give.
    pub fn start(runtime: &'static str, socket: &Path) -> Option<Self> {
        let stream = std::os::unix::net::UnixStream::connect(socket).ok()?;
        let known = Arc::new(Mutex::new(Known::default()));
        let (wake, woken) = tokio::sync::mpsc::channel(1);
        let followed = Arc::clone(&known);
        let path = socket.to_path_buf();
        let spawned = std::thread::Builder::new()
            .name(format!("{runtime}-names"))
            .spawn(move || follow(runtime, &path, stream, &followed, woken));
        if spawned.is_err() {
            crate::say!(
                "workerprobe: {runtime} containers are named by id only: no thread could follow them"
            );
            return None;
        }
        Some(Self { known, wake })
    }

    /// The container (or pod sandbox) with this full id, if the runtime listed it; an unknown
    /// one has the lists read again soon.
    pub fn describe(&self, id: &str) -> Option<ContainerInfo> {
        let found = self.known.lock().ok()?.containers.get(id).cloned();
        if found.is_none() {
            let _ = self.wake.try_send(());
        }
        found
    }

    /// The pod with this uid, if the runtime listed it.
    pub fn pod(&self, uid: &str) -> Option<PodNames> {
        self.known.lock().ok()?.pods.get(uid).cloned()
    }
}

/// The thread: lists pods and containers, every [`REFRESH`] or sooner when woken.
fn follow(
    runtime: &'static str,
    socket: &Path,
    stream: std::os::unix::net::UnixStream,
    known: &Mutex<Known>,
    mut woken: tokio::sync::mpsc::Receiver<()>,
) {
    let Ok(tokio_runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        crate::say!("workerprobe: {runtime} containers are named by id only: no async runtime");
        return;
    };
    tokio_runtime.block_on(async {
        let mut client = match Client::connect(socket, stream).await {
            Ok(client) => client,
            // Docker's own containerd runs with its CRI plugin off: no CRI runtime here.
            Err(Refusal::Unimplemented) => return,
            Err(Refusal::Other(reason)) => {
                crate::say!(
                    "workerprobe: {runtime} containers are named by id only: {} does not answer the CRI API ({reason})",
                    socket.display()
                );
                return;
            }
        };
        let mut said = false;
        loop {
            match client.list(runtime).await {
                Ok((containers, pods)) => {
                    if let Ok(mut known) = known.lock() {
                        for info in containers {
                            known.learn(info);
                        }
                        // Pods listed now are put back at once: only gone ones are forgotten.
                        if known.pods.len() + pods.len() > MAX_KNOWN {
                            known.pods.clear();
                        }
                        known.pods.extend(pods);
                    }
                }
                Err(reason) if !said => {
                    said = true;
                    crate::say!(
                        "workerprobe: {runtime} containers made from now on may be named by id only: listing them failed ({reason})"
                    );
                }
                Err(_) => {}
            }
            tokio::time::sleep(MISS_REFRESH).await;
            // Wait out the rest of the second unless a miss asks sooner; end with the agent's
            // side.
            if let Ok(None) = tokio::time::timeout(REFRESH - MISS_REFRESH, woken.recv()).await {
                return;
            }
        }
    });
}

/// Why a socket gave no CRI client.
enum Refusal {
    /// It does not serve the CRI API (Docker's containerd has the plugin off).
    Unimplemented,
    /// Anything else, as the end of a sentence.
    Other(String),
}

/// A CRI client on one connection.
struct Client {
    grpc: tonic::client::Grpc<tonic::transport::Channel>,
}

impl Client {
    /// A client over `stream`, already connected to `socket` (reconnections open the path).
    async fn connect(
        socket: &Path,
        stream: std::os::unix::net::UnixStream,
    ) -> Result<Self, Refusal> {
        stream
            .set_nonblocking(true)
            .map_err(|e| Refusal::Other(e.to_string()))?;
        let first = Arc::new(Mutex::new(Some(stream)));
        let path: PathBuf = socket.to_path_buf();
        // The URI is required by the type and unused: the connector opens the socket.
        let channel = tonic::transport::Endpoint::from_static("http://localhost")
            .connect_timeout(TIMEOUT)
            .timeout(TIMEOUT)
            .connect_with_connector(tower::service_fn(move |_: http::Uri| {
                let first = first.lock().ok().and_then(|mut first| first.take());
                let path = path.clone();
                async move {
                    let stream = match first {
                        Some(stream) => tokio::net::UnixStream::from_std(stream)?,
                        None => tokio::net::UnixStream::connect(&path).await?,
                    };
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|e| Refusal::Other(e.to_string()))?;
        let mut client = Self {
            grpc: tonic::client::Grpc::new(channel),
        };
        let version: proto::VersionResponse = client
            .call(
                "/runtime.v1.RuntimeService/Version",
                proto::VersionRequest {
                    version: "v1".into(),
                },
            )
            .await
            .map_err(|status| match status.code() {
                tonic::Code::Unimplemented => Refusal::Unimplemented,
                _ => Refusal::Other(status.message().to_owned()),
            })?;
        if version.runtime_api_version != "v1" {
            return Err(Refusal::Other(format!(
                "it speaks CRI {}, not v1",
                version.runtime_api_version
            )));
        }
        Ok(client)
    }

    /// One unary call.
    async fn call<Request, Response>(
        &mut self,
        path: &'static str,
        request: Request,
    ) -> Result<Response, tonic::Status>
    where
        Request: prost::Message + Send + Sync + 'static,
        Response: prost::Message + Default + Send + Sync + 'static,
    {
        self.grpc
            .ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let codec = tonic_prost::ProstCodec::<Request, Response>::default();
        self.grpc
            .unary(
                tonic::Request::new(request),
                http::uri::PathAndQuery::from_static(path),
                codec,
            )
            .await
            .map(tonic::Response::into_inner)
    }

    /// Every container and pod sandbox (as containers named `POD`), and every pod by uid.
    async fn list(
        &mut self,
        runtime: &str,
    ) -> Result<(Vec<ContainerInfo>, Vec<(String, PodNames)>), String> {
        let sandboxes: proto::ListPodSandboxResponse = self
            .call(
                "/runtime.v1.RuntimeService/ListPodSandbox",
                proto::ListPodSandboxRequest::default(),
            )
            .await
            .map_err(|status| status.message().to_owned())?;
        let containers: proto::ListContainersResponse = self
            .call(
                "/runtime.v1.RuntimeService/ListContainers",
                proto::ListContainersRequest::default(),
            )
            .await
            .map_err(|status| status.message().to_owned())?;
        Ok(describe_all(runtime, sandboxes, containers))
    }
}

/// Containers (and sandboxes) named with their pods', and the pods by uid.
fn describe_all(
    runtime: &str,
    sandboxes: proto::ListPodSandboxResponse,
    containers: proto::ListContainersResponse,
) -> (Vec<ContainerInfo>, Vec<(String, PodNames)>) {
    let pod_of: HashMap<String, (String, PodNames)> = sandboxes
        .items
        .iter()
        .filter_map(|sandbox| {
            let metadata = sandbox.metadata.as_ref()?;
            let names = PodNames {
                name: metadata.name.clone(),
                namespace: metadata.namespace.clone(),
            };
            Some((sandbox.id.clone(), (metadata.uid.clone(), names)))
        })
        .collect();
    let mut described: Vec<ContainerInfo> = pod_of
        .iter()
        .map(|(id, (_, pod))| ContainerInfo {
            runtime: runtime.to_owned(),
            id: id.clone(),
            // Kubernetes' name for a pod's sandbox (pause) container: the runtime's overhead.
            name: "POD".to_owned(),
            image: None,
            image_id: None,
            pod: Some(pod.clone()),
        })
        .collect();
    described.extend(containers.containers.into_iter().map(|container| {
        let pod = pod_of
            .get(&container.pod_sandbox_id)
            .map(|(_, pod)| pod.clone());
        ContainerInfo {
            runtime: runtime.to_owned(),
            name: container.metadata.map(|m| m.name).unwrap_or_default(),
            image: container
                .image
                .map(|image| image.image)
                .filter(|image| !image.is_empty()),
            image_id: (!container.image_ref.is_empty()).then_some(container.image_ref),
            id: container.id,
            pod,
        }
    }));
    let pods = pod_of.into_values().collect();
    (described, pods)
}

/// The few CRI v1 messages read here, with the field numbers of CRI's api.proto (fields not
/// declared are skipped when decoding).
mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct VersionRequest {
        #[prost(string, tag = "1")]
        pub version: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct VersionResponse {
        #[prost(string, tag = "1")]
        pub version: String,
        #[prost(string, tag = "2")]
        pub runtime_name: String,
        #[prost(string, tag = "3")]
        pub runtime_version: String,
        #[prost(string, tag = "4")]
        pub runtime_api_version: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodSandboxRequest {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListPodSandboxResponse {
        #[prost(message, repeated, tag = "1")]
        pub items: Vec<PodSandbox>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandbox {
        #[prost(string, tag = "1")]
        pub id: String,
        #[prost(message, optional, tag = "2")]
        pub metadata: Option<PodSandboxMetadata>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PodSandboxMetadata {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub uid: String,
        #[prost(string, tag = "3")]
        pub namespace: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListContainersRequest {}

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListContainersResponse {
        #[prost(message, repeated, tag = "1")]
        pub containers: Vec<Container>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Container {
        #[prost(string, tag = "1")]
        pub id: String,
        #[prost(string, tag = "2")]
        pub pod_sandbox_id: String,
        #[prost(message, optional, tag = "3")]
        pub metadata: Option<ContainerMetadata>,
        #[prost(message, optional, tag = "4")]
        pub image: Option<ImageSpec>,
        #[prost(string, tag = "5")]
        pub image_ref: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ContainerMetadata {
        #[prost(string, tag = "1")]
        pub name: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ImageSpec {
        #[prost(string, tag = "1")]
        pub image: String,
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::BodyExt as _;

    use super::*;
    use crate::model::identity::{WorkerKind, identify};

    /// What containerd 1.6.20 (Debian 12) answered for a pod `data/ingest-7f9c` with one
    /// container `worker`, run as kubelet asks (testdata/cri/record.py).
    const RECORDED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src/runtimes/testdata/cri");
    const CONTAINER: &str = "c1565933b3bb5e5afcb671feee03552d6fbff14809b6d899217f93b2370739dc";
    const SANDBOX: &str = "50fb0d7ebf82ae124f19f9659c3a9b018d82ffcd3a4ce918ff5d8a07159f9413";
    const POD_UID: &str = "5d1c2a3b-8e4f-4a6b-9c0d-1e2f3a4b5c6d";

    /// One recorded answer as a gRPC response: the message framed, then `grpc-status: 0`.
    async fn answer(
        request: http::Request<hyper::body::Incoming>,
    ) -> Result<
        http::Response<impl hyper::body::Body<Data = bytes::Bytes, Error = Infallible>>,
        Infallible,
    > {
        let name = match request.uri().path() {
            "/runtime.v1.RuntimeService/Version" => "version",
            "/runtime.v1.RuntimeService/ListPodSandbox" => "list_pod_sandbox",
            "/runtime.v1.RuntimeService/ListContainers" => "list_containers",
            other => panic!("the agent asked for {other}"),
        };
        let message = std::fs::read(format!("{RECORDED}/{name}.pb")).expect("recorded answer");
        let mut framed = vec![0u8];
        framed.extend((message.len() as u32).to_be_bytes());
        framed.extend(message);
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        let body = http_body_util::Full::new(bytes::Bytes::from(framed))
            .with_trailers(async move { Some(Ok(trailers)) });
        Ok(http::Response::builder()
            .header("content-type", "application/grpc")
            .body(body)
            .expect("response"))
    }

    /// A CRI runtime on `socket` that answers with the recorded messages.
    fn fake_runtime(socket: &Path) {
        let listener = std::os::unix::net::UnixListener::bind(socket).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::UnixListener::from_std(listener).expect("listener");
                loop {
                    let (stream, _) = listener.accept().await.expect("accept");
                    tokio::spawn(
                        hyper::server::conn::http2::Builder::new(
                            hyper_util::rt::TokioExecutor::new(),
                        )
                        .serve_connection(
                            hyper_util::rt::TokioIo::new(stream),
                            hyper::service::service_fn(answer),
                        ),
                    );
                }
            });
        });
    }

    #[test]
    fn containers_and_pods_are_named_from_containerds_recorded_answers() {
        let dir = std::env::temp_dir().join(format!("wp-cri-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let socket = dir.join("containerd.sock");
        fake_runtime(&socket);
        let cri = Cri::start("containerd", &socket).expect("the fake runtime answers");
        let started = std::time::Instant::now();
        let container = loop {
            if let Some(info) = cri.describe(CONTAINER) {
                break info;
            }
            assert!(started.elapsed() < Duration::from_secs(10), "never listed");
            std::thread::sleep(Duration::from_millis(20));
        };
        let pod = PodNames {
            name: "ingest-7f9c".into(),
            namespace: "data".into(),
        };
        assert_eq!(
            container,
            ContainerInfo {
                runtime: "containerd".into(),
                id: CONTAINER.into(),
                name: "worker".into(),
                image: Some("localhost/wp-busybox:test".into()),
                image_id: Some(
                    "sha256:2d2e1378988bc94b084f9a6aa004d163abe825c21527f6e7849a59111e7565ab"
                        .into()
                ),
                pod: Some(pod.clone()),
            }
        );
        let sandbox = cri.describe(SANDBOX).expect("the pod's sandbox");
        assert_eq!(
            (sandbox.name.as_str(), sandbox.pod),
            ("POD", Some(pod.clone()))
        );
        assert_eq!(cri.pod(POD_UID), Some(pod));

        // Where containerd put them with the cgroupfs driver, named end to end.
        let pod_path = format!("/kubepods/burstable/pod{POD_UID}");
        let mut names = super::super::WorkerNames::new(super::super::Runtimes {
            cri: Some(cri),
            ..super::super::Runtimes::none()
        });
        let worker = names.identity(1, &format!("{pod_path}/{CONTAINER}"));
        assert_eq!(worker.kind, WorkerKind::Kubernetes);
        assert_eq!(worker.name, "data/ingest-7f9c/worker");
        assert_eq!(worker.ids["container_name"], "worker");
        assert_eq!(worker.ids["pod_name"], "ingest-7f9c");
        assert_eq!(worker.ids["namespace"], "data");
        assert_eq!(worker.ids["image"], "localhost/wp-busybox:test");
        assert_eq!(worker.ids["runtime"], "containerd");
        assert_eq!(
            names.identity(2, &format!("{pod_path}/{SANDBOX}")).name,
            "data/ingest-7f9c/POD"
        );
        let pod_cgroup = names.identity(3, &pod_path);
        assert_eq!(pod_cgroup.name, "data/ingest-7f9c");
        assert!(!pod_cgroup.wants_runtime_names());
        assert_eq!(identify(&pod_path).ids["pod_uid"], POD_UID);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn no_runtime_costs_nothing() {
        assert!(Cri::start("containerd", Path::new("/nonexistent/containerd.sock")).is_none());
    }
}
