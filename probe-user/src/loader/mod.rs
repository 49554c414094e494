//! Loads the eBPF object into the kernel and attaches its programs. The only module that
//! touches `aya::programs`.
//!
//! Kernel differences are decided here and nowhere else: [`features`] probes what the running
//! kernel offers, [`plan`] picks each group's variant from that, and what no variant can
//! measure is reported once, in one sentence, and marked in [`Measured`].

mod btf_reader;
pub mod features;
pub mod iter_walk;
pub mod kernel_btf;
pub mod pin;
pub mod plan;

use std::{collections::HashMap, os::fd::AsFd as _, path::Path};

use anyhow::Context as _;
use aya::{
    Btf, Ebpf, EbpfLoader,
    maps::Map,
    programs::{
        BtfTracePoint, FExit, Iter, fexit::FExitLinkId, links::FdLink, tp_btf::BtfTracePointLinkId,
    },
};
use probe_common::{
    memory::{
        CGROUP_MEMORY_CSS_OFFSET_GLOBAL, CSS_CGROUP_OFFSET_GLOBAL,
        CSS_SET_MEMORY_CSS_OFFSET_GLOBAL, MEMCG_USAGE_OFFSET_GLOBAL, MEMCG_WATERMARK_OFFSET_GLOBAL,
        SIGNAL_MAXRSS_OFFSET_GLOBAL, TASK_MEMORY_CGROUP_GLOBAL, TASK_SIGNAL_OFFSET_GLOBAL,
    },
    net::{
        ENDPOINTS_ON_GLOBAL, ENDPOINTS_PER_WORKER_GLOBAL, SOCK_DADDR_OFFSET_GLOBAL,
        SOCK_DPORT_OFFSET_GLOBAL, SOCK_FAMILY_OFFSET_GLOBAL, SOCK_V6_DADDR_OFFSET_GLOBAL,
        SOCKET_SK_OFFSET_GLOBAL,
    },
    process::{PROCESS_OFFSET_GLOBALS, PROCESSES_ON_GLOBAL},
    rstat as r,
    task::{
        CGROUP_KN_OFFSET_GLOBAL, CGROUP_ROOT_HIERARCHY_ID_OFFSET_GLOBAL, CGROUP_ROOT_OFFSET_GLOBAL,
        CGROUPS_OFFSET_GLOBAL, CSS_SET_DFL_CGRP_OFFSET_GLOBAL, FDTABLE_FD_OFFSET_GLOBAL,
        FDTABLE_MAX_FDS_OFFSET_GLOBAL, FILE_F_INODE_OFFSET_GLOBAL, FILES_FDT_OFFSET_GLOBAL,
        FILES_OFFSET_GLOBAL, FLAGS_OFFSET_GLOBAL, INODE_I_MODE_OFFSET_GLOBAL,
        KERNFS_NODE_ID_OFFSET_GLOBAL, PID_OFFSET_GLOBAL, POLICY_OFFSET_GLOBAL,
        PREV_SUM_EXEC_RUNTIME_OFFSET_GLOBAL, PT_REGS_DI_OFFSET_GLOBAL,
        PT_REGS_ORIG_AX_OFFSET_GLOBAL, SCHED_INFO_LAST_ARRIVAL_OFFSET_GLOBAL,
        SCHED_INFO_LAST_QUEUED_OFFSET_GLOBAL, SCHED_INFO_PCOUNT_OFFSET_GLOBAL,
        SCHED_INFO_RUN_DELAY_OFFSET_GLOBAL, SCHED_TASK_GROUP_OFFSET_GLOBAL, STAND_IN_STATE_GLOBAL,
        STIME_OFFSET_GLOBAL, SUM_EXEC_RUNTIME_OFFSET_GLOBAL, TASK_GROUP_CSS_CGROUP_OFFSET_GLOBAL,
        TGID_OFFSET_GLOBAL, UTIME_OFFSET_GLOBAL,
    },
};

use self::{
    features::KernelFeatures,
    plan::{Attach, Plan, PlannedProgram},
};
use crate::{error::UserError, model::Measured};

/// The eBPF object built from `probe-ebpf` by build.rs.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/probe-ebpf"));

/// What a user can choose to measure (`--programs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ProgramGroup {
    /// On-CPU time and context switches (sched_switch).
    Cpu,
    /// Where off-CPU time went: run-queue wait, blocked on I/O, sleep (sched_switch with
    /// per-task state, sched_wakeup_new). Includes `Cpu`.
    Delays,
    /// Socket bytes and calls (sock_send_length, sock_recv_length; fexit on sock_sendmsg and
    /// sock_recvmsg before Linux 6.3).
    Net,
    /// For benchmarks only: an empty sched_switch program, the cost floor.
    Floor,
    /// For benchmarks only: the least exact per-task CPU accounting on sched_switch (its own
    /// maps; it measures nothing a user sees).
    Least,
    /// Workers made and removed (cgroup_mkdir, cgroup_rmdir): exit summaries.
    Lifecycle,
    /// Bytes and network waits per remote endpoint, kept by the socket programs (with `Net`).
    Endpoints,
    /// What each sleep waited on (network, disk, lock, …): `Delays` with its sched_switch
    /// program reading the sleeping thread's system call. Includes `Delays`.
    Waits,
    /// Processes made and programs started (sched_process_fork, sched_process_exec), for
    /// process workers; planned only for `watch --processes`.
    Processes,
}

impl ProgramGroup {
    /// Every group a user normally wants.
    pub const DEFAULT: [ProgramGroup; 6] = [
        ProgramGroup::Cpu,
        ProgramGroup::Delays,
        ProgramGroup::Net,
        ProgramGroup::Lifecycle,
        ProgramGroup::Endpoints,
        ProgramGroup::Waits,
    ];

    /// The `--programs` name of the group.
    pub fn name(self) -> &'static str {
        match self {
            ProgramGroup::Cpu => "cpu",
            ProgramGroup::Delays => "delays",
            ProgramGroup::Net => "net",
            ProgramGroup::Floor => "floor",
            ProgramGroup::Least => "least",
            ProgramGroup::Lifecycle => "workers",
            ProgramGroup::Endpoints => "endpoints",
            ProgramGroup::Waits => "waits",
            ProgramGroup::Processes => "processes",
        }
    }

    /// The group of a `--programs` name.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            ProgramGroup::Cpu,
            ProgramGroup::Delays,
            ProgramGroup::Net,
            ProgramGroup::Floor,
            ProgramGroup::Least,
            ProgramGroup::Lifecycle,
            ProgramGroup::Endpoints,
            ProgramGroup::Waits,
            ProgramGroup::Processes,
        ]
        .into_iter()
        .find(|group| group.name() == name)
    }
}

/// The socket programs' variant, when it is forced rather than chosen from the kernel: to
/// compare both on a kernel that has both (benchmarks, the VM matrix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetAttach {
    /// The sock_send_length / sock_recv_length tracepoints (6.3+).
    Tracepoint,
    /// fexit on the protocols' sendmsg / recvmsg.
    Fexit,
}

/// Options for loading.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// How many cgroups each per-cgroup map holds.
    pub max_workers: u32,
    /// Which programs to attach.
    pub groups: Vec<ProgramGroup>,
    /// Force the socket variant (the plan then acts as if the kernel lacked the other).
    pub net_attach: Option<NetAttach>,
    /// Count CPU time with the sched_switch program even where the kernel's per-cgroup
    /// accounting can be read (pin sets, benchmarks, tests of that variant).
    pub cpu_by_sched_switch: bool,
    /// Read memory from each worker's files even where a cgroup iterator could read every
    /// cgroup's counters in one walk, and processes' resident sets from their statm files
    /// (pin sets, `exec`'s one worker, benchmarks).
    pub memory_by_files: bool,
    /// Walk every process's resident set even where cgroup2's memory files leave it unused
    /// (tests of the process walk on pure cgroup2).
    pub process_rss_walk: bool,
    /// Endpoints kept per worker (the rest share its `other` entry).
    pub endpoints_per_worker: u32,
    /// Capacity of the endpoints map, every worker together.
    pub max_endpoints: u32,
    /// Whether the process programs tell of every process (`watch --processes`).
    pub processes: bool,
    /// Slots of the per-worker counters' fast path (default: as many as
    /// `probe_common::cpu::fast_slots` allows); workers beyond them use the hashes. 0: every
    /// worker uses the hashes (the design before slots, for benchmarks).
    pub cpu_slots: Option<u32>,
    /// Slots of the endpoints' fast path (default: as many as
    /// `probe_common::net::fast_endpoint_slots` allows); endpoints beyond them use the
    /// endpoint hash. 0: every endpoint uses the hash (the design before, for benchmarks).
    pub endpoint_slots: Option<u32>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self {
            max_workers: probe_common::DEFAULT_MAX_WORKERS,
            groups: ProgramGroup::DEFAULT.to_vec(),
            net_attach: None,
            cpu_by_sched_switch: false,
            memory_by_files: false,
            process_rss_walk: false,
            endpoints_per_worker: probe_common::net::DEFAULT_ENDPOINTS_PER_WORKER,
            max_endpoints: probe_common::net::DEFAULT_MAX_ENDPOINTS,
            processes: false,
            cpu_slots: None,
            endpoint_slots: None,
        }
    }
}

/// The attached programs' maps, for the collector to take.
///
/// Loaded here (no `--pin`): dropping it detaches the programs and frees their maps. Opened
/// from a pin set: the pinned links keep the programs attached whatever becomes of it.
pub struct Probe {
    /// The loaded object, when this process loaded it.
    ebpf: Option<Ebpf>,
    /// Maps opened from a pin set, by name.
    maps: HashMap<String, Map>,
    /// What runs and what is missing on this kernel.
    plan: Plan,
    /// The iterator that reads CPU time, when the plan chose it.
    cpu_iter: Option<iter_walk::IterWalk>,
    /// The iterator that reads memory, when the plan chose it.
    memory_iter: Option<iter_walk::IterWalk>,
    /// The iterator that reads processes' resident sets, when the plan chose it.
    rss_iter: Option<iter_walk::IterWalk>,
    /// The pin set's lock, held while the collector lives (one agent per pin set).
    _lock: Option<std::fs::File>,
}

impl Probe {
    /// Takes a map by name (the collector reads each one it takes).
    pub fn take_map(&mut self, name: &str) -> Option<Map> {
        match self.maps.remove(name) {
            Some(map) => Some(map),
            None => self.ebpf.as_mut()?.take_map(name),
        }
    }

    /// Which measurements the attached programs make.
    pub fn measured(&self) -> Measured {
        self.plan.measured()
    }

    /// Takes the iterator that reads CPU time, when CPU time comes from it.
    pub fn take_cpu_iter(&mut self) -> Option<iter_walk::IterWalk> {
        self.cpu_iter.take()
    }

    /// Takes the iterator that reads memory, when memory comes from it.
    pub fn take_memory_iter(&mut self) -> Option<iter_walk::IterWalk> {
        self.memory_iter.take()
    }

    /// Takes the iterator that reads processes' resident sets, when they come from it.
    pub fn take_rss_iter(&mut self) -> Option<iter_walk::IterWalk> {
        self.rss_iter.take()
    }

    /// The plan that was attached.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// One sentence per requested measurement this kernel cannot make.
    pub fn notes(&self) -> Vec<String> {
        self.plan.notes(&features::kernel_release())
    }
}

/// Loads and attaches the programs (`pin: None`), or with `--pin DIR` continues the pin set in
/// DIR, making it first if DIR is empty or missing (see [`pin`]).
pub fn open(options: &LoadOptions, pin: Option<&Path>) -> anyhow::Result<Probe> {
    match pin {
        None => load_and_attach(options),
        Some(dir) => {
            let probe = pin::open_or_create(options, dir)?;
            give_back_load_memory();
            Ok(probe)
        }
    }
}

/// Returns to the kernel what loading freed (the kernel's BTF parsed by aya, twice, tens of
/// MB), which glibc keeps unless asked. Called once the function that owned the load has
/// returned, so every parse is freed by then: idle `top` is 18 MB with it, 29 MB when a parse
/// outlived it.
fn give_back_load_memory() {
    // SAFETY: malloc_trim only gives free memory back to the kernel.
    unsafe { libc::malloc_trim(0) };
}

/// Checks what the user can fix, then loads and attaches the programs the kernel allows.
pub fn load_and_attach(options: &LoadOptions) -> anyhow::Result<Probe> {
    let probe = attach_unpinned(options)?;
    give_back_load_memory();
    Ok(probe)
}

/// [`load_and_attach`] up to the trim: the load's memory is freed when this returns.
fn attach_unpinned(options: &LoadOptions) -> anyhow::Result<Probe> {
    let mut loaded = load(options)?;
    let links = attach_plan(&mut loaded)?;
    let memory_walk = loaded.plan.memory_walk();
    let memory_iter = attach_walk(&mut loaded, memory_walk);
    loaded.plan.memory_walk &= memory_iter.is_some();
    let rss_walk = loaded.plan.rss_walk();
    let rss_iter = attach_walk(&mut loaded, rss_walk);
    loaded.plan.rss_walk &= rss_iter.is_some();
    let cpu_iter = links.into_iter().find_map(|(_, link)| match link {
        LinkId::Iter(iter) => Some(iter),
        _ => None,
    });
    // Each CPU gets a switch record before the first sample: a thread running since before
    // the attach would otherwise go uncounted until it left its CPU (seconds, if busy).
    crate::cpu_switch::switch_every_online_cpu();
    Ok(Probe {
        ebpf: Some(loaded.ebpf),
        maps: HashMap::new(),
        plan: loaded.plan,
        cpu_iter,
        memory_iter,
        rss_iter,
        _lock: None,
    })
}

/// Fills the fresh stack of free slots, lowest on top: workers take the lowest slots first and
/// get back the ones given back last, so the slots in use stay few and low (user space reads
/// the array only up to the highest one in use).
fn free_every_slot(ebpf: &mut Ebpf, stack: &str, slots: u32) -> anyhow::Result<()> {
    let map = ebpf
        .map_mut(stack)
        .with_context(|| format!("map {stack} missing from the eBPF object"))?;
    let mut free: aya::maps::Stack<_, u32> =
        aya::maps::Stack::try_from(map).with_context(|| format!("map {stack}"))?;
    for slot in (0..slots).rev() {
        free.push(slot, 0)
            .with_context(|| format!("filling map {stack}"))?;
    }
    Ok(())
}

/// A loaded object whose programs are not attached yet.
struct Loaded {
    ebpf: Ebpf,
    btf: Btf,
    /// The kernel struct offsets handed to the programs.
    task: probe_common::task::TaskOffsets,
    wait: probe_common::task::WaitOffsets,
    memory: probe_common::memory::MemoryOffsets,
    process: probe_common::process::ProcessOffsets,
    family_offset: u32,
    socket_sk_offset: u32,
    /// Which variant each group will use.
    plan: Plan,
}

/// Checks what the user can fix, probes the kernel, plans, then loads the object (maps made,
/// programs not yet loaded).
fn load(options: &LoadOptions) -> anyhow::Result<Loaded> {
    check_privileges()?;
    if !Path::new(kernel_btf::VMLINUX_BTF).exists() {
        return Err(UserError::NoKernelBtf.into());
    }
    // Read whole, then indexed and parsed in memory.
    let bytes = std::fs::read(kernel_btf::VMLINUX_BTF).map_err(|_| UserError::NoKernelBtf)?;
    // aya's loader parses the kernel's BTF when made, to be replaced by ours at once: that
    // parse, garbage from the start, runs on another CPU beside the offsets and ours. (Ours
    // stays on this thread: kept data parsed on another one left that thread's malloc arena
    // to the runtime, 10–20 MB more resident at 1,000 workers.)
    let (loader, facts, btf) = std::thread::scope(|scope| {
        let loader = scope.spawn(|| {
            let mut loader = EbpfLoader::new();
            loader.btf(None);
            loader
        });
        let facts = kernel_facts(&bytes);
        let btf = Btf::parse(&bytes, aya::Endianness::default());
        (loader.join(), facts, btf)
    });
    let KernelFacts {
        rstat,
        bpf_array_pptrs,
        family_offset,
        socket_sk_offset,
        task,
        wait,
        memory,
        process,
        sock,
        features,
    } = facts?;
    let mut loader = loader.map_err(|_| UserError::NoKernelBtf)?;
    let btf = btf.map_err(|_| UserError::NoKernelBtf)?;
    let mut features = features;
    match options.net_attach {
        None => {}
        Some(NetAttach::Fexit) => {
            features.tracepoints.remove("sock_send_length");
            features.tracepoints.remove("sock_recv_length");
        }
        Some(NetAttach::Tracepoint) => features.fexit = false,
    }
    if options.cpu_by_sched_switch {
        features.cgroup_rstat = false;
    }
    // Where v1 holds the memory controller, no cgroup2 cgroup has its counters, and workers'
    // memory is their processes' resident sets: the process walk's to read. Elsewhere it is
    // wanted only by tests of it.
    let cgroup2_memory = crate::cgroup::cgroup2_has_controller("memory");
    if options.memory_by_files || !cgroup2_memory {
        features.cgroup_memory = false;
    }
    if options.memory_by_files || (cgroup2_memory && !options.process_rss_walk) {
        features.process_rss = false;
    }
    let mut groups = options.groups.clone();
    if options.processes && !groups.contains(&ProgramGroup::Processes) {
        groups.push(ProgramGroup::Processes);
    }
    let mut plan = Plan::new(&groups, &features);
    if process.mm_rss_stat == 0 {
        // A kernel that tells a process's end in time but keeps its counters otherwise.
        plan.refuse_extra(
            "proc_exit_rss",
            "resident-page counters the agent can read (mm_struct.rss_stat)".into(),
        );
    }
    if !plan.runs_anything() {
        return Err(UserError::NothingToMeasure(plan.notes(&features::kernel_release())).into());
    }
    let sched_info = task.sched_info.unwrap_or_default();
    // Zero offsets where the kernel has no cpu controller groups: the programs then know no
    // move went through one.
    let cpu_group = task.cpu_group.unwrap_or_default();
    let task_memory_cgroup = memory.task_memory_cgroup;
    let endpoints_on = u32::from(plan.measured().endpoints);

    let possible_cpus = aya::util::nr_cpus().unwrap_or(1);
    let slots = options
        .cpu_slots
        .unwrap_or_else(|| probe_common::cpu::fast_slots(possible_cpus, options.max_workers));
    // Without endpoints the programs never take one: no memory for them.
    let endpoint_slots = if plan.measured().endpoints {
        options.endpoint_slots.unwrap_or_else(|| {
            probe_common::net::fast_endpoint_slots(possible_cpus, options.max_endpoints)
        })
    } else {
        0
    };
    let processes_on = u32::from(options.processes);
    let process_offsets = probe_common::process::ProcessOffsets {
        // The per-CPU parts are found through each CPU's per-CPU offset: not without it.
        rss_counter_percpu: if bpf_array_pptrs == 0 {
            0
        } else {
            process.rss_counter_percpu
        },
        ..process
    }
    .values();
    let for_processes = |size: u32, smallest: u32| {
        if options.processes { size } else { smallest }
    };
    for (name, offset) in PROCESS_OFFSET_GLOBALS.iter().zip(&process_offsets) {
        loader.override_global(name, offset, true);
    }
    let rstat = if plan.cpu_from_rstat() {
        rstat.unwrap_or_default()
    } else {
        kernel_btf::RstatOffsets::default()
    };
    let possible_cpus_u32 = u32::try_from(possible_cpus).unwrap_or(u32::MAX);
    // Read by the iterator and by the removal program once the iterator has walked.
    let rstat_globals = [
        (r::CGROUP_RSTAT_CPU_OFFSET_GLOBAL, rstat.cgroup_rstat_cpu),
        (r::RSTAT_CPUTIME_OFFSET_GLOBAL, rstat.cputime),
        (r::CPUTIME_UTIME_OFFSET_GLOBAL, rstat.utime),
        (r::CPUTIME_STIME_OFFSET_GLOBAL, rstat.stime),
        (r::CPUTIME_RUNTIME_OFFSET_GLOBAL, rstat.sum_exec_runtime),
        // The process programs use it too (resident pages' per-CPU parts).
        (r::BPF_ARRAY_PPTRS_OFFSET_GLOBAL, bpf_array_pptrs),
        (r::POSSIBLE_CPUS_GLOBAL, possible_cpus_u32),
    ];
    for (name, value) in &rstat_globals {
        loader.override_global(name, value, true);
    }
    // A cgroup's times on each CPU it ran on: each walk's, and a removed worker's final ones
    // until its summary.
    let per_cgroup_cpu_entries = if plan.cpu_from_rstat() {
        options
            .max_workers
            .saturating_mul(possible_cpus_u32)
            .min(1 << 20)
    } else {
        1
    };
    let ebpf = loader
        .btf(Some(&btf))
        .map_max_entries(r::FINAL_CPU_MAP, per_cgroup_cpu_entries)
        .map_max_entries(r::CPU_NOW_MAP, per_cgroup_cpu_entries)
        .override_global(PROCESSES_ON_GLOBAL, &processes_on, true)
        // The task storage map: the kernel knows it, aya 0.14 does not.
        .allow_unsupported_maps()
        .override_global(SOCK_FAMILY_OFFSET_GLOBAL, &family_offset, true)
        .override_global(ENDPOINTS_ON_GLOBAL, &endpoints_on, true)
        .override_global(
            ENDPOINTS_PER_WORKER_GLOBAL,
            &options.endpoints_per_worker,
            true,
        )
        .override_global(SOCK_DADDR_OFFSET_GLOBAL, &sock.daddr, true)
        .override_global(SOCK_DPORT_OFFSET_GLOBAL, &sock.dport, true)
        .override_global(SOCK_V6_DADDR_OFFSET_GLOBAL, &sock.v6_daddr, true)
        .override_global(SOCKET_SK_OFFSET_GLOBAL, &socket_sk_offset, true)
        .override_global(SUM_EXEC_RUNTIME_OFFSET_GLOBAL, &task.sum_exec_runtime, true)
        .override_global(
            PREV_SUM_EXEC_RUNTIME_OFFSET_GLOBAL,
            &task.prev_sum_exec_runtime,
            true,
        )
        .override_global(POLICY_OFFSET_GLOBAL, &task.policy, true)
        .override_global(
            SCHED_TASK_GROUP_OFFSET_GLOBAL,
            &cpu_group.sched_task_group,
            true,
        )
        .override_global(
            TASK_GROUP_CSS_CGROUP_OFFSET_GLOBAL,
            &cpu_group.task_group_css_cgroup,
            true,
        )
        .override_global(PID_OFFSET_GLOBAL, &task.pid, true)
        .override_global(CGROUPS_OFFSET_GLOBAL, &task.cgroups, true)
        .override_global(SCHED_INFO_PCOUNT_OFFSET_GLOBAL, &sched_info.pcount, true)
        .override_global(
            SCHED_INFO_RUN_DELAY_OFFSET_GLOBAL,
            &sched_info.run_delay,
            true,
        )
        .override_global(
            SCHED_INFO_LAST_ARRIVAL_OFFSET_GLOBAL,
            &sched_info.last_arrival,
            true,
        )
        .override_global(
            SCHED_INFO_LAST_QUEUED_OFFSET_GLOBAL,
            &sched_info.last_queued,
            true,
        )
        .override_global(CSS_SET_DFL_CGRP_OFFSET_GLOBAL, &task.css_set_dfl_cgrp, true)
        .override_global(CGROUP_KN_OFFSET_GLOBAL, &task.cgroup_kn, true)
        .override_global(KERNFS_NODE_ID_OFFSET_GLOBAL, &task.kernfs_node_id, true)
        .override_global(CGROUP_ROOT_OFFSET_GLOBAL, &task.cgroup_root, true)
        .override_global(
            CGROUP_ROOT_HIERARCHY_ID_OFFSET_GLOBAL,
            &task.cgroup_root_hierarchy_id,
            true,
        )
        .override_global(
            STAND_IN_STATE_GLOBAL,
            &u32::from(features.task_storage_found_while_busy),
            true,
        )
        .override_global(UTIME_OFFSET_GLOBAL, &task.utime, true)
        .override_global(STIME_OFFSET_GLOBAL, &task.stime, true)
        .override_global(TGID_OFFSET_GLOBAL, &task.tgid, true)
        .override_global(FLAGS_OFFSET_GLOBAL, &wait.task_flags, true)
        .override_global(FILES_OFFSET_GLOBAL, &wait.task_files, true)
        .override_global(FILES_FDT_OFFSET_GLOBAL, &wait.files_fdt, true)
        .override_global(FDTABLE_MAX_FDS_OFFSET_GLOBAL, &wait.fdtable_max_fds, true)
        .override_global(FDTABLE_FD_OFFSET_GLOBAL, &wait.fdtable_fd, true)
        .override_global(FILE_F_INODE_OFFSET_GLOBAL, &wait.file_f_inode, true)
        .override_global(INODE_I_MODE_OFFSET_GLOBAL, &wait.inode_i_mode, true)
        .override_global(PT_REGS_ORIG_AX_OFFSET_GLOBAL, &wait.pt_regs_orig_ax, true)
        .override_global(PT_REGS_DI_OFFSET_GLOBAL, &wait.pt_regs_di, true)
        .override_global(TASK_SIGNAL_OFFSET_GLOBAL, &memory.task_signal, true)
        .override_global(SIGNAL_MAXRSS_OFFSET_GLOBAL, &memory.signal_maxrss, true)
        .override_global(
            CGROUP_MEMORY_CSS_OFFSET_GLOBAL,
            &memory.cgroup_memory_css,
            true,
        )
        .override_global(MEMCG_WATERMARK_OFFSET_GLOBAL, &memory.memcg_watermark, true)
        .override_global(MEMCG_USAGE_OFFSET_GLOBAL, &memory.memcg_usage, true)
        .override_global(
            CSS_SET_MEMORY_CSS_OFFSET_GLOBAL,
            &task_memory_cgroup.map_or(0, |(css, _)| css),
            true,
        )
        .override_global(
            CSS_CGROUP_OFFSET_GLOBAL,
            &task_memory_cgroup.map_or(0, |(_, cgroup)| cgroup),
            true,
        )
        .override_global(
            TASK_MEMORY_CGROUP_GLOBAL,
            &u32::from(task_memory_cgroup.is_some()),
            true,
        )
        // One entry per cgroup with a memory controller, from the walk; none without it. Not
        // made smaller by a small --max-workers: the entries are allocated as cgroups need
        // them, and a cgroup without one is read from its files.
        .map_max_entries(
            probe_common::memory::MEMORY_NOW_MAP,
            if plan.memory_walk {
                options.max_workers.max(probe_common::DEFAULT_MAX_WORKERS)
            } else {
                1
            },
        )
        .map_max_entries(probe_common::memory::PROCESS_PEAKS_MAP, options.max_workers)
        // The process workers' maps: at their smallest unless asked for (the ring costs
        // kernel memory whole).
        .map_max_entries(
            probe_common::process::PROCESS_CPU_MAP,
            for_processes(probe_common::process::PROCESS_CPU_ENTRIES, 1),
        )
        .map_max_entries(
            probe_common::process::PROCESS_NET_MAP,
            for_processes(probe_common::process::PROCESS_CPU_ENTRIES, 1),
        )
        .map_max_entries(
            probe_common::net::PROCESS_ENDPOINTS_MAP,
            for_processes(options.max_endpoints, 1),
        )
        .map_max_entries(
            probe_common::net::PROCESS_ENDPOINT_COUNTS_MAP,
            for_processes(probe_common::process::PROCESS_CPU_ENTRIES, 1),
        )
        .map_max_entries(
            probe_common::process::PROCESS_EVENTS_MAP,
            for_processes(probe_common::process::PROCESS_EVENTS_BYTES, 4096),
        )
        .map_max_entries(probe_common::cpu::CPU_STATS_MAP, options.max_workers)
        // A map cannot be empty: with no slots asked for, one that is never free.
        .map_max_entries(probe_common::cpu::CPU_SLOTS_MAP, slots.max(1))
        .map_max_entries(probe_common::cpu::SLOT_OF_MAP, slots.max(1))
        .map_max_entries(probe_common::cpu::FREE_SLOTS_MAP, slots.max(1))
        .map_max_entries(probe_common::net::NET_STATS_MAP, options.max_workers)
        .map_max_entries(probe_common::net::ENDPOINTS_MAP, options.max_endpoints)
        .map_max_entries(probe_common::net::ENDPOINT_COUNTS_MAP, options.max_workers)
        .map_max_entries(probe_common::net::ENDPOINT_SLOTS_MAP, endpoint_slots.max(1))
        .map_max_entries(
            probe_common::net::ENDPOINT_SLOT_OF_MAP,
            endpoint_slots.max(1),
        )
        .map_max_entries(
            probe_common::net::FREE_ENDPOINT_SLOTS_MAP,
            endpoint_slots.max(1),
        )
        .load(EBPF_OBJECT)
        .map_err(|err| classify_load_error(err.into()))?;
    let mut ebpf = ebpf;
    free_every_slot(&mut ebpf, probe_common::cpu::FREE_SLOTS_MAP, slots)?;
    free_every_slot(
        &mut ebpf,
        probe_common::net::FREE_ENDPOINT_SLOTS_MAP,
        endpoint_slots,
    )?;
    Ok(Loaded {
        ebpf,
        btf,
        task,
        wait,
        memory,
        process,
        family_offset,
        socket_sk_offset,
        plan,
    })
}

/// What the programs need to know of the kernel, read from its BTF.
struct KernelFacts {
    /// Where the kernel keeps per-cgroup CPU time (none: the iterator cannot read it).
    rstat: Option<kernel_btf::RstatOffsets>,
    /// `bpf_array.pptrs`, whence the programs learn each CPU's per-CPU offset (0: unknown).
    bpf_array_pptrs: u32,
    family_offset: u32,
    socket_sk_offset: u32,
    task: probe_common::task::TaskOffsets,
    wait: probe_common::task::WaitOffsets,
    memory: probe_common::memory::MemoryOffsets,
    process: probe_common::process::ProcessOffsets,
    sock: kernel_btf::SockPeerOffsets,
    /// What the plan chooses variants by.
    features: KernelFeatures,
}

/// The offsets the programs read at and the features the plan chooses by, from the kernel's
/// BTF (`bytes`).
fn kernel_facts(bytes: &[u8]) -> anyhow::Result<KernelFacts> {
    let btf = btf_reader::BtfReader::parse(bytes).map_err(|_| UserError::NoKernelBtf)?;
    let task = kernel_btf::task_offsets(&btf).context("locating task_struct's fields")?;
    let features = KernelFeatures::probe(&btf, &plan::all_needs(), task.sched_info.is_some());
    Ok(KernelFacts {
        rstat: kernel_btf::rstat_offsets(&btf).ok(),
        bpf_array_pptrs: kernel_btf::member_offset(&btf, "bpf_array", &["pptrs"]).unwrap_or(0),
        family_offset: kernel_btf::sock_family_offset(&btf)
            .context("locating struct sock's family field")?,
        // Only the fexit variant reads it; a kernel without it plans no such variant.
        socket_sk_offset: kernel_btf::socket_sk_offset(&btf).unwrap_or(0),
        task,
        wait: kernel_btf::wait_offsets(&btf).context("locating the fields wait reasons read")?,
        memory: kernel_btf::memory_offsets(&btf)
            .context("locating the fields that keep memory peaks")?,
        process: kernel_btf::process_offsets(&btf)
            .context("locating the fields the process programs read")?,
        sock: kernel_btf::sock_peer_offsets(&btf).context("locating struct sock's peer fields")?,
        features,
    })
}

/// A program's link, kept inside the program (dropping the object detaches it) until a pin
/// set takes it.
pub(crate) enum LinkId {
    /// Of a tp_btf program.
    TpBtf(BtfTracePointLinkId),
    /// Of an fexit program.
    FExit(FExitLinkId),
    /// Of an iterator: the agent walks it.
    Iter(iter_walk::IterWalk),
}

/// Attaches every program of the plan. When the kernel refuses one, the programs of its
/// variant already attached are unloaded and the group falls back to its next variant (or is
/// left out, with its reason in the plan's notes). Returns each attached program's link.
fn attach_plan(loaded: &mut Loaded) -> anyhow::Result<Vec<(PlannedProgram, LinkId)>> {
    let preloaded = preload(loaded);
    let mut attached: Vec<(PlannedProgram, LinkId)> = Vec::new();
    // Each fallback gives up a variant for good, so this ends.
    'plan: loop {
        for planned in loaded.plan.programs() {
            if attached.iter().any(|(p, _)| *p == planned) {
                continue;
            }
            match attach(&mut loaded.ebpf, &loaded.btf, &planned) {
                Ok(link) => attached.push((planned, link)),
                Err(Refused(reason)) => {
                    // An extra refused leaves its group running without it.
                    if let Some(extra_programs) =
                        loaded.plan.refuse_extra(planned.program, reason.clone())
                    {
                        for (program, _) in
                            attached.extract_if(.., |(p, _)| extra_programs.contains(p))
                        {
                            unload(&mut loaded.ebpf, &program);
                        }
                        continue 'plan;
                    }
                    let group = loaded
                        .plan
                        .group_of(planned.program)
                        .context("a planned program belongs to no group")?;
                    let siblings: Vec<PlannedProgram> = plan::variants(group)
                        .iter()
                        .find(|variant| variant.programs.contains(&planned))
                        .map(|variant| variant.programs.to_vec())
                        .unwrap_or_default();
                    for (program, _) in attached.extract_if(.., |(p, _)| siblings.contains(p)) {
                        unload(&mut loaded.ebpf, &program);
                    }
                    loaded.plan.fall_back(group, reason);
                    // Extras of a group that no longer runs go with it.
                    let planned_now = loaded.plan.programs();
                    for (program, _) in attached.extract_if(.., |(p, _)| !planned_now.contains(p)) {
                        unload(&mut loaded.ebpf, &program);
                    }
                    continue 'plan;
                }
            }
        }
        break;
    }
    // Loaded ahead for a variant given up since: not attached, so not kept either (the walks
    // are attached next).
    let walks = [loaded.plan.memory_walk(), loaded.plan.rss_walk()];
    for program in preloaded {
        if !attached.iter().any(|(p, _)| *p == program) && !walks.contains(&Some(program)) {
            unload(&mut loaded.ebpf, &program);
        }
    }
    if attached.is_empty() {
        return Err(
            UserError::NothingToMeasure(loaded.plan.notes(&features::kernel_release())).into(),
        );
    }
    Ok(attached)
}

/// Attaches a walk's program, `planned` when the plan has it; `None` when it has not, or the
/// kernel refused it (the caller then takes it out of the plan: memory is read from files, as
/// where the kernel has no iterator; nothing else changes).
fn attach_walk(
    loaded: &mut Loaded,
    planned: Option<PlannedProgram>,
) -> Option<iter_walk::IterWalk> {
    let planned = planned?;
    match attach(&mut loaded.ebpf, &loaded.btf, &planned) {
        Ok(LinkId::Iter(iter)) => Some(iter),
        Ok(_) | Err(Refused(_)) => {
            unload(&mut loaded.ebpf, &planned);
            None
        }
    }
}

/// Loads the planned programs on every CPU at once, before any is attached: the verifier is
/// half of the agent's start and checks each program on its own. A program the kernel
/// refuses stays unloaded here; attaching it tries again, and says why. The walks' programs
/// load with them (they are attached after the plan's).
fn preload(loaded: &mut Loaded) -> Vec<PlannedProgram> {
    let mut planned = loaded.plan.programs();
    planned.extend(loaded.plan.memory_walk());
    planned.extend(loaded.plan.rss_walk());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let work = verifier_work();
    let mut queue: Vec<(usize, PlannedProgram, &mut aya::programs::Program)> = loaded
        .ebpf
        .programs_mut()
        .filter_map(|(name, program)| {
            let planned = planned.iter().find(|p| p.program == name)?;
            Some((work.get(name).copied().unwrap_or(0), *planned, program))
        })
        .collect();
    // Longest first, each thread taking the next when it is done: a fixed share per thread
    // (in the map's random order) left one CPU idle for up to a third of the load.
    queue.sort_by_key(|(work, ..)| *work); // popped from the end
    let queue = std::sync::Mutex::new(queue);
    let btf = &loaded.btf;
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let next = queue.lock().ok().and_then(|mut queue| queue.pop());
                    let Some((_, planned, program)) = next else {
                        break;
                    };
                    // Errors are left for `attach`, which names the program.
                    let _ = match planned.attach {
                        Attach::TpBtf(tracepoint) => {
                            <&mut BtfTracePoint>::try_from(program).map(|p| p.load(tracepoint, btf))
                        }
                        Attach::FExit(function) => {
                            <&mut FExit>::try_from(program).map(|p| p.load(function, btf))
                        }
                        Attach::Iter(target) => {
                            <&mut Iter>::try_from(program).map(|p| p.load(target, btf))
                        }
                    };
                }
            });
        }
    });
    planned
}

/// Program name → instructions of its own function in the object: the verifier's work, to
/// within the functions it calls (a millisecond to parse). Empty if the object will not parse.
fn verifier_work() -> HashMap<String, usize> {
    let Ok(object) = aya_obj::Object::parse(EBPF_OBJECT) else {
        return HashMap::new();
    };
    object
        .programs
        .iter()
        .filter_map(|(name, program)| {
            let function = object
                .functions
                .get(&(program.section_index, program.address))?;
            Some((name.clone(), function.instructions.len()))
        })
        .collect()
}

/// The kernel would not load or attach a program; the end of a sentence saying so.
struct Refused(String);

/// Loads a planned program and attaches it; the link stays in the program.
fn attach(ebpf: &mut Ebpf, btf: &Btf, planned: &PlannedProgram) -> Result<LinkId, Refused> {
    let refused = |what: &str| {
        Refused(format!(
            "a kernel that lets it {what} its {} program on {}, which this one refused (WORKERPROBE_DEBUG=1 shows the kernel's reason)",
            planned.attach.kind(),
            planned.attach.target()
        ))
    };
    // The kernel's own words (the verifier's log) only on request: they are for bug reports,
    // not for users.
    let debug = std::env::var_os("WORKERPROBE_DEBUG").is_some();
    let refused_because = |what: &str, err: aya::programs::ProgramError| {
        if debug {
            eprintln!("workerprobe: debug: {} {what}: {err:?}", planned.program);
        }
        refused(what)
    };
    let program = ebpf
        .program_mut(planned.program)
        .ok_or_else(|| refused("find"))?;
    match planned.attach {
        Attach::TpBtf(tracepoint) => {
            let program: &mut BtfTracePoint = program.try_into().map_err(|_| refused("find"))?;
            if program.fd().is_err() {
                program
                    .load(tracepoint, btf)
                    .map_err(|err| refused_because("load", err))?;
            }
            program
                .attach()
                .map(LinkId::TpBtf)
                .map_err(|err| refused_because("attach", err))
        }
        Attach::FExit(function) => {
            let program: &mut FExit = program.try_into().map_err(|_| refused("find"))?;
            if program.fd().is_err() {
                program
                    .load(function, btf)
                    .map_err(|err| refused_because("load", err))?;
            }
            program
                .attach()
                .map(LinkId::FExit)
                .map_err(|err| refused_because("attach", err))
        }
        Attach::Iter(target) => {
            let program: &mut Iter = program.try_into().map_err(|_| refused("find"))?;
            if program.fd().is_err() {
                program
                    .load(target, btf)
                    .map_err(|err| refused_because("load", err))?;
            }
            let fd = program.fd().map_err(|err| refused_because("load", err))?;
            let iter = iter_walk::IterWalk::attach(fd.as_fd(), target).map_err(|err| {
                if debug {
                    eprintln!("workerprobe: debug: {} attach: {err}", planned.program);
                }
                refused("attach")
            })?;
            // A first walk: a program the verifier passed can still fail to read.
            iter.walk().map_err(|err| {
                if debug {
                    eprintln!("workerprobe: debug: {} walk: {err}", planned.program);
                }
                refused("run")
            })?;
            Ok(LinkId::Iter(iter))
        }
    }
}

/// Takes a program's link out of it, as a descriptor that can be pinned.
pub(crate) fn take_link(
    ebpf: &mut Ebpf,
    planned: &PlannedProgram,
    link: LinkId,
) -> anyhow::Result<FdLink> {
    let program = ebpf
        .program_mut(planned.program)
        .with_context(|| format!("program {} missing from the eBPF object", planned.program))?;
    let context = || format!("taking the link of program {}", planned.program);
    Ok(match link {
        LinkId::TpBtf(id) => {
            let program: &mut BtfTracePoint = program.try_into().with_context(context)?;
            FdLink::from(program.take_link(id).with_context(context)?)
        }
        LinkId::FExit(id) => {
            let program: &mut FExit = program.try_into().with_context(context)?;
            FdLink::from(program.take_link(id).with_context(context)?)
        }
        // Pin sets plan no iterator (`LoadOptions::cpu_attach`).
        LinkId::Iter(_) => anyhow::bail!("an iterator's link is not kept in a pin set"),
    })
}

/// Unloads (and so detaches) a program whose variant is given up.
fn unload(ebpf: &mut Ebpf, planned: &PlannedProgram) {
    let Some(program) = ebpf.program_mut(planned.program) else {
        return;
    };
    let _ = match planned.attach {
        Attach::TpBtf(_) => <&mut BtfTracePoint>::try_from(program).map(|p| p.unload()),
        Attach::FExit(_) => <&mut FExit>::try_from(program).map(|p| p.unload()),
        Attach::Iter(_) => <&mut Iter>::try_from(program).map(|p| p.unload()),
    };
}

/// A permission error from the kernel becomes the privileges sentence.
fn classify_load_error(err: anyhow::Error) -> anyhow::Error {
    let text = format!("{err:#}");
    if text.contains("Operation not permitted") || text.contains("EPERM") {
        UserError::NotPrivileged.into()
    } else {
        err
    }
}

/// Capability numbers from linux/capability.h.
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Fails early, with the sentence a user needs, when the process cannot load programs.
pub fn check_privileges() -> Result<(), UserError> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let effective = parse_cap_eff(&status).unwrap_or(0);
    if has_bpf_privileges(effective) {
        Ok(())
    } else {
        Err(UserError::NotPrivileged)
    }
}

/// The `CapEff:` mask of a `/proc/<pid>/status` text.
pub fn parse_cap_eff(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("CapEff:"))?;
    u64::from_str_radix(line.trim_start_matches("CapEff:").trim(), 16).ok()
}

/// Whether a capability mask allows loading tracing programs (CAP_BPF + CAP_PERFMON, or
/// CAP_SYS_ADMIN on its own).
pub fn has_bpf_privileges(effective: u64) -> bool {
    let has = |cap: u32| effective & (1u64 << cap) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_capabilities() {
        let status = "Name:\tx\nCapEff:\t000001ffffffffff\n";
        let effective = parse_cap_eff(status);
        assert_eq!(effective, Some(0x1ff_ffff_ffff));
        assert!(has_bpf_privileges(0x1ff_ffff_ffff));
        assert!(!has_bpf_privileges(0));
        assert!(has_bpf_privileges((1 << CAP_BPF) | (1 << CAP_PERFMON)));
        assert!(!has_bpf_privileges(1 << CAP_BPF));
    }

    /// A call to `memset`, `memcpy` and the like is compiler-builtins' byte loop, which the
    /// verifier walks a byte at a time on every path to it: a 584-byte zeroing was 52,560 of
    /// the sched_switch program's 66,316 checked instructions, most of the agent's start.
    /// Zero with probe-ebpf's `zero`, copy field by field.
    #[test]
    fn the_programs_call_no_byte_loops() {
        use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
        let file = object::File::parse(EBPF_OBJECT).expect("the eBPF object parses");
        let mut calls = Vec::new();
        for section in file.sections() {
            for (_, relocation) in section.relocations() {
                let object::RelocationTarget::Symbol(index) = relocation.target() else {
                    continue;
                };
                let name = file
                    .symbol_by_index(index)
                    .and_then(|symbol| symbol.name())
                    .unwrap_or_default();
                if ["memset", "memcpy", "memmove", "memcmp", "bcmp"].contains(&name) {
                    calls.push(format!("{} calls {name}", section.name().unwrap_or("?")));
                }
            }
        }
        assert!(calls.is_empty(), "{calls:?}");
    }
}
