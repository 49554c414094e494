//! Containers' names from their runtimes' own state, as cAdvisor and coroot do: a cgroup path
//! gives a container id, the runtime gives the name the user chose and the image.
//!
//! Each runtime is probed once at start; one that is absent costs nothing. A runtime that is
//! there but cannot be read is mentioned once, and its containers keep the names their paths
//! give. Lookups are answered from memory: a runtime's state is read when it changes, not per
//! lookup, so a container that lived a fraction of a second is named too.

mod cri;
mod docker;
mod podman;

use std::sync::Arc;

use crate::model::identity::{ContainerInfo, Identity, PodNames, WorkerKind, identify};

/// The container runtimes found on this node.
pub struct Runtimes {
    podman: Option<podman::Podman>,
    docker: Option<docker::Docker>,
    /// containerd or CRI-O, whichever answers first.
    cri: Option<cri::Cri>,
}

impl Runtimes {
    /// Looks for each runtime's state where it keeps it.
    pub fn probe() -> Self {
        Self {
            podman: podman::Podman::start(
                podman::DEFAULT_GRAPH_ROOT.as_ref(),
                podman::DEFAULT_EVENTS_LOG.as_ref(),
            ),
            docker: docker::Docker::start(docker::DEFAULT_SOCKET.as_ref()),
            cri: cri::SOCKETS
                .iter()
                .find_map(|(runtime, socket)| cri::Cri::start(runtime, socket.as_ref())),
        }
    }

    /// No runtime at all (tests, and callers that only want paths).
    pub fn none() -> Self {
        Self {
            podman: None,
            docker: None,
            cri: None,
        }
    }

    /// What the container's runtime says of it, if that runtime is here and knows it.
    fn describe(&self, identity: &Identity) -> Option<ContainerInfo> {
        let id = identity.container_id()?;
        let runtime = identity.ids.get("runtime").map(String::as_str);
        match (identity.kind, runtime) {
            (WorkerKind::Podman, _) => self.podman.as_ref()?.describe(id),
            (WorkerKind::Docker, _) | (WorkerKind::Kubernetes, Some("docker")) => {
                self.docker.as_ref()?.describe(id)
            }
            // containerd, CRI-O, or a cgroupfs path that does not say which.
            (WorkerKind::Kubernetes, _) => self.cri.as_ref()?.describe(id),
            _ => None,
        }
    }

    /// The Kubernetes pod a pod's own cgroup (no container id) is, if a CRI runtime lists it.
    fn pod(&self, identity: &Identity) -> Option<PodNames> {
        if identity.kind != WorkerKind::Kubernetes || identity.container_id().is_some() {
            return None;
        }
        self.cri.as_ref()?.pod(identity.ids.get("pod_uid")?)
    }
}

/// Most names kept for cgroups a caller never forgets.
const MAX_NAMED: usize = 32_768;

/// Each worker's identity: what its path says and what its runtime adds, computed once per
/// cgroup and shared.
pub struct WorkerNames {
    runtimes: Runtimes,
    named: crate::IdMap<Arc<Identity>>,
}

impl WorkerNames {
    /// Names workers with what `runtimes` can tell.
    pub fn new(runtimes: Runtimes) -> Self {
        Self {
            runtimes,
            named: crate::IdMap::default(),
        }
    }

    /// The identity of the cgroup `cgroup_id` at `path`. A container its runtime did not know
    /// yet is asked about again at the next call (a lookup in memory).
    pub fn identity(&mut self, cgroup_id: u64, path: &str) -> Arc<Identity> {
        if let Some(identity) = self.named.get(&cgroup_id)
            && !identity.wants_runtime_names()
        {
            return Arc::clone(identity);
        }
        let identity = self
            .named
            .get(&cgroup_id)
            .map_or_else(|| identify(path), |identity| Identity::clone(identity));
        let identity = Arc::new(match self.runtimes.describe(&identity) {
            Some(info) => identity.named_by(&info),
            None => match self.runtimes.pod(&identity) {
                Some(pod) => identity.named_by_pod(&pod),
                None => identity,
            },
        });
        if self.named.len() >= MAX_NAMED {
            self.named.clear();
        }
        self.named.insert(cgroup_id, Arc::clone(&identity));
        identity
    }

    /// Forgets a removed cgroup.
    pub fn forget(&mut self, cgroup_id: u64) {
        self.named.remove(&cgroup_id);
    }
}
