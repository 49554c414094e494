//! Which workers to show: the `--workers PATTERN` globs on cgroup paths and on names.
//!
//! This module owns what a worker pattern means. A pattern is a glob (`globset` syntax) on
//! the cgroup path relative to the cgroup2 mount, which starts with `/`:
//!
//! - `*` and `?` match `/` too, so `*docker*` matches `/system.slice/docker-4f3a….scope`.
//! - A pattern that starts with neither `/` nor `*` names a path's tail: it is matched as
//!   `*/<pattern>`, so `nginx.service` matches `/system.slice/nginx.service`.
//! - A pattern matches the path it names, not its descendants: `/system.slice/*` matches them.
//! - `name:GLOB` matches the worker's name (a container's name, a unit's, `top`'s NAME), and
//!   `container:GLOB` a container's name, full id or 12-character id (`podman ps`'s), so
//!   `container:wp-*` picks containers by the names they were given, and `pod:GLOB` a
//!   Kubernetes pod's name or `namespace/name` (where the runtime told them).
//! - A worker is selected when any pattern matches; no pattern at all selects every worker.

use std::collections::BTreeMap;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

/// A pattern on names rather than paths starts with one of these.
const NAME_PREFIX: &str = "name:";
/// A pattern on container names and ids.
const CONTAINER_PREFIX: &str = "container:";
/// A pattern on Kubernetes pod names.
const POD_PREFIX: &str = "pod:";
/// How many hex digits of a container id `podman ps` and `docker ps` show.
const SHORT_CONTAINER_ID_LEN: usize = 12;

/// Which workers a user asked for.
#[derive(Clone, Debug)]
pub struct Selection {
    /// The compiled path patterns.
    globs: GlobSet,
    /// The compiled `name:` patterns.
    names: GlobSet,
    /// The compiled `container:` patterns.
    containers: GlobSet,
    /// The compiled `pod:` patterns.
    pods: GlobSet,
    /// The patterns as the user wrote them, for messages; empty when every worker is selected.
    patterns: Vec<String>,
}

/// A worker pattern that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SelectionError {
    /// The pattern is empty or not a valid glob.
    #[error(
        "`{pattern}` is not a valid worker pattern ({reason}); write a glob on the cgroup path like '/system.slice/*.service' or '*docker*', or on names like 'container:ingest-*'"
    )]
    InvalidPattern {
        /// The pattern as the user wrote it.
        pattern: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl Selection {
    /// Every worker (no pattern given).
    pub fn all() -> Self {
        Selection {
            globs: GlobSet::empty(),
            names: GlobSet::empty(),
            containers: GlobSet::empty(),
            pods: GlobSet::empty(),
            patterns: Vec::new(),
        }
    }

    /// The workers matching any of `patterns`; an empty list selects every worker, as when
    /// the flag is not given.
    pub fn new(patterns: &[String]) -> Result<Self, SelectionError> {
        if patterns.is_empty() {
            return Ok(Self::all());
        }
        let mut builders = [
            GlobSetBuilder::new(),
            GlobSetBuilder::new(),
            GlobSetBuilder::new(),
            GlobSetBuilder::new(),
        ];
        for pattern in patterns {
            let (on, glob) = compile(pattern)?;
            builders[on as usize].add(glob);
        }
        // Each glob compiled alone, so a failure here is the set as a whole (e.g. too large).
        let [globs, names, containers, pods] = builders.map(|builder| {
            builder
                .build()
                .map_err(|error| SelectionError::InvalidPattern {
                    pattern: patterns.join(" "),
                    reason: error.kind().to_string(),
                })
        });
        Ok(Selection {
            globs: globs?,
            names: names?,
            containers: containers?,
            pods: pods?,
            patterns: patterns.to_vec(),
        })
    }

    /// Whether a worker's path is selected (name patterns need [`Selection::matches_worker`]).
    pub fn matches(&self, path: &str) -> bool {
        self.matches_worker(Some(path), None, &BTreeMap::new())
    }

    /// Whether a worker is selected, by its path, its name and its ids (as its identity
    /// gives them, or a recording kept them).
    pub fn matches_worker(
        &self,
        path: Option<&str>,
        name: Option<&str>,
        ids: &BTreeMap<String, String>,
    ) -> bool {
        if self.is_all() {
            return true;
        }
        if path.is_some_and(|path| self.globs.is_match(path))
            || name.is_some_and(|name| self.names.is_match(name))
        {
            return true;
        }
        if let Some(pod) = ids.get("pod_name")
            && !self.pods.is_empty()
        {
            let namespaced = ids
                .get("namespace")
                .map(|namespace| format!("{namespace}/{pod}"));
            if self.pods.is_match(pod) || namespaced.is_some_and(|n| self.pods.is_match(n)) {
                return true;
            }
        }
        if self.containers.is_empty() {
            return false;
        }
        let container_name = ids.get("container_name").map(String::as_str);
        let id = ids.get("container_id").map(String::as_str);
        let short_id = id.and_then(|id| id.get(..SHORT_CONTAINER_ID_LEN));
        [container_name, id, short_id]
            .into_iter()
            .flatten()
            .any(|text| self.containers.is_match(text))
    }

    /// Whether a worker with this identity is selected.
    pub fn matches_identity(&self, path: &str, identity: &super::identity::Identity) -> bool {
        self.matches_worker(Some(path), Some(&identity.name), &identity.ids)
    }

    /// Whether every worker is selected.
    pub fn is_all(&self) -> bool {
        self.patterns.is_empty()
    }

    /// The patterns as the user wrote them; empty when every worker is selected.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }
}

/// For clap's value_parser: validates one pattern, returning it or the sentence above.
pub fn parse_pattern(text: &str) -> Result<String, String> {
    compile(text)
        .map(|_| text.to_owned())
        .map_err(|error| error.to_string())
}

/// What a pattern is matched against.
#[derive(Clone, Copy)]
enum Target {
    Path = 0,
    Name = 1,
    Container = 2,
    Pod = 3,
}

/// Compiles one pattern with the module's rules (see the module doc).
fn compile(pattern: &str) -> Result<(Target, globset::Glob), SelectionError> {
    let invalid = |reason: String| SelectionError::InvalidPattern {
        pattern: pattern.to_owned(),
        reason,
    };
    if pattern.trim().is_empty() {
        return Err(invalid("it is empty".to_owned()));
    }
    for (prefix, target) in [
        (NAME_PREFIX, Target::Name),
        (CONTAINER_PREFIX, Target::Container),
        (POD_PREFIX, Target::Pod),
    ] {
        if let Some(glob) = pattern.strip_prefix(prefix) {
            if glob.trim().is_empty() {
                return Err(invalid(format!("nothing follows `{prefix}`")));
            }
            let glob = GlobBuilder::new(glob)
                .literal_separator(false)
                .build()
                .map_err(|error| invalid(error.kind().to_string()))?;
            return Ok((target, glob));
        }
    }
    let glob = if pattern.starts_with('/') || pattern.starts_with('*') {
        pattern.to_owned()
    } else {
        format!("*/{pattern}")
    };
    GlobBuilder::new(&glob)
        // Cgroup paths nest arbitrarily deep; `*` crossing `/` is what people expect of
        // `*docker*`.
        .literal_separator(false)
        .build()
        .map(|glob| (Target::Path, glob))
        .map_err(|error| invalid(error.kind().to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn select(patterns: &[&str]) -> Selection {
        let patterns: Vec<String> = patterns.iter().map(|p| (*p).to_owned()).collect();
        Selection::new(&patterns).expect("valid patterns")
    }

    const DOCKER: &str = "/system.slice/docker-4f3a9c1e7b2d5a8f0c6e3b9d1a7f4c2e8b5d0a3f6c9e2b7d4a1f8c5e0b3d6a9f.scope";

    #[test]
    fn name_and_container_patterns_match_identities() {
        let podman = crate::model::identity::identify(
            "/libpod_parent/libpod-4f3a9c1e7b2d5a8f0c6e3b9d1a7f4c2e8b5d0a3f6c9e2b7d4a1f8c5e0b3d6a9f",
        )
        .named_by(&crate::model::identity::ContainerInfo {
            runtime: "podman".into(),
            id: "4f3a9c1e7b2d5a8f0c6e3b9d1a7f4c2e8b5d0a3f6c9e2b7d4a1f8c5e0b3d6a9f".into(),
            name: "wp-burn".into(),
            ..Default::default()
        });
        let path = "/libpod_parent/libpod-x";
        for pattern in [
            "container:wp-burn",
            "container:wp-*",
            "container:4f3a9c1e7b2d",
            "name:wp-b*",
        ] {
            assert!(
                select(&[pattern]).matches_identity(path, &podman),
                "{pattern}"
            );
        }
        for pattern in [
            "container:other",
            "name:libpod*",
            "wp-burn",
            "container:4f3a",
        ] {
            assert!(
                !select(&[pattern]).matches_identity(path, &podman),
                "{pattern}"
            );
        }
        let mut pod = podman.clone();
        pod.ids.insert("pod_name".into(), "ingest-7f9c".into());
        pod.ids.insert("namespace".into(), "batch".into());
        for pattern in ["pod:ingest-*", "pod:batch/*", "pod:*/ingest-7f9c"] {
            assert!(select(&[pattern]).matches_identity(path, &pod), "{pattern}");
        }
        assert!(!select(&["pod:ingest-*"]).matches_identity(path, &podman));
        assert!(!select(&["pod:other/*"]).matches_identity(path, &pod));
        // A unit is no container, but has a name.
        let unit = crate::model::identity::identify("/system.slice/nginx.service");
        assert!(
            !select(&["container:nginx"]).matches_identity("/system.slice/nginx.service", &unit)
        );
        assert!(select(&["name:nginx"]).matches_identity("/system.slice/nginx.service", &unit));
        // Without its identity, only paths can match.
        assert!(!select(&["name:nginx"]).matches("/system.slice/nginx.service"));
        assert!(Selection::new(&["container:".into()]).is_err());
        assert!(Selection::new(&["name:[".into()]).is_err());
    }

    #[test]
    fn all_selects_everything() {
        let all = Selection::all();
        assert!(all.is_all());
        assert!(all.patterns().is_empty());
        for path in ["/", "/demo-job", DOCKER, "/a/b/c"] {
            assert!(all.matches(path), "{path}");
        }
    }

    #[test]
    fn no_patterns_is_all() {
        let none = Selection::new(&[]).expect("no pattern is valid");
        assert!(none.is_all());
        assert!(none.matches("/anything"));
    }

    #[test]
    fn exact_path() {
        let selection = select(&["/system.slice/nginx.service"]);
        assert!(!selection.is_all());
        assert!(selection.matches("/system.slice/nginx.service"));
        assert!(!selection.matches("/system.slice/nginx.service/child"));
        assert!(!selection.matches("/system.slice/sshd.service"));
        assert!(!selection.matches("/"));
    }

    #[test]
    fn star_crosses_slashes() {
        let selection = select(&["*docker*"]);
        assert!(selection.matches(DOCKER));
        assert!(selection.matches("/docker/abc"));
        assert!(!selection.matches("/system.slice/nginx.service"));

        let services = select(&["/system.slice/*.service"]);
        assert!(services.matches("/system.slice/nginx.service"));
        assert!(services.matches("/system.slice/system-getty.slice/getty@tty1.service"));
        assert!(!services.matches("/user.slice/user-1000.slice/user@1000.service"));
    }

    #[test]
    fn tail_name_shorthand() {
        let selection = select(&["nginx.service"]);
        assert!(selection.matches("/system.slice/nginx.service"));
        assert!(selection.matches("/nginx.service"));
        // Component-wise: the tail must be the whole last component.
        assert!(!selection.matches("/system.slice/my-nginx.service"));
        assert!(!selection.matches("/system.slice/nginx.service.bak"));

        let globbed = select(&["exec-*"]);
        assert!(globbed.matches("/workerprobe/exec-1234-myjob"));
        assert!(!globbed.matches("/workerprobe/myexec-1"));
    }

    #[test]
    fn any_of_several_patterns() {
        let selection = select(&["/demo-job", "*docker*", "sshd.service"]);
        assert_eq!(selection.patterns().len(), 3);
        assert!(selection.matches("/demo-job"));
        assert!(selection.matches(DOCKER));
        assert!(selection.matches("/system.slice/sshd.service"));
        assert!(!selection.matches("/system.slice/nginx.service"));
        assert!(!selection.matches("/"));
    }

    #[test]
    fn invalid_pattern_gives_the_sentence() {
        let error = Selection::new(&["/ok".to_owned(), "[abc".to_owned()])
            .expect_err("unclosed class is invalid");
        let message = error.to_string();
        assert!(
            message.starts_with("`[abc` is not a valid worker pattern ("),
            "{message}"
        );
        assert!(
            message.ends_with(
                "); write a glob on the cgroup path like '/system.slice/*.service' or '*docker*', or on names like 'container:ingest-*'"
            ),
            "{message}"
        );
        assert_eq!(parse_pattern("[abc"), Err(message));
    }

    #[test]
    fn empty_pattern_is_an_error() {
        let message = parse_pattern("").expect_err("empty is invalid");
        assert_eq!(
            message,
            "`` is not a valid worker pattern (it is empty); write a glob on the cgroup path like '/system.slice/*.service' or '*docker*', or on names like 'container:ingest-*'"
        );
        assert!(Selection::new(&[String::new()]).is_err());
    }

    #[test]
    fn parse_pattern_returns_the_text_unchanged() {
        assert_eq!(
            parse_pattern("nginx.service"),
            Ok("nginx.service".to_owned())
        );
        assert_eq!(parse_pattern("*docker*"), Ok("*docker*".to_owned()));
    }
}
