//! Who a worker is: the container, pod, systemd unit or plain cgroup that a cgroup path names.
//!
//! This module owns reading meaning into cgroup paths (relative to the cgroup2 mount, `/` is
//! the root). It is a pure function of the path: no file is read, so a cgroup that is already
//! gone is still named, and every layout can be tested from a string.
//!
//! The path is read component by component from the deepest up, and the deepest component
//! that matches a known layout decides the identity. So a Kubernetes container inside a
//! `kind` node container is the Kubernetes container, and a service's own sub-cgroups stay
//! the service's (their name gets the rest of the path appended, so that two cgroups of one
//! worker do not share a name). A `.slice` only counts when it is the last component: a slice
//! groups units, and a plain directory under one is not the slice.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A container id is 64 hex digits; anything shorter is a unit that merely looks like one.
const CONTAINER_ID_LEN: usize = 64;
/// How much of a container id is shown, as `docker ps` does.
const SHORT_CONTAINER_ID_LEN: usize = 12;
/// A pod uid holds 32 hex digits: a UUID, or for a static pod the hash of its manifest.
const POD_UID_HEX_DIGITS: usize = 32;
/// How much of a pod uid is shown: the UUID's first group.
const SHORT_POD_UID_LEN: usize = 8;

/// What a cgroup path says about the worker it holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// Short human name: container id (12 chars), pod-uid/container, unit name, or the path's
    /// last component ("/" for the root).
    pub name: String,
    /// What kind of worker: one of the WorkerKind values.
    pub kind: WorkerKind,
    /// Ids found in the path, e.g. {"container_id": "...", "pod_uid": "...", "qos":
    /// "burstable", "unit": "nginx.service"}; a BTreeMap for stable JSON.
    pub ids: BTreeMap<String, String>,
}

/// What a container runtime's own state says of one of its containers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerInfo {
    /// The runtime that made it: `podman`, `docker`, …
    pub runtime: String,
    /// The full container id.
    pub id: String,
    /// The name the user gave it (`podman run --name`), or the runtime chose.
    pub name: String,
    /// The image it runs, as the user named it (`localhost/busybox:latest`).
    pub image: Option<String>,
    /// The image's id.
    pub image_id: Option<String>,
    /// The Kubernetes pod it belongs to, when its runtime labels it so.
    pub pod: Option<PodNames>,
}

/// A Kubernetes pod's names, as the `io.kubernetes.*` labels on its containers give them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodNames {
    /// The pod's name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
}

impl Identity {
    /// Whether this identity names a container whose runtime could tell more: a container
    /// id is known but no container name yet.
    pub fn wants_container_name(&self) -> bool {
        self.ids.contains_key("container_id") && !self.ids.contains_key("container_name")
    }

    /// Whether this identity names a Kubernetes pod's own cgroup whose runtime could tell
    /// the pod's name: its uid is known but no name yet.
    pub fn wants_pod_name(&self) -> bool {
        self.kind == WorkerKind::Kubernetes
            && self.ids.contains_key("pod_uid")
            && !self.ids.contains_key("container_id")
            && !self.ids.contains_key("pod_name")
    }

    /// Whether a runtime could still name this worker better.
    pub fn wants_runtime_names(&self) -> bool {
        self.wants_container_name() || self.wants_pod_name()
    }

    /// The container id the path gave, when it names a container.
    pub fn container_id(&self) -> Option<&str> {
        self.ids.get("container_id").map(String::as_str)
    }

    /// This identity with what the container's runtime says: its name replaces the short id
    /// in the worker's name, and the name, image and runtime join the ids.
    pub fn named_by(mut self, info: &ContainerInfo) -> Identity {
        if let Some(id) = self.container_id()
            && id == info.id
            && !info.name.is_empty()
        {
            let short_id = short(&info.id, SHORT_CONTAINER_ID_LEN).to_owned();
            self.name = self.name.replacen(&short_id, &info.name, 1);
            if let Some(pod) = &info.pod {
                // `namespace/pod/container`, as kubectl would point at it.
                self.name = format!("{}/{}/{}", pod.namespace, pod.name, info.name);
                self.ids.insert("pod_name".to_owned(), pod.name.clone());
                self.ids
                    .insert("namespace".to_owned(), pod.namespace.clone());
            }
            self.ids
                .insert("container_name".to_owned(), info.name.clone());
            self.ids.insert("runtime".to_owned(), info.runtime.clone());
            if let Some(image) = &info.image {
                self.ids.insert("image".to_owned(), image.clone());
            }
            if let Some(image_id) = &info.image_id {
                self.ids.insert("image_id".to_owned(), image_id.clone());
            }
        }
        self
    }

    /// This pod's cgroup, named as its runtime lists the pod: `namespace/name`.
    pub fn named_by_pod(mut self, pod: &PodNames) -> Identity {
        if pod.name.is_empty() {
            return self;
        }
        self.name = format!("{}/{}", pod.namespace, pod.name);
        self.ids.insert("pod_name".to_owned(), pod.name.clone());
        self.ids
            .insert("namespace".to_owned(), pod.namespace.clone());
        self
    }
}

/// The kinds of worker a cgroup path can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerKind {
    /// A Docker container outside Kubernetes (`docker-<id>.scope` or `/docker/<id>`).
    Docker,
    /// A podman container (`libpod-<id>.scope`, or `/libpod_parent/libpod-<id>` with the
    /// cgroupfs manager), or podman's own monitor for one (`libpod-conmon-<id>.scope`, with
    /// `role: conmon` in its ids: the runtime's overhead, not the container's work).
    Podman,
    /// A Kubernetes pod, or one container of it (under a `kubepods` cgroup).
    Kubernetes,
    /// A systemd service (`*.service`).
    SystemdService,
    /// A systemd scope (`*.scope`): a session, a transient unit, `init.scope`.
    SystemdScope,
    /// A systemd slice (`*.slice`), which groups other units.
    SystemdSlice,
    /// A cgroup workerprobe made itself to run a command (`/workerprobe/exec-<name>`).
    Exec,
    /// Any other cgroup.
    Cgroup,
    /// The root cgroup: processes in no worker.
    Root,
}

impl WorkerKind {
    /// The kind's name, the same snake_case string as in JSON.
    pub fn as_str(&self) -> &'static str {
        match self {
            WorkerKind::Docker => "docker",
            WorkerKind::Podman => "podman",
            WorkerKind::Kubernetes => "kubernetes",
            WorkerKind::SystemdService => "systemd_service",
            WorkerKind::SystemdScope => "systemd_scope",
            WorkerKind::SystemdSlice => "systemd_slice",
            WorkerKind::Exec => "exec",
            WorkerKind::Cgroup => "cgroup",
            WorkerKind::Root => "root",
        }
    }
}

/// Names the worker a cgroup path (relative to the cgroup2 mount) holds.
///
/// Empty components are ignored, so a trailing or doubled `/` changes nothing, and a path with
/// no component at all is the root.
pub fn identify(path: &str) -> Identity {
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let Some(last) = components.last() else {
        return Identity {
            name: "/".to_owned(),
            kind: WorkerKind::Root,
            ids: BTreeMap::new(),
        };
    };
    for index in (0..components.len()).rev() {
        if let Some(mut identity) = identify_at(&components, index) {
            let below = &components[index + 1..];
            if !below.is_empty() {
                identity.name = format!("{}/{}", identity.name, below.join("/"));
            }
            return identity;
        }
    }
    Identity {
        name: (*last).to_owned(),
        kind: WorkerKind::Cgroup,
        ids: BTreeMap::new(),
    }
}

/// The identity that component `index` gives, given the components above it; `None` when it
/// matches no layout.
fn identify_at(components: &[&str], index: usize) -> Option<Identity> {
    let component = components[index];
    let parent = index.checked_sub(1).map(|p| components[p]);
    let is_last = index + 1 == components.len();

    // Kubernetes comes first: its containers use the same `docker-<id>.scope` name as plain
    // Docker, and only the pod above tells them apart.
    if let Some((runtime, container_id)) = container_component(component)
        && let Some(pod) = index
            .checked_sub(1)
            .and_then(|p| pod_component(components, p))
    {
        let name = format!(
            "{}/{}",
            pod.short_name(),
            short(container_id, SHORT_CONTAINER_ID_LEN)
        );
        let mut ids = pod.ids();
        ids.insert("container_id".to_owned(), container_id.to_owned());
        if let Some(runtime) = runtime {
            ids.insert("runtime".to_owned(), runtime.to_owned());
        }
        return Some(identity(name, WorkerKind::Kubernetes, ids));
    }
    if let Some(pod) = pod_component(components, index) {
        return Some(identity(
            pod.short_name(),
            WorkerKind::Kubernetes,
            pod.ids(),
        ));
    }

    let docker_id = match container_component(component) {
        Some((Some("docker"), id)) => Some(id),
        // The cgroupfs driver puts containers, by bare id, under `/docker`.
        Some((None, id)) if parent == Some("docker") => Some(id),
        _ => None,
    };
    if let Some(id) = docker_id {
        return Some(identity(
            short(id, SHORT_CONTAINER_ID_LEN).to_owned(),
            WorkerKind::Docker,
            BTreeMap::from([("container_id".to_owned(), id.to_owned())]),
        ));
    }

    if let Some((id, role)) = podman_component(component) {
        let mut ids = BTreeMap::from([
            ("container_id".to_owned(), id.to_owned()),
            ("runtime".to_owned(), "podman".to_owned()),
        ]);
        let mut name = short(id, SHORT_CONTAINER_ID_LEN).to_owned();
        if let Some(role) = role {
            ids.insert("role".to_owned(), role.to_owned());
            name = format!("{role}-{name}");
        }
        return Some(identity(name, WorkerKind::Podman, ids));
    }

    if let Some(exec) = component.strip_prefix("exec-")
        && !exec.is_empty()
        && parent == Some("workerprobe")
    {
        // `exec-<agent pid>-<name>`: the name is what the user chose.
        let (name, ids) = match exec.split_once('-') {
            Some((pid, name))
                if !name.is_empty()
                    && !pid.is_empty()
                    && pid.bytes().all(|b| b.is_ascii_digit()) =>
            {
                (
                    name,
                    BTreeMap::from([
                        ("exec".to_owned(), name.to_owned()),
                        ("agent_pid".to_owned(), pid.to_owned()),
                    ]),
                )
            }
            _ => (exec, BTreeMap::from([("exec".to_owned(), exec.to_owned())])),
        };
        return Some(identity(name.to_owned(), WorkerKind::Exec, ids));
    }

    let unit = |stem: &str, kind| {
        Some(identity(
            stem.to_owned(),
            kind,
            BTreeMap::from([("unit".to_owned(), component.to_owned())]),
        ))
    };
    if let Some(stem) = unit_stem(component, ".service") {
        return unit(stem, WorkerKind::SystemdService);
    }
    if let Some(stem) = unit_stem(component, ".scope") {
        return unit(stem, WorkerKind::SystemdScope);
    }
    if is_last && let Some(stem) = unit_stem(component, ".slice") {
        return unit(stem, WorkerKind::SystemdSlice);
    }
    None
}

fn identity(name: String, kind: WorkerKind, ids: BTreeMap<String, String>) -> Identity {
    Identity { name, kind, ids }
}

/// A container's cgroup name: `cri-containerd-<id>.scope`, `crio-<id>.scope`,
/// `docker-<id>.scope` or a bare `<id>`, as (runtime when the name tells, id).
fn container_component(component: &str) -> Option<(Option<&'static str>, &str)> {
    const SCOPES: [(&str, &str); 3] = [
        ("cri-containerd-", "containerd"),
        ("crio-", "crio"),
        ("docker-", "docker"),
    ];
    if is_container_id(component) {
        return Some((None, component));
    }
    let inner = component.strip_suffix(".scope")?;
    SCOPES.iter().find_map(|(prefix, runtime)| {
        inner
            .strip_prefix(prefix)
            .filter(|id| is_container_id(id))
            .map(|id| (Some(*runtime), id))
    })
}

/// A podman cgroup: `libpod-<id>.scope` (systemd manager), `libpod-<id>` (cgroupfs manager),
/// or `libpod-conmon-<id>.scope`, podman's monitor process for the container (role `conmon`).
fn podman_component(component: &str) -> Option<(&str, Option<&'static str>)> {
    let inner = component.strip_suffix(".scope").unwrap_or(component);
    let rest = inner.strip_prefix("libpod-")?;
    let (id, role) = match rest.strip_prefix("conmon-") {
        Some(id) => (id, Some("conmon")),
        None => (rest, None),
    };
    is_container_id(id).then_some((id, role))
}

fn is_container_id(text: &str) -> bool {
    text.len() == CONTAINER_ID_LEN && text.bytes().all(|b| b.is_ascii_hexdigit())
}

/// What a pod's cgroup says about it.
struct Pod {
    /// The pod uid, with `-` separators.
    uid: String,
    /// `guaranteed`, `burstable` or `besteffort`.
    qos: &'static str,
}

impl Pod {
    fn short_name(&self) -> String {
        format!("pod-{}", short(&self.uid, SHORT_POD_UID_LEN))
    }

    fn ids(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("pod_uid".to_owned(), self.uid.clone()),
            ("qos".to_owned(), self.qos.to_owned()),
        ])
    }
}

/// The pod that component `index` is, if it is one: `kubepods[-<qos>]-pod<uid>.slice` (the
/// systemd driver, which names its own `kubepods` ancestry) or `pod<uid>` below a `kubepods`
/// component (the cgroupfs driver).
fn pod_component(components: &[&str], index: usize) -> Option<Pod> {
    let component = components[index];
    if let Some(rest) = component
        .strip_suffix(".slice")
        .and_then(|name| name.strip_prefix("kubepods-"))
    {
        let (qos, rest) = match rest.split_once('-') {
            Some((qos @ ("burstable" | "besteffort"), rest)) => (qos_name(qos)?, rest),
            _ => ("guaranteed", rest),
        };
        let uid = pod_uid(rest.strip_prefix("pod")?)?;
        return Some(Pod { uid, qos });
    }

    let uid = pod_uid(component.strip_prefix("pod")?)?;
    let above = &components[..index];
    let kubepods = above.iter().position(|c| is_kubepods(c))?;
    // Without a QoS level between `kubepods` and the pod, the pod is guaranteed.
    let qos = above[kubepods..]
        .iter()
        .filter_map(|c| {
            let name = c.strip_suffix(".slice").unwrap_or(c);
            qos_name(name.strip_prefix("kubepods-").unwrap_or(name))
        })
        .next_back()
        .unwrap_or("guaranteed");
    Some(Pod { uid, qos })
}

fn is_kubepods(component: &str) -> bool {
    let name = component.strip_suffix(".slice").unwrap_or(component);
    name == "kubepods" || name.starts_with("kubepods-")
}

fn qos_name(text: &str) -> Option<&'static str> {
    match text {
        "burstable" => Some("burstable"),
        "besteffort" => Some("besteffort"),
        _ => None,
    }
}

/// A pod uid as written in a cgroup name, with `-` for the systemd driver's `_`; `None` unless
/// it is 32 hex digits and separators, so that e.g. `podcast` is not a pod.
fn pod_uid(text: &str) -> Option<String> {
    let uid: String = text
        .chars()
        .map(|c| if c == '_' { '-' } else { c })
        .collect();
    let hex_digits = uid.chars().filter(char::is_ascii_hexdigit).count();
    let well_formed = uid.chars().all(|c| c == '-' || c.is_ascii_hexdigit());
    (well_formed && hex_digits == POD_UID_HEX_DIGITS).then_some(uid)
}

/// The unit name without its type suffix, when `component` is a unit of that type.
fn unit_stem<'a>(component: &'a str, suffix: &str) -> Option<&'a str> {
    component
        .strip_suffix(suffix)
        .filter(|stem| !stem.is_empty())
}

/// The first `len` characters of `text` (all of it when shorter).
fn short(text: &str, len: usize) -> &str {
    text.char_indices()
        .nth(len)
        .map_or(text, |(end, _)| &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    const CID: &str = "4f3a9c1e7b2d5a8f0c6e3b9d1a7f4c2e8b5d0a3f6c9e2b7d4a1f8c5e0b3d6a9f";
    const CID2: &str = "9e2b7d4a1f8c5e0b3d6a9f4f3a9c1e7b2d5a8f0c6e3b9d1a7f4c2e8b5d0a3f6c";
    const UID: &str = "7c1f9e0a-3b2d-4e5f-8a6b-0c9d1e2f3a4b";
    const UID_SYSTEMD: &str = "7c1f9e0a_3b2d_4e5f_8a6b_0c9d1e2f3a4b";

    fn ids(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn check(path: &str, kind: WorkerKind, name: &str, expected_ids: &[(&str, &str)]) {
        let identity = identify(path);
        assert_eq!(
            identity,
            Identity {
                name: name.to_owned(),
                kind,
                ids: ids(expected_ids),
            },
            "path {path}"
        );
    }

    #[test]
    fn root() {
        check("/", WorkerKind::Root, "/", &[]);
        check("", WorkerKind::Root, "/", &[]);
        check("//", WorkerKind::Root, "/", &[]);
    }

    #[test]
    fn docker_systemd_driver() {
        check(
            &format!("/system.slice/docker-{CID}.scope"),
            WorkerKind::Docker,
            "4f3a9c1e7b2d",
            &[("container_id", CID)],
        );
    }

    #[test]
    fn docker_cgroupfs_driver() {
        check(
            &format!("/docker/{CID}"),
            WorkerKind::Docker,
            "4f3a9c1e7b2d",
            &[("container_id", CID)],
        );
    }

    #[test]
    fn docker_sub_cgroup_keeps_the_container_and_names_the_rest() {
        check(
            &format!("/system.slice/docker-{CID}.scope/app/worker"),
            WorkerKind::Docker,
            "4f3a9c1e7b2d/app/worker",
            &[("container_id", CID)],
        );
    }

    #[test]
    fn docker_like_names_that_are_not_containers() {
        check(
            "/system.slice/docker-compose-web.scope",
            WorkerKind::SystemdScope,
            "docker-compose-web",
            &[("unit", "docker-compose-web.scope")],
        );
        // 64 characters, but not hex.
        let not_hex = "z".repeat(64);
        check(
            &format!("/system.slice/docker-{not_hex}.scope"),
            WorkerKind::SystemdScope,
            &format!("docker-{not_hex}"),
            &[("unit", &format!("docker-{not_hex}.scope"))],
        );
        // Hex, but too short.
        check(
            "/system.slice/docker-4f3a9c1e7b2d.scope",
            WorkerKind::SystemdScope,
            "docker-4f3a9c1e7b2d",
            &[("unit", "docker-4f3a9c1e7b2d.scope")],
        );
        check(
            "/docker/not-a-container",
            WorkerKind::Cgroup,
            "not-a-container",
            &[],
        );
        check(
            "/system.slice/docker.service",
            WorkerKind::SystemdService,
            "docker",
            &[("unit", "docker.service")],
        );
        // A bare id outside `/docker` and outside a pod says nothing about who made it.
        check(&format!("/other/{CID}"), WorkerKind::Cgroup, CID, &[]);
    }

    #[test]
    fn podman_systemd_and_cgroupfs_managers() {
        let podman = |name: &'static str| {
            vec![("container_id", CID), ("runtime", "podman")]
                .into_iter()
                .chain((!name.is_empty()).then_some(("role", name)))
                .collect::<Vec<_>>()
        };
        check(
            &format!("/machine.slice/libpod-{CID}.scope"),
            WorkerKind::Podman,
            "4f3a9c1e7b2d",
            &podman(""),
        );
        check(
            &format!("/machine.slice/libpod-{CID}.scope/container"),
            WorkerKind::Podman,
            "4f3a9c1e7b2d/container",
            &podman(""),
        );
        check(
            &format!("/libpod_parent/libpod-{CID}"),
            WorkerKind::Podman,
            "4f3a9c1e7b2d",
            &podman(""),
        );
        // Rootless, under the user's own systemd.
        check(
            &format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope"),
            WorkerKind::Podman,
            "4f3a9c1e7b2d",
            &podman(""),
        );
        check(
            &format!("/machine.slice/libpod-conmon-{CID}.scope"),
            WorkerKind::Podman,
            "conmon-4f3a9c1e7b2d",
            &podman("conmon"),
        );
        check(
            "/machine.slice/libpod-short.scope",
            WorkerKind::SystemdScope,
            "libpod-short",
            &[("unit", "libpod-short.scope")],
        );
        check("/libpod_parent", WorkerKind::Cgroup, "libpod_parent", &[]);
    }

    #[test]
    fn a_runtime_names_its_container() {
        let info = ContainerInfo {
            runtime: "podman".into(),
            id: CID.into(),
            name: "wp-burn".into(),
            image: Some("localhost/busybox:test".into()),
            image_id: None,
            pod: None,
        };
        let identity = identify(&format!("/machine.slice/libpod-{CID}.scope/container"));
        assert!(identity.wants_container_name());
        let named = identity.named_by(&info);
        assert_eq!(named.name, "wp-burn/container");
        assert_eq!(named.ids["container_name"], "wp-burn");
        assert_eq!(named.ids["image"], "localhost/busybox:test");
        assert_eq!(named.ids["container_id"], CID);
        assert!(!named.wants_container_name());
        let conmon = identify(&format!("/machine.slice/libpod-conmon-{CID}.scope")).named_by(&info);
        assert_eq!(conmon.name, "conmon-wp-burn");
        assert_eq!(conmon.ids["role"], "conmon");
        // Another container's facts change nothing.
        let other = identify(&format!("/docker/{CID2}"));
        assert_eq!(other.clone().named_by(&info), other);
    }

    #[test]
    fn kubernetes_systemd_driver_containerd() {
        let pod = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_SYSTEMD}.slice"
        );
        check(
            &format!("{pod}/cri-containerd-{CID}.scope"),
            WorkerKind::Kubernetes,
            "pod-7c1f9e0a/4f3a9c1e7b2d",
            &[
                ("pod_uid", UID),
                ("qos", "burstable"),
                ("container_id", CID),
                ("runtime", "containerd"),
            ],
        );
        check(
            &pod,
            WorkerKind::Kubernetes,
            "pod-7c1f9e0a",
            &[("pod_uid", UID), ("qos", "burstable")],
        );
    }

    #[test]
    fn kubernetes_systemd_driver_crio_besteffort() {
        check(
            &format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_SYSTEMD}.slice/crio-{CID}.scope"
            ),
            WorkerKind::Kubernetes,
            "pod-7c1f9e0a/4f3a9c1e7b2d",
            &[
                ("pod_uid", UID),
                ("qos", "besteffort"),
                ("container_id", CID),
                ("runtime", "crio"),
            ],
        );
    }

    #[test]
    fn kubernetes_systemd_driver_guaranteed_docker() {
        check(
            &format!("/kubepods.slice/kubepods-pod{UID_SYSTEMD}.slice/docker-{CID}.scope"),
            WorkerKind::Kubernetes,
            "pod-7c1f9e0a/4f3a9c1e7b2d",
            &[
                ("pod_uid", UID),
                ("qos", "guaranteed"),
                ("container_id", CID),
                ("runtime", "docker"),
            ],
        );
    }

    #[test]
    fn kubernetes_cgroupfs_driver() {
        check(
            &format!("/kubepods/burstable/pod{UID}/{CID}"),
            WorkerKind::Kubernetes,
            "pod-7c1f9e0a/4f3a9c1e7b2d",
            &[
                ("pod_uid", UID),
                ("qos", "burstable"),
                ("container_id", CID),
            ],
        );
        check(
            &format!("/kubepods/pod{UID}/{CID}"),
            WorkerKind::Kubernetes,
            "pod-7c1f9e0a/4f3a9c1e7b2d",
            &[
                ("pod_uid", UID),
                ("qos", "guaranteed"),
                ("container_id", CID),
            ],
        );
        check(
            &format!("/kubepods/besteffort/pod{UID}"),
            WorkerKind::Kubernetes,
            "pod-7c1f9e0a",
            &[("pod_uid", UID), ("qos", "besteffort")],
        );
    }

    #[test]
    fn kubernetes_static_pod_uid_without_dashes() {
        let uid = "5f4b1c3e9a7d2e6f0b8c4a1d3e5f7a9b";
        check(
            &format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice"),
            WorkerKind::Kubernetes,
            "pod-5f4b1c3e",
            &[("pod_uid", uid), ("qos", "burstable")],
        );
    }

    #[test]
    fn kubernetes_inside_a_kind_node_container() {
        // The deepest layout wins: the pod's container, not the node's Docker container.
        check(
            &format!("/system.slice/docker-{CID}.scope/kubepods/besteffort/pod{UID}/{CID2}"),
            WorkerKind::Kubernetes,
            "pod-7c1f9e0a/9e2b7d4a1f8c",
            &[
                ("pod_uid", UID),
                ("qos", "besteffort"),
                ("container_id", CID2),
            ],
        );
    }

    #[test]
    fn kubernetes_levels_above_pods_are_not_pods() {
        check(
            "/kubepods.slice",
            WorkerKind::SystemdSlice,
            "kubepods",
            &[("unit", "kubepods.slice")],
        );
        check(
            "/kubepods.slice/kubepods-burstable.slice",
            WorkerKind::SystemdSlice,
            "kubepods-burstable",
            &[("unit", "kubepods-burstable.slice")],
        );
        check("/kubepods/burstable", WorkerKind::Cgroup, "burstable", &[]);
        // `pod<uid>` means nothing outside kubepods, and `podcast` is no pod.
        check(
            &format!("/pod{UID}"),
            WorkerKind::Cgroup,
            &format!("pod{UID}"),
            &[],
        );
        check("/kubepods/podcast", WorkerKind::Cgroup, "podcast", &[]);
    }

    #[test]
    fn systemd_service() {
        check(
            "/system.slice/nginx.service",
            WorkerKind::SystemdService,
            "nginx",
            &[("unit", "nginx.service")],
        );
        check(
            "/system.slice/system-getty.slice/getty@tty1.service",
            WorkerKind::SystemdService,
            "getty@tty1",
            &[("unit", "getty@tty1.service")],
        );
    }

    #[test]
    fn systemd_service_sub_cgroup() {
        check(
            "/system.slice/containerd.service/shim",
            WorkerKind::SystemdService,
            "containerd/shim",
            &[("unit", "containerd.service")],
        );
    }

    #[test]
    fn systemd_scope() {
        check(
            "/init.scope",
            WorkerKind::SystemdScope,
            "init",
            &[("unit", "init.scope")],
        );
        check(
            "/user.slice/user-1000.slice/session-3.scope",
            WorkerKind::SystemdScope,
            "session-3",
            &[("unit", "session-3.scope")],
        );
        // systemd running inside a container: its own init.scope is the deepest layout.
        check(
            &format!("/system.slice/docker-{CID}.scope/init.scope"),
            WorkerKind::SystemdScope,
            "init",
            &[("unit", "init.scope")],
        );
    }

    #[test]
    fn systemd_slice() {
        check(
            "/system.slice",
            WorkerKind::SystemdSlice,
            "system",
            &[("unit", "system.slice")],
        );
        check(
            "/user.slice/user-1000.slice/user@1000.service/app.slice",
            WorkerKind::SystemdSlice,
            "app",
            &[("unit", "app.slice")],
        );
        // A plain directory under a slice is not the slice.
        check("/system.slice/mygroup", WorkerKind::Cgroup, "mygroup", &[]);
    }

    #[test]
    fn exec() {
        check(
            "/workerprobe/exec-1234-myjob",
            WorkerKind::Exec,
            "myjob",
            &[("agent_pid", "1234"), ("exec", "myjob")],
        );
        check(
            "/workerprobe/exec-1234-myjob/child",
            WorkerKind::Exec,
            "myjob/child",
            &[("agent_pid", "1234"), ("exec", "myjob")],
        );
        check(
            "/workerprobe/exec-job",
            WorkerKind::Exec,
            "job",
            &[("exec", "job")],
        );
        // Only under workerprobe's own parent, and only with something after `exec-`.
        check("/other/exec-1234", WorkerKind::Cgroup, "exec-1234", &[]);
        check("/workerprobe/exec-", WorkerKind::Cgroup, "exec-", &[]);
        check("/workerprobe", WorkerKind::Cgroup, "workerprobe", &[]);
    }

    #[test]
    fn plain_cgroups() {
        check("/demo-job", WorkerKind::Cgroup, "demo-job", &[]);
        check("/a/b/c", WorkerKind::Cgroup, "c", &[]);
        // Suffixes alone are not unit names.
        check("/.service", WorkerKind::Cgroup, ".service", &[]);
    }

    #[test]
    fn trailing_and_doubled_slashes_change_nothing() {
        assert_eq!(
            identify("/system.slice//nginx.service/"),
            identify("/system.slice/nginx.service")
        );
        assert_eq!(identify("/demo-job/").name, "demo-job");
        assert_eq!(
            identify(&format!("/docker/{CID}/")).kind,
            WorkerKind::Docker
        );
    }

    #[test]
    fn kind_names_match_json() {
        let kinds = [
            WorkerKind::Docker,
            WorkerKind::Podman,
            WorkerKind::Kubernetes,
            WorkerKind::SystemdService,
            WorkerKind::SystemdScope,
            WorkerKind::SystemdSlice,
            WorkerKind::Exec,
            WorkerKind::Cgroup,
            WorkerKind::Root,
        ];
        for kind in kinds {
            let json = serde_json::to_string(&kind).expect("serializes");
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
            let back: WorkerKind = serde_json::from_str(&json).expect("deserializes");
            assert_eq!(back, kind);
        }
        assert_eq!(WorkerKind::SystemdService.as_str(), "systemd_service");
    }

    #[test]
    fn identity_json_is_stable() {
        let identity = identify(&format!("/kubepods/burstable/pod{UID}/{CID}"));
        let json = serde_json::to_string(&identity).expect("serializes");
        assert_eq!(
            json,
            format!(
                r#"{{"name":"pod-7c1f9e0a/4f3a9c1e7b2d","kind":"kubernetes","ids":{{"container_id":"{CID}","pod_uid":"{UID}","qos":"burstable"}}}}"#
            )
        );
    }
}
