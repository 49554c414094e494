//! podman's containers, from its storage's own record of them:
//! `<graph root>/<driver>-containers/containers.json` (containers/storage), which holds each
//! container's id, names and image. podman rewrites the file (by rename) as containers come
//! and go; a thread watches the directory with inotify and reads it after each change, so a
//! container that lived 0.2 s is known before the agent's next tick asks for it.
//!
//! On a busy node that thread may read the list only after a short container has come and
//! gone (`podman run --rm`), so a container the list never showed is looked for in podman's
//! event log as well, where it stays: root's podman without journald appends each container's
//! creation, with its id, name and image, to `/run/libpod/events/events.log`.

use std::{
    collections::{HashMap, VecDeque},
    fs,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use inotify::{Inotify, WatchMask};
use serde::Deserialize;

use crate::model::identity::ContainerInfo;

/// Where root's podman keeps its storage (`graphroot` in storage.conf).
pub const DEFAULT_GRAPH_ROOT: &str = "/var/lib/containers/storage";

/// The file in the containers directory that lists them.
const CONTAINERS_FILE: &str = "containers.json";

/// How many removed containers stay known, so a worker that exited is still named in its
/// exit summary and in the window that saw it.
const MAX_REMOVED: usize = 4096;

/// Where root's podman appends its events when it logs them to a file (no journald).
pub const DEFAULT_EVENTS_LOG: &str = "/run/libpod/events/events.log";

/// podman's containers, as its storage last listed them (and those it listed recently).
pub struct Podman {
    known: Arc<Mutex<Known>>,
    /// The list, once found: read here too when asked for a container not yet known.
    file: Arc<Mutex<Option<PathBuf>>>,
    /// podman's event log, read from where the last read ended when a container is not known.
    events: Mutex<EventLog>,
}

/// podman's event log and how far it has been read.
struct EventLog {
    path: PathBuf,
    /// Bytes read so far (up to the last whole line).
    offset: u64,
}

/// One line of podman's event log (only what names a container).
#[derive(Deserialize)]
struct Event {
    #[serde(rename = "Type", default)]
    kind: String,
    #[serde(rename = "ID", default)]
    id: String,
    #[serde(rename = "Name", default)]
    name: String,
    #[serde(rename = "Image", default)]
    image: String,
}

#[derive(Default)]
struct Known {
    /// Every container known, and whether the file lists it now.
    by_id: HashMap<String, (ContainerInfo, bool)>,
    /// Ids no longer listed, oldest first: they are forgotten beyond [`MAX_REMOVED`].
    removed: VecDeque<String>,
    /// Ids asked for that the list did not hold when read again for them: not read again.
    missed: std::collections::HashSet<String>,
}

/// One container as containers/storage records it.
#[derive(Deserialize)]
struct StoredContainer {
    id: String,
    #[serde(default)]
    names: Vec<String>,
    #[serde(default)]
    image: String,
    /// podman's own JSON, inside a string: `{"image-name": …, "name": …}`.
    #[serde(default)]
    metadata: String,
}

#[derive(Default, Deserialize)]
struct PodmanMetadata {
    #[serde(rename = "image-name")]
    image_name: Option<String>,
    name: Option<String>,
}

impl Podman {
    /// Starts watching the storage under `graph_root`; `None` when podman is not here. A
    /// podman that has not made a container yet has no list: its storage is looked for
    /// every few seconds until it appears.
    pub fn start(graph_root: &Path, events_log: &Path) -> Option<Self> {
        // Containers made before the agent are in the list: the log is read from its end.
        let events = Mutex::new(EventLog {
            path: events_log.to_path_buf(),
            offset: fs::metadata(events_log).map_or(0, |meta| meta.len()),
        });
        let known = Arc::new(Mutex::new(Known::default()));
        let found = Arc::new(Mutex::new(None));
        match containers_dir(graph_root) {
            Some(dir) => {
                let file = dir.join(CONTAINERS_FILE);
                if let Ok(mut found) = found.lock() {
                    *found = Some(file.clone());
                }
                // The watch is made here, before `--user` drops the agent's rights: podman's
                // storage is root's alone, and a watch keeps working once made.
                let inotify = watch_dir(&dir);
                // Only a list the agent may not read is worth a word; any other failure (a
                // list being rewritten, a stale handle on a shared file system) is read
                // again by the thread.
                if let Err(ReadError::Denied(reason)) = refresh(&known, &file) {
                    crate::say!(
                        "workerprobe: podman containers are named by id only: {} cannot be read ({reason})",
                        file.display()
                    );
                    return None;
                }
                let watched = Arc::clone(&known);
                spawn_named(move || follow(inotify, &dir, &watched));
            }
            None if graph_root.exists() || Path::new(PODMAN).exists() => {
                let root = graph_root.to_path_buf();
                let watched = Arc::clone(&known);
                let found_later = Arc::clone(&found);
                spawn_named(move || {
                    loop {
                        std::thread::sleep(STORAGE_POLL);
                        if let Some(dir) = containers_dir(&root) {
                            if let Ok(mut found) = found_later.lock() {
                                *found = Some(dir.join(CONTAINERS_FILE));
                            }
                            let inotify = watch_dir(&dir);
                            let _ = refresh(&watched, &dir.join(CONTAINERS_FILE));
                            return follow(inotify, &dir, &watched);
                        }
                    }
                });
            }
            None => return None,
        }
        Some(Self {
            known,
            file: found,
            events,
        })
    }

    /// The container with this full id, if podman listed it. One the watching thread has not
    /// yet read of (it may lag on a busy machine, and a short container can be gone before
    /// it catches up) is looked for in the list at once, once.
    pub fn describe(&self, id: &str) -> Option<ContainerInfo> {
        let lookup = || {
            let known = self.known.lock().ok()?;
            known.by_id.get(id).map(|(info, _)| info.clone())
        };
        if let Some(info) = lookup() {
            return Some(info);
        }
        // What podman logged since the last look: a container the list never showed.
        if let Ok(mut events) = self.events.lock() {
            events.read_new(&self.known);
        }
        if let Some(info) = lookup() {
            return Some(info);
        }
        // Only once the list is found: until then the watching thread looks for it.
        let file = self.file.lock().ok()?.clone()?;
        {
            let mut known = self.known.lock().ok()?;
            if known.missed.len() >= MAX_REMOVED {
                known.missed.clear();
            }
            if !known.missed.insert(id.to_string()) {
                return None;
            }
        }
        let _ = refresh(&self.known, &file);
        lookup()
    }
}

impl EventLog {
    /// Reads the lines podman appended since the last read; each container they name that is
    /// not known yet becomes known as one no longer listed (it is forgotten like those).
    fn read_new(&mut self, known: &Mutex<Known>) {
        use std::io::{Read as _, Seek as _};
        let Ok(mut file) = fs::File::open(&self.path) else {
            return;
        };
        let length = file.metadata().map_or(0, |meta| meta.len());
        if length < self.offset {
            // Rotated (podman truncates a log past its size limit): from its start.
            self.offset = 0;
        }
        let mut text = Vec::new();
        if file.seek(std::io::SeekFrom::Start(self.offset)).is_err()
            || file.read_to_end(&mut text).is_err()
        {
            return;
        }
        // A line still being written is read again next time.
        let Some(end) = text.iter().rposition(|&byte| byte == b'\n') else {
            return;
        };
        self.offset += end as u64 + 1;
        let Ok(mut known) = known.lock() else {
            return;
        };
        for info in parse_events(&text[..end]) {
            if !known.by_id.contains_key(&info.id) {
                known.removed.push_back(info.id.clone());
                known.by_id.insert(info.id.clone(), (info, false));
            }
        }
        forget_oldest(&mut known);
    }
}

/// The containers named in lines of podman's event log (other lines are passed over).
fn parse_events(text: &[u8]) -> Vec<ContainerInfo> {
    text.split(|&byte| byte == b'\n')
        .filter_map(|line| serde_json::from_slice::<Event>(line).ok())
        .filter(|event| event.kind == "container" && !event.id.is_empty())
        .map(|event| ContainerInfo {
            runtime: "podman".into(),
            id: event.id,
            name: event.name,
            image: (!event.image.is_empty()).then_some(event.image),
            image_id: None,
            pod: None,
        })
        .collect()
}

/// Where Debian's podman is: installed but unused, its storage is still to come.
const PODMAN: &str = "/usr/bin/podman";

/// How often a podman that has made no container yet is looked at again.
const STORAGE_POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs `work` on the thread that follows podman's storage.
fn spawn_named(work: impl FnOnce() + Send + 'static) {
    if std::thread::Builder::new()
        .name("podman-names".into())
        .spawn(work)
        .is_err()
    {
        crate::say!(
            "workerprobe: podman containers made from now on are named by id only: no thread could follow its storage"
        );
    }
}

/// An inotify watch on the containers directory, for the changes that rewrite the list.
fn watch_dir(dir: &Path) -> std::io::Result<Inotify> {
    let inotify = Inotify::init()?;
    inotify.watches().add(
        dir,
        WatchMask::MOVED_TO | WatchMask::CLOSE_WRITE | WatchMask::CREATE,
    )?;
    Ok(inotify)
}

/// Reads the list again after each change podman makes to it; returns if the watch fails
/// or the list can no longer be read (what was read stays known).
fn follow(inotify: std::io::Result<Inotify>, dir: &Path, known: &Mutex<Known>) {
    let file = dir.join(CONTAINERS_FILE);
    let mut inotify = match inotify {
        Ok(inotify) => inotify,
        Err(reason) => {
            crate::say!(
                "workerprobe: podman containers made from now on are named by id only: {} cannot be watched ({reason})",
                dir.display()
            );
            return;
        }
    };
    let mut buffer = [0u8; 4096];
    while let Ok(events) = inotify.read_events_blocking(&mut buffer) {
        let touched = events
            .filter(|event| event.name.is_some_and(|name| name == CONTAINERS_FILE))
            .count();
        if touched == 0 {
            continue;
        }
        if let Err(ReadError::Denied(reason)) = refresh(known, &file) {
            // An agent run with `--user` may no longer read root's storage.
            crate::say!(
                "workerprobe: podman containers made from now on are named by id only: {} cannot be read ({reason}); run the agent as root to name them",
                file.display()
            );
            return;
        }
    }
}

/// The first `<driver>-containers` directory holding a containers.json.
fn containers_dir(graph_root: &Path) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(graph_root)
        .ok()?
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.ends_with("-containers"))
                && path.join(CONTAINERS_FILE).is_file()
        })
        .collect();
    dirs.sort();
    dirs.into_iter().next()
}

/// Why the list was not read.
enum ReadError {
    /// The agent may not read it: said once, as podman's names are then out of reach.
    Denied(String),
    /// Anything else, passing: read again later.
    Other,
}

/// Reads the file again; containers no longer listed stay known, up to [`MAX_REMOVED`].
fn refresh(known: &Mutex<Known>, file: &Path) -> Result<(), ReadError> {
    let read = || fs::read_to_string(file);
    // A stale handle (a file replaced under a network or shared file system) opens afresh.
    let text = match read() {
        Err(error) if error.raw_os_error() == Some(libc::ESTALE) => read(),
        other => other,
    }
    .map_err(|error| match error.kind() {
        std::io::ErrorKind::PermissionDenied => ReadError::Denied(error.to_string()),
        _ => ReadError::Other,
    })?;
    let listed = parse_containers(&text).map_err(|_| ReadError::Other)?;
    let mut guard = known.lock().map_err(|_| ReadError::Other)?;
    let known = &mut *guard;
    let listed_ids: std::collections::HashSet<&str> =
        listed.iter().map(|info| info.id.as_str()).collect();
    for (id, (_, is_listed)) in known.by_id.iter_mut() {
        if *is_listed && !listed_ids.contains(id.as_str()) {
            *is_listed = false;
            known.removed.push_back(id.clone());
        }
    }
    for info in listed {
        known.by_id.insert(info.id.clone(), (info, true));
    }
    forget_oldest(known);
    Ok(())
}

/// Forgets the oldest containers no longer listed beyond [`MAX_REMOVED`].
fn forget_oldest(known: &mut Known) {
    // Ids listed again linger in `removed` and are skipped here.
    let mut unlisted = known.by_id.values().filter(|(_, listed)| !listed).count();
    while unlisted > MAX_REMOVED
        && let Some(oldest) = known.removed.pop_front()
    {
        if known.by_id.get(&oldest).is_some_and(|(_, listed)| !listed) {
            known.by_id.remove(&oldest);
            unlisted -= 1;
        }
    }
    if known.removed.len() > 2 * MAX_REMOVED {
        let by_id = &known.by_id;
        known
            .removed
            .retain(|id| by_id.get(id).is_some_and(|(_, listed)| !listed));
    }
}

/// The containers a containers.json lists.
fn parse_containers(text: &str) -> Result<Vec<ContainerInfo>, String> {
    let stored: Vec<StoredContainer> =
        serde_json::from_str(text).map_err(|error| format!("not the JSON expected: {error}"))?;
    Ok(stored
        .into_iter()
        .map(|container| {
            let metadata: PodmanMetadata =
                serde_json::from_str(&container.metadata).unwrap_or_default();
            let name = metadata
                .name
                .or_else(|| container.names.into_iter().next())
                .unwrap_or_default();
            ContainerInfo {
                runtime: "podman".into(),
                id: container.id,
                name,
                image: metadata.image_name,
                image_id: (!container.image.is_empty()).then_some(container.image),
                pod: None,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What podman 4.3.1 wrote here for `podman run --name wp-probe2 localhost/wp-busybox:test`.
    const RECORDED: &str = r#"[{"id":"ef0fe9038eb3bd233d17d4331b0cdc1cdb0e764e6bba82927173e68f1f756a02","names":["wp-probe2"],"image":"3c3fde9c1e523a8fcb380b75456772246eb6cbe611af443befdfb713e66574c4","layer":"eb8f0b47747112120babbd9d97fd28798762a6b536dbed9e8e3b2e83f0975019","metadata":"{\"image-name\":\"localhost/wp-busybox:test\",\"image-id\":\"3c3fde9c1e523a8fcb380b75456772246eb6cbe611af443befdfb713e66574c4\",\"name\":\"wp-probe2\",\"created-at\":1796158907}","created":"2026-12-01T21:01:47.138111361Z","flags":{"MountLabel":"","ProcessLabel":""}}]"#;

    #[test]
    fn reads_podmans_record_of_a_container() {
        let listed = parse_containers(RECORDED).expect("parses");
        assert_eq!(
            listed,
            vec![ContainerInfo {
                runtime: "podman".into(),
                id: "ef0fe9038eb3bd233d17d4331b0cdc1cdb0e764e6bba82927173e68f1f756a02".into(),
                name: "wp-probe2".into(),
                image: Some("localhost/wp-busybox:test".into()),
                image_id: Some(
                    "3c3fde9c1e523a8fcb380b75456772246eb6cbe611af443befdfb713e66574c4".into()
                ),
                pod: None,
            }]
        );
        assert_eq!(parse_containers("[]").expect("parses"), vec![]);
        assert!(parse_containers("{").is_err());
    }

    #[test]
    fn a_podman_that_makes_its_first_container_later_is_followed() {
        let root = std::env::temp_dir().join(format!("wp-podman-late-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root).expect("makes the graph root");
        let podman =
            Podman::start(&root, &root.join("events.log")).expect("a graph root is podman's");
        let dir = root.join("overlay-containers");
        fs::create_dir_all(&dir).expect("makes the containers directory");
        // As podman writes it: a temporary file renamed over the list.
        fs::write(dir.join("tmp"), RECORDED).expect("writes");
        fs::rename(dir.join("tmp"), dir.join(CONTAINERS_FILE)).expect("renames");
        let id = "ef0fe9038eb3bd233d17d4331b0cdc1cdb0e764e6bba82927173e68f1f756a02";
        let deadline = std::time::Instant::now() + 4 * STORAGE_POLL;
        while podman.describe(id).is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "the list was never read"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        // And a later rewrite is seen through the watch.
        let renamed = RECORDED.replace("wp-probe2", "wp-renamed");
        let deadline = std::time::Instant::now() + 4 * STORAGE_POLL;
        while podman
            .describe(id)
            .is_some_and(|info| info.name != "wp-renamed")
        {
            fs::write(dir.join("tmp"), &renamed).expect("writes");
            fs::rename(dir.join("tmp"), dir.join(CONTAINERS_FILE)).expect("renames");
            assert!(
                std::time::Instant::now() < deadline,
                "the rewrite was never read"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(
            Podman::start(&root.join("absent"), &root.join("events.log")).is_some()
                == Path::new(PODMAN).exists()
        );
        let _ = fs::remove_dir_all(&root);
    }

    /// Lines podman 4.3.1 appended to its event log for `podman run --rm --name wp-test-short`
    /// (and an image's line between them).
    const LOGGED: &str = r#"{"ID":"cba0bb08add4549a3f7ad7aa6df1be0692cc77fcaef07c9b2e1f7e241ef5be83","Image":"localhost/workerprobe-test-busybox:1","Name":"wp-test-short","Status":"create","Time":"2026-12-06T09:11:47.314526521Z","Type":"container","Attributes":{}}
{"Name":"localhost/workerprobe-test-busybox:1","Status":"pull","Time":"2026-12-06T11:14:52.229970072Z","Type":"image","Attributes":null}
{"ID":"cba0bb08add4549a3f7ad7aa6df1be0692cc77fcaef07c9b2e1f7e241ef5be83","Image":"localhost/workerprobe-test-busybox:1","Name":"wp-test-short","Status":"init","Time":"2026-12-06T09:11:47.475203712Z","Type":"container","Attributes":{}}
"#;

    #[test]
    fn a_container_the_list_never_showed_is_named_from_the_event_log() {
        let root = std::env::temp_dir().join(format!("wp-podman-events-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let dir = root.join("overlay-containers");
        fs::create_dir_all(&dir).expect("makes the containers directory");
        fs::write(dir.join(CONTAINERS_FILE), "[]").expect("writes");
        let log = root.join("events.log");
        // What was logged before the agent started is not read again.
        fs::write(&log, LOGGED.replace("wp-test-short", "wp-before")).expect("writes");
        let podman = Podman::start(&root, &log).expect("a graph root is podman's");
        let id = "cba0bb08add4549a3f7ad7aa6df1be0692cc77fcaef07c9b2e1f7e241ef5be83";
        // Appended while the list never lists it; the last line is still being written.
        let (whole, partial) = LOGGED.split_at(LOGGED.len() - 40);
        let mut appended = fs::read_to_string(&log).expect("reads");
        appended.push_str(whole);
        fs::write(&log, &appended).expect("appends");
        let info = podman.describe(id).expect("named from the log");
        assert_eq!(info.name, "wp-test-short");
        assert_eq!(
            info.image.as_deref(),
            Some("localhost/workerprobe-test-busybox:1")
        );
        let whole_lines = appended.rfind('\n').expect("a line") + 1;
        assert_eq!(
            podman.events.lock().expect("lock").offset as usize,
            whole_lines
        );
        appended.push_str(partial);
        fs::write(&log, &appended).expect("appends");
        assert!(podman.describe("0123").is_none(), "an id nobody logged");
        assert_eq!(
            podman.events.lock().expect("lock").offset as usize,
            appended.len()
        );
        // A rotated log is read from its start.
        fs::write(&log, LOGGED.replace(id, "abcd")).expect("rotates");
        assert_eq!(
            podman.describe("abcd").expect("named").name,
            "wp-test-short"
        );
        let _ = fs::remove_dir_all(&root);
    }

    #[test]
    fn a_removed_container_stays_known_for_a_while() {
        let dir = std::env::temp_dir().join(format!("wp-podman-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("makes a directory");
        let file = dir.join(CONTAINERS_FILE);
        let known = Mutex::new(Known::default());
        fs::write(&file, RECORDED).expect("writes");
        assert!(refresh(&known, &file).is_ok(), "reads");
        fs::write(&file, "[]").expect("writes");
        assert!(refresh(&known, &file).is_ok(), "reads");
        let known = known.lock().expect("not poisoned");
        assert_eq!(known.by_id.len(), 1);
        assert_eq!(known.removed.len(), 1);
        fs::remove_dir_all(&dir).expect("cleans up");
    }
}
