//! The one place kernel differences are decided: for each program group the user asked for,
//! the first variant whose needs the running kernel meets, or the reason none does.
//!
//! Pure: a plan is made from [`KernelFeatures`], so every kernel of the matrix can be planned
//! in a unit test. Collect, model and sinks never look at kernel versions: they see the same
//! counters whichever variant fills them, and [`Measured`] for what no variant could.

use super::{
    ProgramGroup,
    features::{KernelFeatures, Need},
};
use crate::model::Measured;

/// How a program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Attach {
    /// `tp_btf` on the named tracepoint.
    TpBtf(&'static str),
    /// `fexit` on the named kernel function.
    FExit(&'static str),
    /// A BPF iterator over the named kind of kernel object, walked at each sample.
    Iter(&'static str),
}

impl Attach {
    /// The attach kind as recorded in pin sets and reports (`tp_btf`, `fexit`).
    pub fn kind(&self) -> &'static str {
        match self {
            Attach::TpBtf(_) => "tp_btf",
            Attach::FExit(_) => "fexit",
            Attach::Iter(_) => "iter",
        }
    }

    /// The tracepoint or function.
    pub fn target(&self) -> &'static str {
        match self {
            Attach::TpBtf(target) | Attach::FExit(target) | Attach::Iter(target) => target,
        }
    }
}

/// One program of the eBPF object and where it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PlannedProgram {
    /// ELF name of the program.
    pub program: &'static str,
    /// Where it is attached.
    pub attach: Attach,
}

/// One way to measure a group.
#[derive(Debug, PartialEq, Eq)]
pub struct Variant {
    /// Short name shown in reports, e.g. `tp_btf sock_*_length`.
    pub name: &'static str,
    /// What the kernel must offer.
    pub needs: &'static [Need],
    /// The programs it attaches.
    pub programs: &'static [PlannedProgram],
    /// Programs that count what this variant's own miss, attached where the kernel allows
    /// them; without them the variant still runs and the notes say what goes uncounted.
    pub extras: &'static [Extra],
}

/// An add-on to a variant.
#[derive(Debug, PartialEq, Eq)]
pub struct Extra {
    /// What it counts, as the subject of a sentence.
    pub counts: &'static str,
    /// What the kernel must offer.
    pub needs: &'static [Need],
    /// The programs it attaches.
    pub programs: &'static [PlannedProgram],
}

/// splice() from a TCP or unix stream socket into a pipe reads through the protocols'
/// `splice_read`, which neither `recvmsg` nor the 6.3 tracepoint sees.
pub const SPLICE_READS: Extra = Extra {
    counts: "bytes read from sockets with splice()",
    needs: &[
        Need::Fexit,
        Need::Function {
            name: "tcp_splice_read",
            params: &["sock", "ppos", "pipe", "len", "flags"],
        },
        Need::Function {
            name: "unix_stream_splice_read",
            params: &["sock", "ppos", "pipe", "size", "flags"],
        },
    ],
    programs: &[
        fexit("sock_rx_tsplice", "tcp_splice_read"),
        fexit("sock_rx_usplice", "unix_stream_splice_read"),
    ],
};

/// Whether an extra of a running variant counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExtraPlan {
    /// Its programs are attached.
    Runs,
    /// Not attached: why, as the end of a sentence.
    Missing(String),
}

const fn tp(program: &'static str, tracepoint: &'static str) -> PlannedProgram {
    PlannedProgram {
        program,
        attach: Attach::TpBtf(tracepoint),
    }
}

const fn fexit(program: &'static str, function: &'static str) -> PlannedProgram {
    PlannedProgram {
        program,
        attach: Attach::FExit(function),
    }
}

/// sched_switch with its `prev_state` argument (5.18+): the switch programs read it.
const SCHED_SWITCH: Need = Need::Tracepoint {
    name: "sched_switch",
    args: 4,
};

/// cgroup_attach_task with its `threadgroup` argument: a moved thread's time until the move
/// stays with the cgroup it left.
const ATTACH_TASK: Need = Need::Tracepoint {
    name: "cgroup_attach_task",
    args: 4,
};

/// The kernel's own per-CPU cgroup CPU time read by a cgroup iterator at each sample: no
/// program on any scheduler event. It has no context switches; the switch variant counts them.
pub const CPU_RSTAT: Variant = Variant {
    name: "iter/cgroup over the kernel's per-CPU cgroup CPU time",
    needs: &[Need::CgroupRstat],
    programs: &[PlannedProgram {
        program: "cpu_rstat",
        attach: Attach::Iter("cgroup"),
    }],
    extras: &[],
};

/// Every cgroup's memory counters (what `memory.current` and `memory.peak` show) read by a
/// cgroup iterator at each sample: one walk instead of two files per worker. Not a group of
/// its own: memory is always read, from the files where the walk cannot run.
pub const MEMORY_WALK: PlannedProgram = PlannedProgram {
    program: "memory_walk",
    attach: Attach::Iter("cgroup"),
};

/// Every process's resident pages summed by cgroup, read by a task iterator at each sample:
/// where the memory walk cannot run, one walk instead of each worker's process list and each
/// process's statm file. Like the memory walk, not a group of its own.
pub const RSS_WALK: PlannedProgram = PlannedProgram {
    program: "rss_walk",
    attach: Attach::Iter("task"),
};

const CPU: &[Variant] = &[
    CPU_RSTAT,
    Variant {
        name: "tp_btf sched_switch, cgroup_attach_task",
        needs: &[SCHED_SWITCH, ATTACH_TASK, Need::TaskStorage],
        programs: &[
            tp("switch_cpu", "sched_switch"),
            tp("moved", "cgroup_attach_task"),
        ],
        extras: &[],
    },
];

const DELAYS: &[Variant] = &[Variant {
    name: "tp_btf sched_switch, cgroup_attach_task",
    needs: &[
        SCHED_SWITCH,
        ATTACH_TASK,
        Need::Tracepoint {
            name: "sched_wakeup_new",
            args: 1,
        },
        Need::TaskStorage,
        Need::SchedInfo,
    ],
    programs: &[
        tp("switch_full", "sched_switch"),
        tp("wakeup_new", "sched_wakeup_new"),
        tp("moved", "cgroup_attach_task"),
    ],
    extras: &[],
}];

const WAITS: &[Variant] = &[Variant {
    name: "tp_btf sched_switch with wait reasons, cgroup_attach_task",
    needs: &[
        SCHED_SWITCH,
        ATTACH_TASK,
        Need::Tracepoint {
            name: "sched_wakeup_new",
            args: 1,
        },
        Need::TaskStorage,
        Need::SchedInfo,
    ],
    programs: &[
        tp("switch_waits", "sched_switch"),
        tp("wakeup_new", "sched_wakeup_new"),
        tp("moved", "cgroup_attach_task"),
    ],
    extras: &[],
}];

/// A variant of fexit on the IPv4, IPv6 and unix protocols' `sendmsg` and `recvmsg`, with
/// more needs and programs after them: those lists are written once for the variants with
/// and without `sendpage`.
macro_rules! sendmsg_variant {
    ($name:literal, [$($need:expr),*], [$($program:expr),*]) => {
        Variant {
            name: $name,
            needs: &[
                Need::Fexit,
                SENDMSG("inet_sendmsg"),
                SENDMSG("inet6_sendmsg"),
                UNIX_STREAM_SENDMSG,
                UNIX_DGRAM_SENDMSG,
                RECVMSG("inet_recvmsg"),
                RECVMSG("inet6_recvmsg"),
                RECVMSG("unix_stream_recvmsg"),
                UNIX_DGRAM_RECVMSG,
                $($need,)*
            ],
            programs: &[
                fexit("sock_tx_inet", "inet_sendmsg"),
                fexit("sock_tx_inet6", "inet6_sendmsg"),
                fexit("sock_tx_ustream", "unix_stream_sendmsg"),
                fexit("sock_tx_udgram", "unix_dgram_sendmsg"),
                fexit("sock_rx_inet", "inet_recvmsg"),
                fexit("sock_rx_inet6", "inet6_recvmsg"),
                fexit("sock_rx_ustream", "unix_stream_recvmsg"),
                fexit("sock_rx_udgram", "__unix_dgram_recvmsg"),
                $($program,)*
            ],
            extras: &[SPLICE_READS],
        }
    };
}

/// The socket-length tracepoints (6.3+) first: cheapest, and every call path but one. Before
/// 6.5 sendfile and splice into a socket take the protocols' `sendpage`, which neither the
/// tracepoints nor the `sendmsg` fexits see: each way comes with fexit on `sendpage` first,
/// and without it where the kernel has no `sendpage` (6.5+) or allows no fexit.
const NET: &[Variant] = &[
    Variant {
        name: "tp_btf sock_send_length, sock_recv_length; fexit on sendpage",
        needs: &[
            SEND_LENGTH,
            RECV_LENGTH,
            Need::Fexit,
            TCP_SENDPAGE,
            UDP_SENDPAGE,
            UNIX_SENDPAGE,
        ],
        programs: &[
            tp("sock_send", "sock_send_length"),
            tp("sock_recv", "sock_recv_length"),
            fexit("sock_tx_tcppage", "tcp_sendpage"),
            fexit("sock_tx_udppage", "udp_sendpage"),
            fexit("sock_tx_upage", "unix_stream_sendpage"),
        ],
        extras: &[SPLICE_READS],
    },
    Variant {
        name: "tp_btf sock_send_length, sock_recv_length",
        needs: &[SEND_LENGTH, RECV_LENGTH],
        programs: &[
            tp("sock_send", "sock_send_length"),
            tp("sock_recv", "sock_recv_length"),
        ],
        extras: &[SPLICE_READS],
    },
    sendmsg_variant!(
        "fexit on inet/inet6/unix sendmsg, recvmsg, sendpage",
        [TCP_SENDPAGE, UDP_SENDPAGE, UNIX_SENDPAGE],
        [
            fexit("sock_tx_tcppage", "tcp_sendpage"),
            fexit("sock_tx_udppage", "udp_sendpage"),
            fexit("sock_tx_upage", "unix_stream_sendpage")
        ]
    ),
    sendmsg_variant!("fexit on inet/inet6/unix sendmsg, recvmsg", [], []),
];

const SEND_LENGTH: Need = Need::Tracepoint {
    name: "sock_send_length",
    args: 3,
};
const RECV_LENGTH: Need = Need::Tracepoint {
    name: "sock_recv_length",
    args: 3,
};
const UNIX_STREAM_SENDMSG: Need = Need::Function {
    name: "unix_stream_sendmsg",
    params: &["sock", "msg", "len"],
};
const UNIX_DGRAM_SENDMSG: Need = Need::Function {
    name: "unix_dgram_sendmsg",
    params: &["sock", "msg", "len"],
};
const UNIX_DGRAM_RECVMSG: Need = Need::Function {
    name: "__unix_dgram_recvmsg",
    params: &["sk", "msg", "size", "flags"],
};
const TCP_SENDPAGE: Need = Need::Function {
    name: "tcp_sendpage",
    params: &["sk", "page", "offset", "size", "flags"],
};
const UDP_SENDPAGE: Need = Need::Function {
    name: "udp_sendpage",
    params: &["sk", "page", "offset", "size", "flags"],
};
const UNIX_SENDPAGE: Need = Need::Function {
    name: "unix_stream_sendpage",
    params: &["socket", "page", "offset", "size", "flags"],
};

/// An IPv4/IPv6 `sendmsg` as the fexit socket programs read it.
#[allow(non_snake_case)]
const fn SENDMSG(name: &'static str) -> Need {
    Need::Function {
        name,
        params: &["sock", "msg", "size"],
    }
}

/// A protocol's `recvmsg` as the fexit socket programs read it.
#[allow(non_snake_case)]
const fn RECVMSG(name: &'static str) -> Need {
    Need::Function {
        name,
        params: &["sock", "msg", "size", "flags"],
    }
}

const LIFECYCLE: &[Variant] = &[Variant {
    name: "tp_btf cgroup_mkdir, cgroup_rmdir, sched_process_exit",
    needs: &[
        Need::Tracepoint {
            name: "cgroup_mkdir",
            args: 2,
        },
        Need::Tracepoint {
            name: "cgroup_rmdir",
            args: 2,
        },
        Need::Tracepoint {
            name: "sched_process_exit",
            args: 1,
        },
    ],
    programs: &[
        tp("cgroup_mkdir", "cgroup_mkdir"),
        tp("cgroup_rmdir", "cgroup_rmdir"),
        tp("process_exit", "sched_process_exit"),
    ],
    extras: &[],
}];

/// Process workers' fork and exec programs; each thread's end comes from the sched_switch
/// programs.
const PROCESSES: &[Variant] = &[Variant {
    name: "tp_btf sched_process_fork, sched_process_exec",
    needs: &[
        Need::Tracepoint {
            name: "sched_process_fork",
            args: 2,
        },
        Need::Tracepoint {
            name: "sched_process_exec",
            args: 3,
        },
    ],
    programs: &[
        tp("proc_fork", "sched_process_fork"),
        tp("proc_exec", "sched_process_exec"),
    ],
    extras: &[EXIT_RSS],
}];

/// A process's resident set as it ends: only where `sched_process_exit` comes before the
/// exiting thread lets go of its memory, which the kernels that moved it there tell by
/// passing `group_dead`.
pub const EXIT_RSS: Extra = Extra {
    counts: "processes' resident sets at their end",
    needs: &[Need::Tracepoint {
        name: "sched_process_exit",
        args: 2,
    }],
    programs: &[tp("proc_exit_rss", "sched_process_exit")],
};

const FLOOR: &[Variant] = &[Variant {
    name: "tp_btf sched_switch (empty)",
    needs: &[Need::Tracepoint {
        name: "sched_switch",
        args: 0,
    }],
    programs: &[tp("switch_floor", "sched_switch")],
    extras: &[],
}];

const LEAST: &[Variant] = &[Variant {
    name: "tp_btf sched_switch (least per-task accounting)",
    needs: &[Need::Tracepoint {
        name: "sched_switch",
        args: 3,
    }],
    programs: &[tp("switch_least", "sched_switch")],
    extras: &[],
}];

/// The variants of a group, best first.
pub fn variants(group: ProgramGroup) -> &'static [Variant] {
    match group {
        ProgramGroup::Cpu => CPU,
        ProgramGroup::Delays => DELAYS,
        ProgramGroup::Net => NET,
        ProgramGroup::Lifecycle => LIFECYCLE,
        // Kept by the socket programs: no programs of its own.
        ProgramGroup::Endpoints => &[],
        ProgramGroup::Waits => WAITS,
        ProgramGroup::Floor => FLOOR,
        ProgramGroup::Least => LEAST,
        ProgramGroup::Processes => PROCESSES,
    }
}

/// Every need of every variant: what [`KernelFeatures::probe`] must look at.
pub fn all_needs() -> Vec<Need> {
    let mut needs: Vec<Need> = [
        ProgramGroup::Cpu,
        ProgramGroup::Delays,
        ProgramGroup::Net,
        ProgramGroup::Lifecycle,
        ProgramGroup::Floor,
        ProgramGroup::Least,
        ProgramGroup::Waits,
        ProgramGroup::Processes,
    ]
    .into_iter()
    .flat_map(variants)
    .flat_map(|variant| {
        let extras = variant.extras.iter().flat_map(|extra| extra.needs.iter());
        variant.needs.iter().chain(extras).copied()
    })
    .collect();
    needs.push(Need::CgroupMemory);
    needs.push(Need::ProcessRss);
    needs.sort_unstable();
    needs.dedup();
    needs
}

/// How one group is measured on this kernel.
#[derive(Debug, PartialEq, Eq)]
pub enum GroupPlan {
    /// By this variant's programs.
    Runs(&'static Variant),
    /// By another group's programs (CPU time by the delays programs' sched_switch).
    Within(ProgramGroup),
    /// Not at all: why each variant cannot run, as ends of a sentence.
    Missing(Vec<String>),
}

/// What to attach for the groups asked for.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// Each asked-for group, in a fixed order, and how it is measured.
    pub groups: Vec<(ProgramGroup, GroupPlan)>,
    /// The extras of the running variants, and whether each runs.
    pub extras: Vec<(ProgramGroup, &'static Extra, ExtraPlan)>,
    /// Whether memory is read by [`MEMORY_WALK`] (else from each worker's files).
    pub memory_walk: bool,
    /// Whether processes' resident sets are read by [`RSS_WALK`] (else from each process's
    /// statm file). The loader asks for it only where workers have no memory files.
    pub rss_walk: bool,
    /// What the plan was made from, to fall back when the kernel refuses a variant.
    features: KernelFeatures,
}

impl Plan {
    /// Chooses, for each group in `asked`, the first variant `features` allows.
    pub fn new(asked: &[ProgramGroup], features: &KernelFeatures) -> Self {
        let mut asked = asked.to_vec();
        asked.sort_unstable();
        asked.dedup();
        let choose = |group: ProgramGroup| choose(group, features, 0, Vec::new());
        let runs = |group: ProgramGroup| {
            asked.contains(&group) && matches!(choose(group), GroupPlan::Runs(_))
        };
        let (waits_run, delays_run) = (runs(ProgramGroup::Waits), runs(ProgramGroup::Delays));
        let processes_asked = asked.contains(&ProgramGroup::Processes);
        let net_runs = asked.contains(&ProgramGroup::Net)
            && matches!(choose(ProgramGroup::Net), GroupPlan::Runs(_));
        let groups = asked
            .into_iter()
            .map(|group| {
                // The delays programs' sched_switch does the CPU accounting too: one switch
                // program at a time.
                // One sched_switch program at a time: the most complete one asked for.
                let plan = match group {
                    ProgramGroup::Cpu | ProgramGroup::Delays if waits_run => {
                        GroupPlan::Within(ProgramGroup::Waits)
                    }
                    ProgramGroup::Cpu if delays_run => GroupPlan::Within(ProgramGroup::Delays),
                    // Process workers' threads end in the switch programs.
                    ProgramGroup::Cpu if processes_asked => after_rstat(features),
                    ProgramGroup::Endpoints if net_runs => GroupPlan::Within(ProgramGroup::Net),
                    ProgramGroup::Endpoints => GroupPlan::Missing(vec![
                        "socket bytes (--programs net), whose programs keep them".into(),
                    ]),
                    _ => choose(group),
                };
                (group, plan)
            })
            .collect();
        let mut plan = Self {
            groups,
            extras: Vec::new(),
            memory_walk: features.has(&Need::CgroupMemory),
            rss_walk: features.has(&Need::ProcessRss),
            features: features.clone(),
        };
        plan.choose_extras();
        plan
    }

    /// A plan as recorded by a pin set: what ran when it was made, and the extras (by what
    /// they count) that ran with it.
    pub fn recorded(groups: Vec<(ProgramGroup, GroupPlan)>, extras_running: &[String]) -> Self {
        let extras = running_variants(&groups)
            .flat_map(|(group, variant)| variant.extras.iter().map(move |extra| (group, extra)))
            .map(|(group, extra)| {
                let plan = if extras_running.iter().any(|counts| counts == extra.counts) {
                    ExtraPlan::Runs
                } else {
                    ExtraPlan::Missing("the agent that made the pin set to have attached it".into())
                };
                (group, extra, plan)
            })
            .collect();
        Self {
            groups,
            extras,
            memory_walk: false,
            rss_walk: false,
            features: KernelFeatures::default(),
        }
    }

    /// Plans the extras of the running variants from the features (keeping a refusal).
    fn choose_extras(&mut self) {
        let before = std::mem::take(&mut self.extras);
        self.extras = running_variants(&self.groups)
            .flat_map(|(group, variant)| variant.extras.iter().map(move |extra| (group, extra)))
            .map(|(group, extra)| {
                let refused = before.iter().find_map(|(_, e, plan)| match plan {
                    ExtraPlan::Missing(reason) if e.counts == extra.counts => Some(reason.clone()),
                    _ => None,
                });
                let plan = match (refused, extra.needs.iter().find(|n| !self.features.has(n))) {
                    (Some(reason), _) => ExtraPlan::Missing(reason),
                    (None, Some(unmet)) => ExtraPlan::Missing(unmet.describe_missing()),
                    (None, None) => ExtraPlan::Runs,
                };
                (group, extra, plan)
            })
            .collect();
    }

    /// The kernel refused a program of an extra (`reason`, the end of a sentence): the extra
    /// is left out, its group runs on. Returns the extra's programs, or `None` when `program`
    /// belongs to no extra.
    pub fn refuse_extra(
        &mut self,
        program: &str,
        reason: String,
    ) -> Option<&'static [PlannedProgram]> {
        let (_, extra, plan) = self
            .extras
            .iter_mut()
            .find(|(_, extra, _)| extra.programs.iter().any(|p| p.program == program))?;
        *plan = ExtraPlan::Missing(reason);
        Some(extra.programs)
    }

    /// Whether the extra runs.
    pub fn extra_runs(&self, extra: &Extra) -> bool {
        self.extras
            .iter()
            .any(|(_, e, plan)| e.counts == extra.counts && *plan == ExtraPlan::Runs)
    }

    /// The programs to attach, each once.
    pub fn programs(&self) -> Vec<PlannedProgram> {
        let mut programs: Vec<PlannedProgram> = self
            .groups
            .iter()
            .filter_map(|(_, plan)| match plan {
                GroupPlan::Runs(variant) => Some(variant.programs.iter().copied()),
                _ => None,
            })
            .flatten()
            .chain(
                self.extras
                    .iter()
                    .filter(|(_, _, plan)| *plan == ExtraPlan::Runs)
                    .flat_map(|(_, extra, _)| extra.programs.iter().copied()),
            )
            .collect();
        programs.sort_unstable();
        programs.dedup();
        programs
    }

    /// The memory walk's program, when memory is read by it.
    pub fn memory_walk(&self) -> Option<PlannedProgram> {
        self.memory_walk.then_some(MEMORY_WALK)
    }

    /// The process walk's program, when processes' resident sets are read by it.
    pub fn rss_walk(&self) -> Option<PlannedProgram> {
        self.rss_walk.then_some(RSS_WALK)
    }

    /// Whether CPU time is read from the kernel's per-cgroup accounting by the iterator.
    pub fn cpu_from_rstat(&self) -> bool {
        self.groups.iter().any(|(group, plan)| {
            *group == ProgramGroup::Cpu
                && matches!(plan, GroupPlan::Runs(variant) if variant.name == CPU_RSTAT.name)
        })
    }

    /// Which measurements the attached programs make.
    pub fn measured(&self) -> Measured {
        let runs = |group: ProgramGroup| {
            self.groups
                .iter()
                .any(|(g, plan)| *g == group && !matches!(plan, GroupPlan::Missing(_)))
        };
        Measured {
            cpu: runs(ProgramGroup::Cpu) || runs(ProgramGroup::Delays) || runs(ProgramGroup::Waits),
            switches: (runs(ProgramGroup::Cpu) && !self.cpu_from_rstat())
                || runs(ProgramGroup::Delays)
                || runs(ProgramGroup::Waits),
            delays: runs(ProgramGroup::Delays) || runs(ProgramGroup::Waits),
            waits: runs(ProgramGroup::Waits),
            net: runs(ProgramGroup::Net),
            lifecycle: runs(ProgramGroup::Lifecycle),
            endpoints: runs(ProgramGroup::Endpoints) && runs(ProgramGroup::Net),
            splice_reads: runs(ProgramGroup::Net) && self.extra_runs(&SPLICE_READS),
            exit_rss: runs(ProgramGroup::Processes) && self.extra_runs(&EXIT_RSS),
        }
    }

    /// The kernel refused `group`'s variant (`reason`, the end of a sentence): the group
    /// falls back to its next variant the kernel allows, or is missing. CPU time measured
    /// within the delays programs falls back with them.
    pub fn fall_back(&mut self, group: ProgramGroup, reason: String) {
        let features = self.features.clone();
        for (g, plan) in &mut self.groups {
            if *g != group {
                continue;
            }
            let GroupPlan::Runs(failed) = plan else {
                continue;
            };
            let next = variants(group)
                .iter()
                .position(|variant| std::ptr::eq(variant, *failed))
                .map_or(usize::MAX, |at| at + 1);
            *plan = choose(group, &features, next, vec![reason.clone()]);
        }
        // Groups measured within the one that fell back are planned again on their own.
        if matches!(group, ProgramGroup::Delays | ProgramGroup::Waits) {
            // Delays first: CPU goes within them if they now run.
            for (g, plan) in &mut self.groups {
                if *g == ProgramGroup::Delays && *plan == GroupPlan::Within(group) {
                    *plan = choose(*g, &features, 0, Vec::new());
                }
            }
            let delays_runs = self
                .groups
                .iter()
                .any(|(g, plan)| *g == ProgramGroup::Delays && matches!(plan, GroupPlan::Runs(_)));
            let processes_asked = self
                .groups
                .iter()
                .any(|(g, _)| *g == ProgramGroup::Processes);
            for (g, plan) in &mut self.groups {
                if *g == ProgramGroup::Cpu && *plan == GroupPlan::Within(group) {
                    *plan = if delays_runs {
                        GroupPlan::Within(ProgramGroup::Delays)
                    } else if processes_asked {
                        after_rstat(&features)
                    } else {
                        choose(*g, &features, 0, Vec::new())
                    };
                }
            }
        }
        // Endpoints ride on the socket programs: whatever these fall back to keeps them, but
        // not their absence.
        let net_runs = self
            .groups
            .iter()
            .any(|(g, plan)| *g == ProgramGroup::Net && matches!(plan, GroupPlan::Runs(_)));
        for (g, plan) in &mut self.groups {
            if *g == ProgramGroup::Endpoints && !net_runs {
                *plan = GroupPlan::Missing(vec!["socket bytes, whose programs keep them".into()]);
            }
        }
        self.choose_extras();
    }

    /// Whether any program is attached at all.
    pub fn runs_anything(&self) -> bool {
        !self.programs().is_empty()
    }

    /// One sentence per group that is not measured, for the user (endpoints go unsaid when
    /// socket bytes, which keep them, are missing too).
    pub fn notes(&self, kernel_release: &str) -> Vec<String> {
        let net_missing = self
            .groups
            .iter()
            .any(|(g, plan)| *g == ProgramGroup::Net && matches!(plan, GroupPlan::Missing(_)));
        self.groups
            .iter()
            .filter(|(group, _)| !(*group == ProgramGroup::Endpoints && net_missing))
            .filter_map(|(group, plan)| match plan {
                GroupPlan::Missing(needs) => Some(format!(
                    "{} {} not measured on Linux {kernel_release}: it needs {}; the other measurements run",
                    group_description(*group),
                    if matches!(group, ProgramGroup::Net | ProgramGroup::Delays | ProgramGroup::Endpoints) { "are" } else { "is" },
                    needs.join(" or "),
                )),
                _ => None,
            })
            .chain(self.extras.iter().filter_map(|(_, extra, plan)| match plan {
                ExtraPlan::Missing(reason) => Some(format!(
                    "{} are not counted on Linux {kernel_release}: that needs {reason}; the other measurements run",
                    extra.counts,
                )),
                ExtraPlan::Runs => None,
            }))
            .collect()
    }

    /// `group → variant name` for every group that runs, `None` where it is missing.
    pub fn summary(&self) -> Vec<(ProgramGroup, Option<&'static str>)> {
        self.groups
            .iter()
            .map(|(group, plan)| {
                let name = match plan {
                    GroupPlan::Runs(variant) => Some(variant.name),
                    GroupPlan::Within(ProgramGroup::Net) => Some("within the socket programs"),
                    GroupPlan::Within(ProgramGroup::Waits) => Some("within waits' sched_switch"),
                    GroupPlan::Within(_) => Some("within delays' sched_switch"),
                    GroupPlan::Missing(_) => None,
                };
                (*group, name)
            })
            .collect()
    }

    /// The group a program belongs to.
    pub fn group_of(&self, program: &str) -> Option<ProgramGroup> {
        self.groups.iter().find_map(|(group, plan)| match plan {
            GroupPlan::Runs(variant) if variant.programs.iter().any(|p| p.program == program) => {
                Some(*group)
            }
            _ => None,
        })
    }
}

/// CPU time by the first variant after the iterator's that `features` allows.
fn after_rstat(features: &KernelFeatures) -> GroupPlan {
    choose(ProgramGroup::Cpu, features, 1, Vec::new())
}

/// The variants that run, with their groups.
fn running_variants(
    groups: &[(ProgramGroup, GroupPlan)],
) -> impl Iterator<Item = (ProgramGroup, &'static Variant)> + '_ {
    groups.iter().filter_map(|(group, plan)| match plan {
        GroupPlan::Runs(variant) => Some((*group, *variant)),
        _ => None,
    })
}

/// The first variant of `group` from index `from` whose needs `features` meets; otherwise
/// missing, with `reasons` and each later variant's first unmet need.
fn choose(
    group: ProgramGroup,
    features: &KernelFeatures,
    from: usize,
    mut reasons: Vec<String>,
) -> GroupPlan {
    for variant in variants(group).iter().skip(from) {
        match variant.needs.iter().find(|need| !features.has(need)) {
            None => return GroupPlan::Runs(variant),
            Some(unmet) => reasons.push(unmet.describe_missing()),
        }
    }
    GroupPlan::Missing(reasons)
}

/// How a group is named to users.
fn group_description(group: ProgramGroup) -> &'static str {
    match group {
        ProgramGroup::Cpu => "CPU time (--programs cpu)",
        ProgramGroup::Delays => "run-queue, I/O and sleep times (--programs delays)",
        ProgramGroup::Net => "socket bytes (--programs net)",
        ProgramGroup::Lifecycle => "the end of each worker (--programs workers)",
        ProgramGroup::Endpoints => "bytes and waits per remote endpoint (--programs endpoints)",
        ProgramGroup::Waits => "what each sleep waited on (--programs waits)",
        ProgramGroup::Floor => "the empty benchmark program",
        ProgramGroup::Least => "the least-accounting benchmark program",
        ProgramGroup::Processes => "process workers (watch --processes)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Features of Debian's 6.1 kernel as probed there: no socket-length tracepoints, fexit.
    fn linux_6_1() -> KernelFeatures {
        let mut features = KernelFeatures {
            fexit: true,
            task_storage: true,
            sched_info: true,
            cgroup_rstat: true,
            cgroup_memory: true,
            process_rss: true,
            ..KernelFeatures::default()
        };
        for (name, args) in [
            ("sched_switch", 4),
            ("sched_wakeup_new", 1),
            ("cgroup_mkdir", 2),
            ("cgroup_rmdir", 2),
            ("sched_process_exit", 1),
            ("cgroup_attach_task", 4),
        ] {
            features.tracepoints.insert(name.into(), args);
        }
        // Every function of the fexit variant with sendpage, and of the splice reads.
        for need in variants(ProgramGroup::Net)[2]
            .needs
            .iter()
            .chain(SPLICE_READS.needs)
        {
            if let Need::Function { name, params } = need {
                features.functions.insert(
                    name.to_string(),
                    params.iter().map(|p| p.to_string()).collect(),
                );
            }
        }
        features
    }

    fn names(plan: &Plan) -> Vec<&'static str> {
        plan.programs().iter().map(|p| p.program).collect()
    }

    #[test]
    fn cpu_alone_is_read_by_the_iterator_where_the_kernel_has_it() {
        let cpu_alone = Plan::new(&[ProgramGroup::Cpu, ProgramGroup::Lifecycle], &linux_6_1());
        assert!(cpu_alone.cpu_from_rstat());
        assert!(!names(&cpu_alone).iter().any(|p| p.starts_with("switch_")));
        let measured = cpu_alone.measured();
        assert!(measured.cpu && !measured.switches);
        // With delays their switch program counts CPU time and switches too.
        let with_delays = Plan::new(&[ProgramGroup::Cpu, ProgramGroup::Delays], &linux_6_1());
        assert!(!with_delays.cpu_from_rstat());
        assert!(with_delays.measured().switches);
        // Process workers' threads end in the switch program.
        let processes = Plan::new(&[ProgramGroup::Cpu, ProgramGroup::Processes], &linux_6_1());
        assert!(names(&processes).contains(&"switch_cpu"));
        // Without the iterator: the switch program.
        let old = KernelFeatures {
            cgroup_rstat: false,
            ..linux_6_1()
        };
        let fallback = Plan::new(&[ProgramGroup::Cpu], &old);
        assert_eq!(names(&fallback), ["moved", "switch_cpu"]);
        assert!(fallback.measured().switches);
        // A refused iterator falls back to it too.
        let mut refused = Plan::new(&[ProgramGroup::Cpu], &linux_6_1());
        refused.fall_back(ProgramGroup::Cpu, "a reason".into());
        assert_eq!(names(&refused), ["moved", "switch_cpu"]);
    }

    #[test]
    fn memory_is_read_by_the_walk_where_the_kernel_and_cgroup2_allow() {
        let every_group = Plan::new(&ProgramGroup::DEFAULT, &linux_6_1());
        assert_eq!(every_group.memory_walk(), Some(MEMORY_WALK));
        // Not a group: it is no program of any, and alone it is nothing to measure.
        assert!(!every_group.programs().contains(&MEMORY_WALK));
        // No iterator, or v1 holding the memory controller (the loader's check): the files.
        let without = KernelFeatures {
            cgroup_memory: false,
            ..linux_6_1()
        };
        assert_eq!(
            Plan::new(&ProgramGroup::DEFAULT, &without).memory_walk(),
            None
        );
        // A pin set's recorded plan has no iterator.
        assert_eq!(Plan::recorded(Vec::new(), &[]).memory_walk(), None);
    }

    #[test]
    fn resident_sets_are_read_by_the_process_walk_where_the_kernel_has_it() {
        let mut plan = Plan::new(&ProgramGroup::DEFAULT, &linux_6_1());
        assert_eq!(plan.rss_walk(), Some(RSS_WALK));
        // Not a group either.
        assert!(!plan.programs().contains(&RSS_WALK));
        let without = KernelFeatures {
            process_rss: false,
            ..linux_6_1()
        };
        plan = Plan::new(&ProgramGroup::DEFAULT, &without);
        assert_eq!(plan.rss_walk(), None);
        assert_eq!(Plan::recorded(Vec::new(), &[]).rss_walk(), None);
    }

    /// 6.1's features less the protocols' `sendpage`, which 6.5 removed.
    fn without_sendpage(mut features: KernelFeatures) -> KernelFeatures {
        for name in ["tcp_sendpage", "udp_sendpage", "unix_stream_sendpage"] {
            features.functions.remove(name);
        }
        features
    }

    #[test]
    fn socket_lengths_where_the_tracepoints_exist() {
        let mut features = without_sendpage(linux_6_1());
        features.tracepoints.insert("sock_send_length".into(), 3);
        features.tracepoints.insert("sock_recv_length".into(), 3);
        // 6.3 and 6.4: the tracepoints, and sendpage still beside them.
        let with_sendpage = {
            let mut features = features.clone();
            features.functions.extend(linux_6_1().functions);
            Plan::new(&ProgramGroup::DEFAULT, &features)
        };
        assert!(names(&with_sendpage).contains(&"sock_send"));
        assert!(names(&with_sendpage).contains(&"sock_tx_tcppage"));
        assert!(!names(&with_sendpage).contains(&"sock_tx_inet"));
        let plan = Plan::new(&ProgramGroup::DEFAULT, &features);
        assert_eq!(
            names(&plan),
            [
                "cgroup_mkdir",
                "cgroup_rmdir",
                "moved",
                "process_exit",
                "sock_recv",
                "sock_rx_tsplice",
                "sock_rx_usplice",
                "sock_send",
                "switch_waits",
                "wakeup_new"
            ]
        );
        assert!(plan.notes("6.12").is_empty());
        // Process workers not asked for: nor their resident sets.
        assert_eq!(
            plan.measured(),
            Measured {
                exit_rss: false,
                ..Measured::default()
            }
        );
    }

    #[test]
    fn resident_sets_at_the_end_only_where_the_exit_tracepoint_comes_in_time() {
        let mut features = linux_6_1();
        features.tracepoints.insert("sched_process_fork".into(), 2);
        features.tracepoints.insert("sched_process_exec".into(), 3);
        // 6.1 to 6.14: sched_process_exit(p), after the memory is released.
        let plan = Plan::new(&[ProgramGroup::Processes], &features);
        assert!(!names(&plan).contains(&"proc_exit_rss"));
        assert!(!plan.measured().exit_rss);
        let notes = plan.notes("6.12");
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("resident sets") && notes[0].contains("group_dead"));
        // Later kernels: sched_process_exit(p, group_dead), before it.
        features.tracepoints.insert("sched_process_exit".into(), 2);
        let plan = Plan::new(&[ProgramGroup::Processes], &features);
        assert!(names(&plan).contains(&"proc_exit_rss"));
        assert!(plan.measured().exit_rss);
        assert!(plan.notes("6.18").is_empty());
    }

    #[test]
    fn splice_reads_are_an_extra_that_goes_alone() {
        // Without fexit (this host): the tracepoints count, splice reads are said to be not.
        let mut features = without_sendpage(linux_6_1());
        features.tracepoints.insert("sock_send_length".into(), 3);
        features.tracepoints.insert("sock_recv_length".into(), 3);
        let mut no_fexit = features.clone();
        no_fexit.fexit = false;
        let plan = Plan::new(&ProgramGroup::DEFAULT, &no_fexit);
        assert!(names(&plan).contains(&"sock_recv"));
        assert!(!names(&plan).contains(&"sock_rx_tsplice"));
        let measured = plan.measured();
        assert!(measured.net && !measured.splice_reads);
        let notes = plan.notes("6.18");
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].starts_with("bytes read from sockets with splice() are not counted on Linux 6.18: that needs fexit"),
            "{}",
            notes[0]
        );
        // Refused at attach: the extra goes, the group stays; a later fallback keeps it out.
        let mut plan = Plan::new(&ProgramGroup::DEFAULT, &features);
        assert!(plan.measured().splice_reads);
        let programs = plan.refuse_extra("sock_rx_usplice", "refused".into());
        assert_eq!(programs, Some(SPLICE_READS.programs));
        assert!(plan.measured().net && !plan.measured().splice_reads);
        assert!(!names(&plan).contains(&"sock_rx_tsplice"));
        assert_eq!(plan.refuse_extra("sock_recv", "no".into()), None);
        plan.fall_back(ProgramGroup::Net, "refused".into());
        assert!(names(&plan).contains(&"sock_tx_inet"));
        assert!(!plan.measured().splice_reads);
        // The group gone, its extra goes unsaid.
        plan.fall_back(ProgramGroup::Net, "no".into());
        assert!(plan.extras.is_empty());
        // A pin set's plan keeps what it recorded.
        let recorded = Plan::recorded(
            vec![(
                ProgramGroup::Net,
                GroupPlan::Runs(&variants(ProgramGroup::Net)[1]),
            )],
            &[SPLICE_READS.counts.to_string()],
        );
        assert!(recorded.measured().splice_reads);
    }

    #[test]
    fn fexit_on_sock_sendmsg_before_6_3() {
        let plan = Plan::new(&ProgramGroup::DEFAULT, &linux_6_1());
        let programs = plan.programs();
        assert!(programs.contains(&fexit("sock_tx_inet", "inet_sendmsg")));
        assert!(programs.contains(&fexit("sock_rx_udgram", "__unix_dgram_recvmsg")));
        assert!(programs.contains(&fexit("sock_tx_tcppage", "tcp_sendpage")));
        assert!(programs.contains(&fexit("sock_tx_upage", "unix_stream_sendpage")));
        assert!(!names(&plan).contains(&"sock_send"));
        assert!(plan.measured().net);
        // The sendmsg fexits alone where sendpage is gone (a 6.5+ kernel made to use them).
        let plan = Plan::new(&ProgramGroup::DEFAULT, &without_sendpage(linux_6_1()));
        assert!(names(&plan).contains(&"sock_tx_inet"));
        assert!(!names(&plan).contains(&"sock_tx_tcppage"));
    }

    #[test]
    fn without_either_net_is_missing_with_one_sentence_and_the_rest_runs() {
        let mut features = linux_6_1();
        features.fexit = false;
        let plan = Plan::new(&ProgramGroup::DEFAULT, &features);
        let notes = plan.notes("6.1.0");
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].starts_with("socket bytes"), "{}", notes[0]);
        assert!(
            notes[0].contains("6.3") && notes[0].contains("fexit"),
            "{}",
            notes[0]
        );
        let measured = plan.measured();
        assert!(!measured.net && measured.cpu && measured.delays && measured.lifecycle);
        assert!(names(&plan).contains(&"switch_waits"));
    }

    #[test]
    fn one_switch_program_at_a_time() {
        let features = linux_6_1();
        // CPU time alone needs no switch program where the kernel has the cgroup iterator.
        assert_eq!(
            names(&Plan::new(&[ProgramGroup::Cpu], &features)),
            ["cpu_rstat"]
        );
        assert_eq!(
            names(&Plan::new(
                &[ProgramGroup::Cpu, ProgramGroup::Delays],
                &features
            )),
            ["moved", "switch_full", "wakeup_new"]
        );
        // Without run-queue accounting CPU time is measured on its own.
        let mut no_sched_info = features.clone();
        no_sched_info.sched_info = false;
        let plan = Plan::new(&[ProgramGroup::Cpu, ProgramGroup::Delays], &no_sched_info);
        assert_eq!(names(&plan), ["cpu_rstat"]);
        assert!(plan.measured().cpu && !plan.measured().delays);
        no_sched_info.cgroup_rstat = false;
        let plan = Plan::new(&[ProgramGroup::Cpu, ProgramGroup::Delays], &no_sched_info);
        assert_eq!(names(&plan), ["moved", "switch_cpu"]);
        assert_eq!(
            names(&Plan::new(&[ProgramGroup::Floor], &features)),
            ["switch_floor"]
        );
        assert_eq!(
            names(&Plan::new(&[ProgramGroup::Least], &features)),
            ["switch_least"]
        );
    }

    #[test]
    fn an_old_sched_switch_leaves_cpu_out() {
        // 5.15: sched_switch without prev_state, and no cgroup iterator (6.1+).
        let mut features = linux_6_1();
        features.tracepoints.insert("sched_switch".into(), 3);
        features.cgroup_rstat = false;
        let plan = Plan::new(&ProgramGroup::DEFAULT, &features);
        let measured = plan.measured();
        assert!(!measured.cpu && !measured.delays && measured.net);
        assert!(
            plan.notes("5.15").iter().any(|note| note.contains("5.18")),
            "{:?}",
            plan.notes("5.15")
        );
    }

    #[test]
    fn a_refused_variant_falls_back_to_the_next() {
        let mut features = without_sendpage(linux_6_1());
        features.tracepoints.insert("sock_send_length".into(), 3);
        features.tracepoints.insert("sock_recv_length".into(), 3);
        let mut plan = Plan::new(&ProgramGroup::DEFAULT, &features);
        plan.fall_back(ProgramGroup::Net, "refused".into());
        assert!(names(&plan).contains(&"sock_tx_inet"));
        plan.fall_back(ProgramGroup::Net, "fexit refused too".into());
        assert!(!plan.measured().net);
        assert!(plan.notes("x")[0].contains("fexit refused too"));
        // Without the wait reasons' program, the delays' own; without that, CPU's.
        plan.fall_back(ProgramGroup::Waits, "no".into());
        assert_eq!(
            names(&plan),
            [
                "cgroup_mkdir",
                "cgroup_rmdir",
                "moved",
                "process_exit",
                "switch_full",
                "wakeup_new"
            ]
        );
        assert!(plan.measured().delays && !plan.measured().waits);
        plan.fall_back(ProgramGroup::Delays, "no".into());
        assert_eq!(
            names(&plan),
            ["cgroup_mkdir", "cgroup_rmdir", "cpu_rstat", "process_exit"]
        );
    }

    #[test]
    fn every_need_is_probed() {
        let needs = all_needs();
        assert!(needs.contains(&Need::Fexit));
        assert!(needs.contains(&Need::TaskStorage));
    }
}
