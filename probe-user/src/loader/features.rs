//! What the running kernel offers the programs, probed before anything is loaded: tracepoints
//! and functions in its BTF, fexit trampolines, task-local storage, the scheduler's run-queue
//! accounting. [`super::plan`] turns these facts into the programs to attach.

use std::{
    collections::BTreeMap,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use super::btf_reader::{BtfReader as Btf, Kind};

/// One thing a program needs from the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Need {
    /// A tracepoint usable by `tp_btf` (a `btf_trace_<name>` type in the kernel's BTF) with at
    /// least `args` arguments.
    Tracepoint {
        /// Tracepoint name.
        name: &'static str,
        /// Arguments the program reads.
        args: usize,
    },
    /// A kernel function fexit can attach to, with these parameter names, in this order.
    Function {
        /// Function name.
        name: &'static str,
        /// Its parameters as the program reads them.
        params: &'static [&'static str],
    },
    /// fentry/fexit trampolines (BPF_PROG_TYPE_TRACING attach).
    Fexit,
    /// `BPF_MAP_TYPE_TASK_STORAGE` usable from tracing programs.
    TaskStorage,
    /// `task_struct.sched_info` (CONFIG_SCHED_INFO): the scheduler's run-queue accounting.
    SchedInfo,
    /// A cgroup iterator (6.1+) whose programs may read other CPUs' per-CPU map values
    /// (`bpf_map_lookup_percpu_elem`, 5.19+), and the kernel's per-CPU cgroup CPU time (the
    /// rstat base stats) at fields its BTF locates.
    CgroupRstat,
    /// A cgroup iterator (6.1+) and the memory controller's counters (`memory.usage`,
    /// `memory.watermark` of `struct mem_cgroup`) at fields its BTF locates.
    CgroupMemory,
    /// A task iterator (5.8+) and a process's resident-page counters (`mm_struct.rss_stat`) at
    /// fields its BTF locates.
    ProcessRss,
}

impl Need {
    /// What is missing, and where it can be had, as the end of a sentence.
    pub fn describe_missing(&self) -> String {
        match self {
            Need::Tracepoint {
                name: "sock_send_length" | "sock_recv_length",
                ..
            } => "the sock_send_length/sock_recv_length tracepoints (Linux 6.3+)".into(),
            Need::Tracepoint {
                name: "sched_switch",
                args,
            } if *args >= 4 => {
                "a sched_switch tracepoint that passes prev_state (Linux 5.18+)".into()
            }
            Need::Tracepoint {
                name: "sched_process_exit",
                args,
            } if *args >= 2 => {
                "a sched_process_exit tracepoint called before the process's memory is released, which passes group_dead (Linux 6.15+)".into()
            }
            Need::Tracepoint { name, .. } => format!("the {name} tracepoint in the kernel's BTF"),
            Need::Function { name, .. } => {
                format!("a traceable {name}() of the expected signature in the kernel's BTF")
            }
            Need::Fexit => {
                "fexit programs (BPF trampolines: Linux 5.5+ built with CONFIG_DYNAMIC_FTRACE_WITH_DIRECT_CALLS)".into()
            }
            Need::TaskStorage => "task-local storage for tracing programs (Linux 5.11+)".into(),
            Need::SchedInfo => "run-queue accounting (a kernel built with CONFIG_SCHED_INFO)".into(),
            Need::CgroupRstat => {
                "a cgroup iterator that can read per-CPU cgroup CPU time (Linux 6.1+)".into()
            }
            Need::CgroupMemory => {
                "a cgroup iterator that can read the memory controller's counters (Linux 6.1+, cgroup2 with the memory controller)".into()
            }
            Need::ProcessRss => {
                "a task iterator that can read processes' resident-page counters (Linux 5.8+)".into()
            }
        }
    }
}

/// The probed facts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelFeatures {
    /// Tracepoints found, with the number of arguments each passes.
    pub tracepoints: BTreeMap<String, usize>,
    /// Functions found, with their parameter names.
    pub functions: BTreeMap<String, Vec<String>>,
    /// fexit programs can be loaded and attached.
    pub fexit: bool,
    /// Task-local storage maps can be made.
    pub task_storage: bool,
    /// A tracing program finds a task's existing storage even while the storage is busy on
    /// its CPU: only making storage can fail (6.2+).
    pub task_storage_found_while_busy: bool,
    /// `task_struct.sched_info` exists.
    pub sched_info: bool,
    /// The cgroup iterator can read the kernel's per-CPU cgroup CPU time.
    pub cgroup_rstat: bool,
    /// The cgroup iterator can read the memory controller's counters.
    pub cgroup_memory: bool,
    /// The task iterator can read processes' resident-page counters.
    pub process_rss: bool,
}

impl KernelFeatures {
    /// Whether the kernel meets `need`.
    pub fn has(&self, need: &Need) -> bool {
        match need {
            Need::Tracepoint { name, args } => self
                .tracepoints
                .get(*name)
                .is_some_and(|found| found >= args),
            Need::Function { name, params } => self
                .functions
                .get(*name)
                .is_some_and(|found| found.iter().map(String::as_str).eq(params.iter().copied())),
            Need::Fexit => self.fexit,
            Need::TaskStorage => self.task_storage,
            Need::SchedInfo => self.sched_info,
            Need::CgroupRstat => self.cgroup_rstat,
            Need::CgroupMemory => self.cgroup_memory,
            Need::ProcessRss => self.process_rss,
        }
    }

    /// Probes the running kernel for every need in `needs`: BTF lookups, and for fexit a trial
    /// load of a trivial program (aya's feature probe).
    pub fn probe(btf: &Btf, needs: &[Need], sched_info: bool) -> Self {
        let mut features = Self {
            sched_info,
            ..Self::default()
        };
        for need in needs {
            match need {
                Need::Tracepoint { name, .. } => {
                    if let Some(args) = tracepoint_args(btf, name) {
                        features.tracepoints.insert(name.to_string(), args);
                    }
                }
                Need::Function { name, .. } => {
                    if let Some(params) = function_params(btf, name) {
                        features.functions.insert(name.to_string(), params);
                    }
                }
                Need::Fexit => features.fexit = fexit_attaches(btf),
                Need::TaskStorage => {
                    features.task_storage = task_storage_built(btf);
                    features.task_storage_found_while_busy = task_storage_found_while_busy(btf);
                }
                Need::SchedInfo => {}
                Need::CgroupRstat => features.cgroup_rstat = cgroup_rstat_readable(btf),
                Need::CgroupMemory => features.cgroup_memory = cgroup_memory_readable(btf),
                Need::ProcessRss => features.process_rss = process_rss_readable(btf),
            }
        }
        features
    }
}

/// Whether the kernel has task-local storage: its `bpf_task_storage_get` helper is in the BTF
/// (built with the map type; every program that needs it also needs a 5.18+ tracepoint, long
/// after tracing programs could call it). Not aya's trial map: a task-storage map the kernel
/// refuses is freed at once, behind RCU grace periods, which cost 30 ms of every start and
/// 200 ms of a restart while the last run's maps were still being freed.
fn task_storage_built(btf: &Btf) -> bool {
    btf.named("bpf_task_storage_get", Kind::Func).is_some()
}

/// Whether a tracing program's `bpf_task_storage_get` finds a task's existing storage even
/// while the storage is busy on its CPU: the kernel has `bpf_task_storage_get_recur` (6.2+),
/// which only makes new storage behind the busy check. Before it, the lookup itself failed.
fn task_storage_found_while_busy(btf: &Btf) -> bool {
    btf.named("bpf_task_storage_get_recur", Kind::Func)
        .is_some()
}

/// Whether the kernel has the cgroup iterator (`struct bpf_iter__cgroup`), the helper that
/// reads another CPU's per-CPU map value, and per-CPU cgroup CPU time at fields we can locate.
fn cgroup_rstat_readable(btf: &Btf) -> bool {
    let helper = btf.named("bpf_func_id", Kind::Enum).is_some_and(|ids| {
        ids.enumerators()
            .any(|(name, _)| name == "BPF_FUNC_map_lookup_percpu_elem")
    });
    helper
        && btf.named("bpf_iter__cgroup", Kind::Struct).is_some()
        && super::kernel_btf::rstat_offsets(btf).is_ok()
}

/// Whether the kernel has the cgroup iterator and memory controller counters at fields we can
/// locate (whether cgroup2 has the controller on this host is the loader's to check).
fn cgroup_memory_readable(btf: &Btf) -> bool {
    btf.named("bpf_iter__cgroup", Kind::Struct).is_some()
        && super::kernel_btf::memory_offsets(btf).is_ok_and(|memory| {
            memory.cgroup_memory_css != 0 && memory.memcg_watermark != 0 && memory.memcg_usage != 0
        })
}

/// Whether the kernel has the task iterator and resident-page counters at fields we can locate.
fn process_rss_readable(btf: &Btf) -> bool {
    btf.named("bpf_iter__task", Kind::Struct).is_some()
        && super::kernel_btf::process_offsets(btf).is_ok_and(|process| process.mm_rss_stat != 0)
}

/// Arguments of tracepoint `name` as `tp_btf` programs see them: the parameters of
/// `btf_trace_<name>` (a pointer to a prototype whose first parameter is the tracepoint's
/// `void *` context), minus that context.
fn tracepoint_args(btf: &Btf, name: &str) -> Option<usize> {
    // typedef → pointer → prototype.
    let proto = btf
        .named(&format!("btf_trace_{name}"), Kind::Typedef)?
        .target()?
        .resolved()
        .target()?
        .resolved();
    (proto.kind == Kind::FuncProto).then(|| proto.parameter_names().len().saturating_sub(1))
}

/// Whether a trivial fentry program on `bpf_fentry_test1` loads and attaches: the probe of
/// aya's `is_program_supported(Tracing)`, with the function's id from the BTF already parsed
/// (aya's parses the kernel's BTF again, a tenth of the agent's start).
fn fexit_attaches(btf: &Btf) -> bool {
    use aya_obj::generated::{bpf_attach_type, bpf_attr, bpf_cmd, bpf_prog_type};

    let attach_btf_id = btf
        .named("bpf_fentry_test1", Kind::Func)
        .map_or(0, |func| func.id());
    // r0 = 0; exit.
    let insns: [u64; 2] = [0x0000_0000_0000_00b7, 0x0000_0000_0000_0095];
    let license = c"GPL";
    let mut log = [0u8; 256];
    // SAFETY: an all-zero bpf_attr is the kernel's "unset" for every field.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the program-load member of the union, the one BPF_PROG_LOAD reads.
    let load = unsafe { &mut attr.__bindgen_anon_3 };
    load.prog_type = bpf_prog_type::BPF_PROG_TYPE_TRACING as u32;
    load.expected_attach_type = bpf_attach_type::BPF_TRACE_FENTRY as u32;
    load.insn_cnt = insns.len() as u32;
    load.insns = insns.as_ptr() as u64;
    load.license = license.as_ptr() as u64;
    load.attach_btf_id = attach_btf_id;
    load.log_level = 1;
    load.log_buf = log.as_mut_ptr() as u64;
    load.log_size = log.len() as u32;
    let Ok(prog) = bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr) else {
        // Without the function, a kernel that knows tracing programs says so in the log.
        return attach_btf_id == 0 && log.starts_with(b"Tracing programs must provide btf_id");
    };
    // Loading is not attaching: some kernels cannot make the trampoline (ENOTSUPP).
    // SAFETY: as above.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    attr.raw_tracepoint.prog_fd = prog.as_raw_fd() as u32;
    bpf(bpf_cmd::BPF_RAW_TRACEPOINT_OPEN, &mut attr).is_ok()
}

/// The `bpf(2)` system call for a command that makes a descriptor; the descriptor, closed on
/// drop.
pub(super) fn bpf(
    cmd: aya_obj::generated::bpf_cmd,
    attr: &mut aya_obj::generated::bpf_attr,
) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a whole bpf_attr, its pointers valid for the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr as *mut _,
            std::mem::size_of_val(attr),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a non-negative return of these commands is a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Parameter names of function `name` in the kernel's BTF.
fn function_params(btf: &Btf, name: &str) -> Option<Vec<String>> {
    let proto = btf.named(name, Kind::Func)?.target()?;
    (proto.kind == Kind::FuncProto).then(|| {
        proto
            .parameter_names()
            .into_iter()
            .map(str::to_string)
            .collect()
    })
}

/// The running kernel's release (`uname -r`), for messages and reports.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|text| text.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tracepoint and function the plan may need is found with the same arguments and
    /// parameter names as btf-rs, a full decoder, finds in the running kernel's BTF.
    #[test]
    fn needs_match_a_full_decoders_on_the_running_kernel() {
        use btf_rs::Type as T;
        let bytes = std::fs::read(super::super::kernel_btf::VMLINUX_BTF)
            .expect("the kernel's BTF (the agent needs it)");
        let ours = Btf::parse(&bytes).unwrap();
        let reference = btf_rs::Btf::from_bytes(&bytes).unwrap();
        let chained = |ty: &T| match ty {
            T::Typedef(t) => reference.resolve_chained_type(t).ok(),
            T::Ptr(t) => reference.resolve_chained_type(t).ok(),
            T::Func(t) => reference.resolve_chained_type(t).ok(),
            _ => None,
        };
        let mut found = 0;
        for need in crate::loader::plan::all_needs() {
            match need {
                Need::Tracepoint { name, .. } => {
                    let expected = reference
                        .resolve_types_by_name(&format!("btf_trace_{name}"))
                        .ok()
                        .and_then(|types| {
                            let typedef = types.into_iter().find(|t| matches!(t, T::Typedef(_)))?;
                            match chained(&chained(&typedef)?)? {
                                T::FuncProto(proto) => Some(proto.parameters.len() - 1),
                                _ => None,
                            }
                        });
                    found += usize::from(expected.is_some());
                    assert_eq!(tracepoint_args(&ours, name), expected, "{name}");
                }
                Need::Function { name, .. } => {
                    let expected = reference
                        .resolve_types_by_name(name)
                        .ok()
                        .and_then(|types| {
                            let func = types.into_iter().find(|t| matches!(t, T::Func(_)))?;
                            match chained(&func)? {
                                T::FuncProto(proto) => proto
                                    .parameters
                                    .iter()
                                    .map(|param| reference.resolve_name(param).ok())
                                    .collect::<Option<Vec<String>>>(),
                                _ => None,
                            }
                        });
                    found += usize::from(expected.is_some());
                    assert_eq!(function_params(&ours, name), expected, "{name}");
                }
                _ => {}
            }
        }
        // sched_switch, sched_wakeup_new and more are in every kernel the agent runs on.
        assert!(found >= 5, "only {found} needs found");
    }

    #[test]
    fn busy_storage_is_found_where_the_kernel_has_the_recursion_safe_helper() {
        let bytes = std::fs::read(super::super::kernel_btf::VMLINUX_BTF)
            .expect("the kernel's BTF (the agent needs it)");
        let ours = Btf::parse(&bytes).unwrap();
        // The kernel's own symbol table, not its BTF, says whether the helper is built.
        let symbols = std::fs::read_to_string("/proc/kallsyms").expect("/proc/kallsyms");
        let built = symbols
            .lines()
            .any(|line| line.split_whitespace().nth(2) == Some("bpf_task_storage_get_recur"));
        assert_eq!(task_storage_found_while_busy(&ours), built);
    }

    #[test]
    fn needs_compare_arguments_and_parameter_names() {
        let mut features = KernelFeatures::default();
        features.tracepoints.insert("sched_switch".into(), 3);
        features.functions.insert(
            "sock_sendmsg".into(),
            vec!["sock".to_string(), "msg".to_string()],
        );
        assert!(features.has(&Need::Tracepoint {
            name: "sched_switch",
            args: 3
        }));
        // Before 5.18 sched_switch passed no prev_state.
        assert!(!features.has(&Need::Tracepoint {
            name: "sched_switch",
            args: 4
        }));
        assert!(features.has(&Need::Function {
            name: "sock_sendmsg",
            params: &["sock", "msg"]
        }));
        assert!(!features.has(&Need::Function {
            name: "sock_sendmsg",
            params: &["sock", "msg", "flags"]
        }));
        assert!(!features.has(&Need::Fexit));
    }

    #[test]
    fn missing_needs_name_the_version_that_has_them() {
        let text = Need::Tracepoint {
            name: "sock_send_length",
            args: 3,
        }
        .describe_missing();
        assert!(text.contains("6.3"), "{text}");
        assert!(Need::TaskStorage.describe_missing().contains("5.11"));
    }
}
