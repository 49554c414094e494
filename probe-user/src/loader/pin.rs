//! `--pin DIR`: maps and links that outlive the agent, so a restarted agent continues the same
//! counters, and `workerprobe unpin DIR` to remove them.
//!
//! A pin set is a directory on a bpffs mount holding:
//! - `meta`: what the set is (format version, programs and their tracepoints, max_workers, the
//!   kernel struct offsets given to the programs). bpffs holds no regular files and no names
//!   with a dot, so `meta` is a symbolic link whose target is the JSON text
//!   (`readlink DIR/meta`); it is written first, so an interrupted first start still leaves a
//!   set that `unpin` recognises and removes.
//! - one pinned map per map the user side reads ([`PINNED_MAPS`]: the slot maps, `CPU_STATS`,
//!   `NET_STATS`, `DROPS`, `LAST_SWITCH`, `CGROUP_EVENTS`, …); the others (task storage,
//!   globals) stay alive through the programs that use them.
//! - one pinned link per program (`link_<program>`): it keeps the program attached after the
//!   agent exits, until the pin is removed.
//!
//! A restart with the same DIR loads and attaches nothing: it opens the pinned maps, whose
//! counters only grow, so the new agent continues them. Lifecycle events that arrive while no
//! agent runs wait in the pinned ring buffer (up to its size). One agent at a time may use a
//! pin set: it holds an exclusive `flock` on DIR while it runs.

use std::{
    collections::HashMap,
    fs::File,
    os::fd::AsRawFd as _,
    path::{Component, Path, PathBuf},
};

use anyhow::Context as _;
use aya::maps::{Map, MapData};
use probe_common::{
    cpu::{CPU_SLOTS_MAP, CPU_STATS_MAP, FREE_SLOTS_MAP, LAST_SWITCH_MAP, SLOT_OF_MAP},
    drops::DROPS_MAP,
    lifecycle::EVENTS_MAP,
    memory::PROCESS_PEAKS_MAP,
    net::{
        ENDPOINT_COUNTS_MAP, ENDPOINT_SLOT_OF_MAP, ENDPOINT_SLOTS_MAP, ENDPOINTS_MAP,
        FREE_ENDPOINT_SLOTS_MAP, NET_STATS_MAP,
    },
};
use serde::{Deserialize, Serialize};

use super::{
    LoadOptions, Loaded, Probe, ProgramGroup,
    plan::{ExtraPlan, GroupPlan, Plan},
};
use crate::error::UserError;

/// The entry describing the set (a symlink whose target is the JSON).
pub const META: &str = "meta";
/// Version of the pin set's layout; a set of another version is refused. 3: lifecycle events
/// carry the memory cgroup's peak, and process peaks have a map. 4: most workers' counters are
/// in the slot maps (a format-3 agent would miss them). 5: most endpoints are in the endpoint
/// slot maps.
pub const FORMAT_VERSION: u32 = 5;
/// Older formats this agent still reads: a format-3 set has no slot maps, a format-4 set no
/// endpoint slot maps, and their counters are in the hashes.
const READABLE_FORMATS: [u32; 3] = [3, 4, FORMAT_VERSION];
/// The maps the collector reads, pinned under their own names.
pub const PINNED_MAPS: [&str; 14] = [
    CPU_STATS_MAP,
    CPU_SLOTS_MAP,
    SLOT_OF_MAP,
    FREE_SLOTS_MAP,
    NET_STATS_MAP,
    DROPS_MAP,
    LAST_SWITCH_MAP,
    EVENTS_MAP,
    ENDPOINTS_MAP,
    ENDPOINT_COUNTS_MAP,
    ENDPOINT_SLOTS_MAP,
    ENDPOINT_SLOT_OF_MAP,
    FREE_ENDPOINT_SLOTS_MAP,
    PROCESS_PEAKS_MAP,
];

/// The pin of the link of `program`.
fn link_name(program: &str) -> String {
    format!("link_{program}")
}

/// What `meta` records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// [`FORMAT_VERSION`] of the writer.
    pub format_version: u32,
    /// The agent version that made the set.
    pub agent_version: String,
    /// `--programs` as given (cpu, delays, net, workers).
    pub groups: Vec<String>,
    /// Programs and where they are attached, with their link pins.
    pub programs: Vec<PinnedProgram>,
    /// How each group is measured (the variant, or why not), as planned on this kernel.
    #[serde(default)]
    pub plan: Vec<PinnedGroup>,
    /// Map pins.
    pub maps: Vec<String>,
    /// `--max-workers`.
    pub max_workers: u32,
    /// Kernel struct offsets handed to the programs (name → byte offset).
    pub offsets: std::collections::BTreeMap<String, u32>,
}

/// One attached program of a pin set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedProgram {
    /// ELF name.
    pub program: String,
    /// The tracepoint (tp_btf) or kernel function (fexit) it is attached to.
    pub tracepoint: String,
    /// `tp_btf` or `fexit`.
    #[serde(default = "tp_btf")]
    pub attach: String,
    /// Its link's pin in the set.
    pub link: String,
}

fn tp_btf() -> String {
    "tp_btf".into()
}

/// How one group of a pin set is measured.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedGroup {
    /// `--programs` name.
    pub group: String,
    /// The variant's name; `None` when the group is not measured.
    pub variant: Option<String>,
    /// Why not, when it is not.
    #[serde(default)]
    pub missing: Vec<String>,
    /// What the variant's extras that ran count (`plan::Extra::counts`).
    #[serde(default)]
    pub extras: Vec<String>,
}

fn group_names(groups: &[ProgramGroup]) -> Vec<String> {
    let mut names: Vec<String> = groups.iter().map(|&g| g.name().to_string()).collect();
    names.sort_unstable();
    names.dedup();
    names
}

impl Meta {
    fn new(options: &LoadOptions, loaded: &Loaded) -> Self {
        let plan = loaded
            .plan
            .groups
            .iter()
            .map(|(group, plan)| PinnedGroup {
                group: group.name().to_string(),
                variant: match plan {
                    GroupPlan::Runs(variant) => Some(variant.name.to_string()),
                    GroupPlan::Within(inside) => Some(format!("within {}", inside.name())),
                    GroupPlan::Missing(_) => None,
                },
                missing: match plan {
                    GroupPlan::Missing(reasons) => reasons.clone(),
                    _ => Vec::new(),
                },
                extras: loaded
                    .plan
                    .extras
                    .iter()
                    .filter(|(g, _, extra)| g == group && *extra == ExtraPlan::Runs)
                    .map(|(_, extra, _)| extra.counts.to_string())
                    .collect(),
            })
            .collect();
        let task = &loaded.task;
        let sched = task.sched_info.unwrap_or_default();
        let offsets = [
            ("sock.skc_family", loaded.family_offset),
            ("socket.sk", loaded.socket_sk_offset),
            ("task_struct.se.sum_exec_runtime", task.sum_exec_runtime),
            ("task_struct.pid", task.pid),
            ("task_struct.cgroups", task.cgroups),
            ("task_struct.sched_info.pcount", sched.pcount),
            ("task_struct.sched_info.run_delay", sched.run_delay),
            ("task_struct.sched_info.last_arrival", sched.last_arrival),
            ("task_struct.sched_info.last_queued", sched.last_queued),
            ("css_set.dfl_cgrp", task.css_set_dfl_cgrp),
            ("cgroup.kn", task.cgroup_kn),
            ("kernfs_node.id", task.kernfs_node_id),
            ("cgroup.root", task.cgroup_root),
            ("cgroup_root.hierarchy_id", task.cgroup_root_hierarchy_id),
            ("task_struct.utime", task.utime),
            ("task_struct.stime", task.stime),
            ("task_struct.tgid", task.tgid),
            ("task_struct.flags", loaded.wait.task_flags),
            ("task_struct.files", loaded.wait.task_files),
            ("files_struct.fdt", loaded.wait.files_fdt),
            ("fdtable.max_fds", loaded.wait.fdtable_max_fds),
            ("fdtable.fd", loaded.wait.fdtable_fd),
            ("file.f_inode", loaded.wait.file_f_inode),
            ("inode.i_mode", loaded.wait.inode_i_mode),
            ("pt_regs.orig_ax", loaded.wait.pt_regs_orig_ax),
            ("pt_regs.di", loaded.wait.pt_regs_di),
            ("task_struct.signal", loaded.memory.task_signal),
            ("signal_struct.maxrss", loaded.memory.signal_maxrss),
            ("cgroup.subsys[memory]", loaded.memory.cgroup_memory_css),
            ("mem_cgroup.memory.watermark", loaded.memory.memcg_watermark),
            ("task_struct.start_time", loaded.process.task_start_time),
            ("task_struct.exit_code", loaded.process.task_exit_code),
            ("task_struct.nvcsw", loaded.process.task_nvcsw),
            ("task_struct.nivcsw", loaded.process.task_nivcsw),
            ("task_struct.comm", loaded.process.task_comm),
            ("task_struct.mm", loaded.process.task_mm),
            ("mm_struct.arg_start", loaded.process.mm_arg_start),
            ("mm_struct.arg_end", loaded.process.mm_arg_end),
            ("signal_struct.live", loaded.process.signal_live),
            ("signal_struct.nr_threads", loaded.process.signal_nr_threads),
        ]
        .into_iter()
        .map(|(name, offset)| (name.to_string(), offset))
        .collect();
        Self {
            format_version: FORMAT_VERSION,
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            groups: group_names(&options.groups),
            programs: loaded
                .plan
                .programs()
                .into_iter()
                .map(|planned| PinnedProgram {
                    program: planned.program.into(),
                    tracepoint: planned.attach.target().into(),
                    attach: planned.attach.kind().into(),
                    link: link_name(planned.program),
                })
                .collect(),
            plan,
            maps: PINNED_MAPS.iter().map(|name| name.to_string()).collect(),
            max_workers: options.max_workers,
            offsets,
        }
    }

    /// Every entry of the set, links first (removing them detaches the programs).
    fn entries(&self) -> Vec<String> {
        let links = self.programs.iter().map(|p| p.link.clone());
        links.chain(self.maps.iter().cloned()).collect()
    }
}

/// The mount points of bpffs in a `/proc/self/mountinfo` text.
pub fn bpffs_mounts(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            let mount_point = left.split_whitespace().nth(4)?;
            (fstype == "bpf").then(|| PathBuf::from(unescape_mountinfo(mount_point)))
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape_mountinfo(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
            && let Ok(code) = u8::from_str_radix(&text[i + 1..i + 4], 8)
        {
            out.push(code);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Checks a `--pin` / `unpin` directory against the bpffs mounts; the reason, as one
/// sentence, if it cannot hold a pin set.
pub fn check_pin_dir(dir: &Path, mounts: &[PathBuf]) -> Result<(), String> {
    let shown = dir.display();
    if !dir.is_absolute() {
        return Err(format!(
            "`{shown}` is not an absolute path: give a directory under a bpffs mount, like /sys/fs/bpf/workerprobe"
        ));
    }
    if dir
        .components()
        .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return Err(format!(
            "`{shown}` contains `.` or `..`: give a plain directory under a bpffs mount, like /sys/fs/bpf/workerprobe"
        ));
    }
    let Some(mount) = mounts
        .iter()
        .filter(|mount| dir.starts_with(mount) && dir != mount.as_path())
        .max_by_key(|mount| mount.components().count())
    else {
        let hint = match mounts.first() {
            Some(mount) => format!("a directory under {}", mount.display()),
            None => "bpffs mounted first (`mount -t bpf bpf /sys/fs/bpf`)".to_string(),
        };
        return Err(format!(
            "`{shown}` is not under a bpffs mount, which pinning needs: use {hint}, like /sys/fs/bpf/workerprobe"
        ));
    };
    // bpffs refuses names with a dot.
    let below = dir.strip_prefix(mount).unwrap_or(dir);
    if below
        .components()
        .any(|c| c.as_os_str().to_string_lossy().contains('.'))
    {
        return Err(format!(
            "`{shown}` has a `.` in a name below {}, which bpffs refuses: use names without dots",
            mount.display()
        ));
    }
    Ok(())
}

/// clap value parser for `--pin DIR` and `unpin DIR`.
pub fn parse_pin_dir(text: &str) -> Result<PathBuf, String> {
    let dir = PathBuf::from(text);
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    check_pin_dir(&dir, &bpffs_mounts(&mountinfo))?;
    Ok(dir)
}

/// Validates a pin directory at run time (for callers that did not go through clap).
fn validate(dir: &Path) -> Result<(), UserError> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    check_pin_dir(dir, &bpffs_mounts(&mountinfo)).map_err(UserError::BadInput)
}

/// The set's description, `None` if DIR has no `meta`; a set of another format is refused.
fn read_meta(dir: &Path) -> anyhow::Result<Option<Meta>> {
    let meta = read_meta_of_any_format(dir)?;
    if let Some(meta) = &meta
        && !READABLE_FORMATS.contains(&meta.format_version)
    {
        return Err(UserError::BadInput(format!(
            "{} holds a pin set of format {} that this workerprobe (format {FORMAT_VERSION}) cannot read: run the workerprobe that made it, or `workerprobe unpin {}`",
            dir.display(),
            meta.format_version,
            dir.display()
        ))
        .into());
    }
    Ok(meta)
}

/// The set's description whatever its format (the entries are named alike in every format,
/// so `unpin` removes an older set).
fn read_meta_of_any_format(dir: &Path) -> anyhow::Result<Option<Meta>> {
    let path = dir.join(META);
    match std::fs::read_link(&path) {
        Ok(target) => {
            let text = target.to_string_lossy();
            let meta: Meta = serde_json::from_str(&text).map_err(|_| {
                UserError::BadInput(format!(
                    "{} is not a workerprobe pin description: {} was not made by workerprobe",
                    path.display(),
                    dir.display()
                ))
            })?;
            Ok(Some(meta))
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(anyhow::Error::new(err).context(format!("reading {}", path.display()))),
    }
}

fn write_meta(dir: &Path, meta: &Meta) -> anyhow::Result<()> {
    let text = serde_json::to_string(meta).context("encoding the pin set's description")?;
    let path = dir.join(META);
    std::os::unix::fs::symlink(&text, &path).with_context(|| format!("writing {}", path.display()))
}

/// Takes DIR's exclusive lock: one agent per pin set.
fn lock(dir: &Path) -> anyhow::Result<File> {
    let file = File::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(UserError::BadInput(format!(
            "another workerprobe is using the pin set {}: stop it first, or give another --pin directory",
            dir.display()
        ))
        .into());
    }
    Ok(file)
}

/// `--pin DIR`: continues the pin set in DIR, or makes it when DIR is empty or missing.
pub fn open_or_create(options: &LoadOptions, dir: &Path) -> anyhow::Result<Probe> {
    validate(dir)?;
    super::check_privileges()?;
    if dir.exists() && !dir.is_dir() {
        return Err(UserError::BadInput(format!(
            "`{}` is not a directory: give a directory under a bpffs mount for --pin",
            dir.display()
        ))
        .into());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    let lock = lock(dir)?;
    match read_meta(dir)? {
        Some(meta) => open_pinned(options, dir, &meta, lock),
        None => {
            let empty = std::fs::read_dir(dir)
                .with_context(|| format!("listing {}", dir.display()))?
                .next()
                .is_none();
            if !empty {
                return Err(UserError::BadInput(format!(
                    "{} holds entries but no workerprobe pin set (no `{META}`): give an empty or missing directory for --pin",
                    dir.display()
                ))
                .into());
            }
            create(options, dir, lock)
        }
    }
}

/// First start: load, attach, pin.
fn create(options: &LoadOptions, dir: &Path, lock: File) -> anyhow::Result<Probe> {
    // A pin set's counters continue across agents: the switch program's counters do, the
    // iterator's per-agent baseline would not. No iterator's link can be pinned, so memory
    // is read from files by every agent of the set alike.
    let options = super::LoadOptions {
        cpu_by_sched_switch: true,
        memory_by_files: true,
        ..options.clone()
    };
    let mut loaded = super::load(&options)?;
    // Attach first: the kernel may refuse a variant, and the description records the outcome.
    let links = super::attach_plan(&mut loaded)?;
    let meta = Meta::new(&options, &loaded);
    // The description before any pin: whatever happens next, `unpin` knows the set.
    write_meta(dir, &meta)?;
    for name in &meta.maps {
        let map = loaded
            .ebpf
            .map(name)
            .with_context(|| format!("map {name} missing from the eBPF object"))?;
        map.pin(dir.join(name))
            .with_context(|| format!("pinning map {name} in {}", dir.display()))?;
    }
    for (planned, link) in links {
        // Dropping the pinned link closes our descriptor; the pin keeps it attached.
        super::take_link(&mut loaded.ebpf, &planned, link)?
            .pin(dir.join(link_name(planned.program)))
            .with_context(|| format!("pinning the link of program {}", planned.program))?;
    }
    crate::cpu_switch::switch_every_online_cpu();
    Ok(Probe {
        cpu_iter: None,
        memory_iter: None,
        rss_iter: None,
        ebpf: Some(loaded.ebpf),
        maps: HashMap::new(),
        plan: loaded.plan,
        _lock: Some(lock),
    })
}

/// Restart: open the pinned maps; load and attach nothing.
fn open_pinned(
    options: &LoadOptions,
    dir: &Path,
    meta: &Meta,
    lock: File,
) -> anyhow::Result<Probe> {
    let asked_groups = group_names(&options.groups);
    if meta.groups != asked_groups || meta.max_workers != options.max_workers {
        return Err(UserError::BadInput(format!(
            "the pin set {} was made with --programs {} --max-workers {}, not --programs {} --max-workers {}: give the same options, or `workerprobe unpin {}` first",
            dir.display(),
            meta.groups.join(","),
            meta.max_workers,
            asked_groups.join(","),
            options.max_workers,
            dir.display()
        ))
        .into());
    }
    let missing: Vec<String> = meta
        .entries()
        .into_iter()
        .filter(|name| !dir.join(name).exists())
        .collect();
    if !missing.is_empty() {
        return Err(UserError::BadInput(format!(
            "the pin set {} is incomplete (missing {}), as after an interrupted first start: run `workerprobe unpin {}`, then start again",
            dir.display(),
            missing.join(", "),
            dir.display()
        ))
        .into());
    }
    let mut maps = HashMap::new();
    for name in &meta.maps {
        let path = dir.join(name);
        let data = MapData::from_pin(&path)
            .with_context(|| format!("opening pinned map {}", path.display()))?;
        let map = Map::from_map_data(data)
            .with_context(|| format!("opening pinned map {}", path.display()))?;
        maps.insert(name.clone(), map);
    }
    Ok(Probe {
        cpu_iter: None,
        memory_iter: None,
        rss_iter: None,
        ebpf: None,
        maps,
        plan: recorded_plan(meta),
        _lock: Some(lock),
    })
}

/// The plan a pin set was made with. A description from before plans were recorded ran every
/// group it names with its first variant.
fn recorded_plan(meta: &Meta) -> Plan {
    let groups = meta
        .groups
        .iter()
        .filter_map(|name| ProgramGroup::from_name(name))
        .map(|group| {
            let pinned = meta.plan.iter().find(|p| p.group == group.name());
            let variants = super::plan::variants(group);
            let plan = match pinned {
                None => GroupPlan::Runs(&variants[0]),
                Some(PinnedGroup {
                    variant: None,
                    missing,
                    ..
                }) => GroupPlan::Missing(missing.clone()),
                Some(PinnedGroup {
                    variant: Some(name),
                    ..
                }) => match variants.iter().find(|v| v.name == name) {
                    Some(variant) => GroupPlan::Runs(variant),
                    None if name.ends_with("net") => GroupPlan::Within(ProgramGroup::Net),
                    None => GroupPlan::Within(ProgramGroup::Delays),
                },
            };
            (group, plan)
        })
        .collect();
    let extras_running: Vec<String> = meta
        .plan
        .iter()
        .flat_map(|pinned| pinned.extras.iter().cloned())
        .collect();
    Plan::recorded(groups, &extras_running)
}

/// What `unpin` removed.
#[derive(Debug, Default)]
pub struct Unpinned {
    /// Link pins removed (each detaches its program).
    pub links: usize,
    /// Map pins removed.
    pub maps: usize,
}

/// `workerprobe unpin DIR`: removes the links (detaching the programs once nothing else holds
/// them), the maps, `meta`, then DIR.
pub fn unpin(dir: &Path) -> anyhow::Result<Unpinned> {
    validate(dir)?;
    let not_a_set = || {
        UserError::BadInput(format!(
            "{} is not a workerprobe pin set (no `{META}` in it): give the directory you passed to --pin",
            dir.display()
        ))
    };
    if !dir.is_dir() {
        return Err(not_a_set().into());
    }
    let meta = read_meta_of_any_format(dir)?.ok_or_else(not_a_set)?;
    let _lock = lock(dir)?;
    let mut unpinned = Unpinned::default();
    for program in &meta.programs {
        if remove_if_there(&dir.join(&program.link))? {
            unpinned.links += 1;
        }
    }
    for map in &meta.maps {
        if remove_if_there(&dir.join(map))? {
            unpinned.maps += 1;
        }
    }
    remove_if_there(&dir.join(META))?;
    std::fs::remove_dir(dir).with_context(|| {
        format!(
            "removing {} (it holds entries workerprobe did not make)",
            dir.display()
        )
    })?;
    Ok(unpinned)
}

fn remove_if_there(path: &Path) -> anyhow::Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(err) => Err(anyhow::Error::new(err).context(format!("removing {}", path.display()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
23 1 0:21 / /sys rw,nosuid - sysfs sysfs rw
43 23 0:39 / /sys/fs/bpf rw,relatime - bpf bpf rw
44 23 0:40 / /mnt/my\\040bpf rw,relatime - bpf none rw
";

    #[test]
    fn finds_bpffs_mounts() {
        assert_eq!(
            bpffs_mounts(MOUNTINFO),
            [PathBuf::from("/sys/fs/bpf"), PathBuf::from("/mnt/my bpf")]
        );
    }

    #[test]
    fn pin_dirs_must_be_under_bpffs() {
        let mounts = bpffs_mounts(MOUNTINFO);
        let check = |dir: &str| check_pin_dir(Path::new(dir), &mounts);
        assert_eq!(check("/sys/fs/bpf/workerprobe"), Ok(()));
        assert_eq!(check("/sys/fs/bpf/a/b"), Ok(()));
        assert_eq!(check("/mnt/my bpf/wp"), Ok(()));
        assert!(check("/sys/fs/bpf").unwrap_err().contains("not under"));
        assert!(check("/tmp/wp").unwrap_err().contains("not under"));
        assert!(check("wp").unwrap_err().contains("absolute"));
        assert!(check("/sys/fs/bpf/../x").unwrap_err().contains(".."));
        assert!(check("/sys/fs/bpf/wp.1").unwrap_err().contains("dot"));
        assert!(
            check_pin_dir(Path::new("/sys/fs/bpf/x"), &[])
                .unwrap_err()
                .contains("mount -t bpf")
        );
    }

    #[test]
    fn meta_round_trips_and_lists_links_first() {
        let meta = Meta {
            format_version: FORMAT_VERSION,
            agent_version: "0".into(),
            groups: group_names(&ProgramGroup::DEFAULT),
            programs: vec![PinnedProgram {
                program: "switch_full".into(),
                tracepoint: "sched_switch".into(),
                attach: "tp_btf".into(),
                link: link_name("switch_full"),
            }],
            plan: Vec::new(),
            maps: vec![CPU_STATS_MAP.into()],
            max_workers: 7,
            offsets: Default::default(),
        };
        let text = serde_json::to_string(&meta).unwrap();
        assert!(text.len() < 4000, "a symlink target holds it");
        assert_eq!(serde_json::from_str::<Meta>(&text).unwrap(), meta);
        assert_eq!(meta.entries(), ["link_switch_full", "CPU_STATS"]);
        assert_eq!(
            meta.groups,
            ["cpu", "delays", "endpoints", "net", "waits", "workers"]
        );
    }
}
