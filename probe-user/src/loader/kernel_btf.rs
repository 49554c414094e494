//! Struct member offsets read from the running kernel's BTF.
//!
//! Rust eBPF has no CO-RE relocations, so every struct field the programs read is located here
//! at load time and handed to them as a read-only global.

use anyhow::{anyhow, bail, ensure};
use probe_common::{
    memory::MemoryOffsets,
    process::ProcessOffsets,
    rstat::CPUTIME_WORDS,
    task::{CpuGroupOffsets, SchedInfoOffsets, TaskOffsets, WaitOffsets},
};

use super::btf_reader::{BtfReader as Btf, Kind, Type};

/// Where the kernel's BTF lives.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Byte offset of `skc_family` in `struct sock` (through `__sk_common`).
pub fn sock_family_offset(btf: &Btf) -> anyhow::Result<u32> {
    member_offset(btf, "sock", &["__sk_common", "skc_family"])
}

/// Where `struct sock` keeps its peer: address (IPv4, IPv6) and port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockPeerOffsets {
    /// `__sk_common.skc_daddr`.
    pub daddr: u32,
    /// `__sk_common.skc_dport`.
    pub dport: u32,
    /// `__sk_common.skc_v6_daddr`.
    pub v6_daddr: u32,
}

/// The offsets of a socket's peer address and port.
pub fn sock_peer_offsets(btf: &Btf) -> anyhow::Result<SockPeerOffsets> {
    Ok(SockPeerOffsets {
        daddr: member_offset(btf, "sock", &["__sk_common", "skc_daddr"])?,
        dport: member_offset(btf, "sock", &["__sk_common", "skc_dport"])?,
        v6_daddr: member_offset(btf, "sock", &["__sk_common", "skc_v6_daddr"])?,
    })
}

/// Byte offset of `sk` in `struct socket` (what the fexit socket programs receive).
pub fn socket_sk_offset(btf: &Btf) -> anyhow::Result<u32> {
    member_offset(btf, "socket", &["sk"])
}

/// Offsets of the task, css_set, cgroup and kernfs_node fields the programs read.
pub fn task_offsets(btf: &Btf) -> anyhow::Result<TaskOffsets> {
    Ok(TaskOffsets {
        sum_exec_runtime: member_offset(btf, "task_struct", &["se", "sum_exec_runtime"])?,
        prev_sum_exec_runtime: member_offset(btf, "task_struct", &["se", "prev_sum_exec_runtime"])?,
        policy: member_offset(btf, "task_struct", &["policy"])?,
        // Only with CONFIG_CGROUP_SCHED; without it no move goes through a cpu controller.
        cpu_group: cpu_group_offsets(btf).ok(),
        pid: member_offset(btf, "task_struct", &["pid"])?,
        cgroups: member_offset(btf, "task_struct", &["cgroups"])?,
        // Only with CONFIG_SCHED_INFO; without it the delays cannot be measured.
        sched_info: sched_info_offsets(btf).ok(),
        css_set_dfl_cgrp: member_offset(btf, "css_set", &["dfl_cgrp"])?,
        cgroup_kn: member_offset(btf, "cgroup", &["kn"])?,
        kernfs_node_id: member_offset(btf, "kernfs_node", &["id"])?,
        cgroup_root: member_offset(btf, "cgroup", &["root"])?,
        cgroup_root_hierarchy_id: member_offset(btf, "cgroup_root", &["hierarchy_id"])?,
        utime: member_offset(btf, "task_struct", &["utime"])?,
        stime: member_offset(btf, "task_struct", &["stime"])?,
        tgid: member_offset(btf, "task_struct", &["tgid"])?,
    })
}

/// Where the task's cpu controller group is, and the cgroup of that group.
fn cpu_group_offsets(btf: &Btf) -> anyhow::Result<CpuGroupOffsets> {
    Ok(CpuGroupOffsets {
        sched_task_group: member_offset(btf, "task_struct", &["sched_task_group"])?,
        task_group_css_cgroup: member_offset(btf, "task_group", &["css", "cgroup"])?,
    })
}

/// Offsets the wait reasons read: task flags and files, the file table, a file's inode mode,
/// and the system call registers.
pub fn wait_offsets(btf: &Btf) -> anyhow::Result<WaitOffsets> {
    Ok(WaitOffsets {
        task_flags: member_offset(btf, "task_struct", &["flags"])?,
        task_files: member_offset(btf, "task_struct", &["files"])?,
        files_fdt: member_offset(btf, "files_struct", &["fdt"])?,
        fdtable_max_fds: member_offset(btf, "fdtable", &["max_fds"])?,
        fdtable_fd: member_offset(btf, "fdtable", &["fd"])?,
        file_f_inode: member_offset(btf, "file", &["f_inode"])?,
        inode_i_mode: member_offset(btf, "inode", &["i_mode"])?,
        pt_regs_orig_ax: member_offset(btf, "pt_regs", &["orig_ax"])?,
        pt_regs_di: member_offset(btf, "pt_regs", &["di"])?,
    })
}

/// What the process programs read: a thread's start, exit code, context switches and name,
/// and where its program's arguments are.
pub fn process_offsets(btf: &Btf) -> anyhow::Result<ProcessOffsets> {
    let task = |name| member_offset(btf, "task_struct", &[name]);
    Ok(ProcessOffsets {
        task_start_time: task("start_time")?,
        task_exit_code: task("exit_code")?,
        task_nvcsw: task("nvcsw")?,
        task_nivcsw: task("nivcsw")?,
        task_comm: task("comm")?,
        task_mm: task("mm")?,
        mm_arg_start: member_offset(btf, "mm_struct", &["arg_start"])?,
        mm_arg_end: member_offset(btf, "mm_struct", &["arg_end"])?,
        signal_live: member_offset(btf, "signal_struct", &["live"])?,
        signal_nr_threads: member_offset(btf, "signal_struct", &["nr_threads"])?,
        ..rss_counter_offsets(btf).unwrap_or_default()
    })
}

/// Where a process's resident-page counters are: `mm_struct.rss_stat` as an array of
/// `struct percpu_counter` (Linux 6.2+), or before that a `struct mm_rss_stat` holding an array
/// of `atomic_long_t` (what /proc reads on both). The other offsets are left 0.
fn rss_counter_offsets(btf: &Btf) -> anyhow::Result<ProcessOffsets> {
    let mm = btf
        .named("mm_struct", Kind::Struct)
        .ok_or_else(|| anyhow!("mm_struct is not a struct in the kernel's BTF"))?;
    let (rss_stat_bits, rss_stat) =
        find_member(&mm, "rss_stat").ok_or_else(|| anyhow!("mm_struct has no rss_stat"))?;
    let (start_bits, counters, len, count, per_cpu) = match rss_stat.array() {
        // The offsets below are `struct percpu_counter`'s: another counter type (a later
        // kernel's) is a layout the agent cannot read.
        Some((counters, _)) if counters.resolved().name() != "percpu_counter" => {
            bail!("mm_struct.rss_stat holds counters of another kind")
        }
        Some((counters, len)) => (
            rss_stat_bits,
            counters.resolved(),
            len,
            member_offset(btf, "percpu_counter", &["count"])?,
            member_offset(btf, "percpu_counter", &["counters"])?,
        ),
        None => {
            // `struct mm_rss_stat { atomic_long_t count[NR_MM_COUNTERS]; }`; an atomic's one
            // member, `counter`, is at its start.
            let (array_bits, array) = find_member(&rss_stat, "count")
                .ok_or_else(|| anyhow!("mm_struct.rss_stat has no count"))?;
            let (counters, len) = array
                .array()
                .ok_or_else(|| anyhow!("mm_struct.rss_stat.count is not an array"))?;
            (rss_stat_bits + array_bits, counters.resolved(), len, 0, 0)
        }
    };
    if counters.kind != Kind::Struct || !start_bits.is_multiple_of(8) {
        bail!("mm_struct.rss_stat holds no counters");
    }
    let stride = counters.size();
    let highest = probe_common::process::RSS_HIGHEST;
    // The programs copy counters 0 to the highest in one read and take 8-byte words of it.
    let aligned = [stride, count, per_cpu].iter().all(|n| n.is_multiple_of(8));
    if len <= highest
        || stride < count + 8
        || stride < per_cpu + 8
        || !aligned
        || (highest + 1) * stride > probe_common::process::RSS_BLOCK_BYTES
    {
        bail!("mm_struct.rss_stat has an unexpected shape");
    }
    Ok(ProcessOffsets {
        mm_rss_stat: start_bits / 8,
        rss_counter_stride: stride,
        rss_counter_count: count,
        rss_counter_percpu: per_cpu,
        ..ProcessOffsets::default()
    })
}

/// Where the memory peaks are kept: a process's `signal->maxrss`, and a memory cgroup's
/// `memory.watermark` reached from its cgroup. Without a memory controller in the kernel, the
/// cgroup part is 0 (the programs then read no cgroup peak).
pub fn memory_offsets(btf: &Btf) -> anyhow::Result<MemoryOffsets> {
    let memory_id = memory_controller_id(btf).ok();
    let cgroup_memory_css = memory_id
        .and_then(|id| Some(member_offset(btf, "cgroup", &["subsys"]).ok()? + 8 * id))
        .unwrap_or(0);
    let task_memory_cgroup = memory_id.and_then(|id| {
        let css_set_memory_css = member_offset(btf, "css_set", &["subsys"]).ok()? + 8 * id;
        let css_cgroup = member_offset(btf, "cgroup_subsys_state", &["cgroup"]).ok()?;
        Some((css_set_memory_css, css_cgroup))
    });
    let memcg_watermark = memcg_counter_offset(btf, "watermark");
    // `usage` is `atomic_long_t`: its one member, `counter`, is at its start.
    let memcg_usage = memcg_counter_offset(btf, "usage");
    Ok(MemoryOffsets {
        task_signal: member_offset(btf, "task_struct", &["signal"])?,
        signal_maxrss: member_offset(btf, "signal_struct", &["maxrss"])?,
        cgroup_memory_css: if memcg_watermark == 0 {
            0
        } else {
            cgroup_memory_css
        },
        memcg_watermark,
        memcg_usage,
        task_memory_cgroup,
    })
}

/// Offset of the page counter field `memory.<field>` of `struct mem_cgroup` from its `css`;
/// 0 when the kernel has no such field.
fn memcg_counter_offset(btf: &Btf, field: &str) -> u32 {
    (|| {
        let counter = member_offset(btf, "mem_cgroup", &["memory", field])?;
        let css = member_offset(btf, "mem_cgroup", &["css"])?;
        anyhow::Ok(counter - css)
    })()
    .unwrap_or(0)
}

/// `memory_cgrp_id` in `enum cgroup_subsys_id`: the memory controller's slot in
/// `cgroup.subsys`.
fn memory_controller_id(btf: &Btf) -> anyhow::Result<u32> {
    btf.named("cgroup_subsys_id", Kind::Enum)
        .and_then(|subsystems| {
            subsystems
                .enumerators()
                .find(|(name, _)| *name == "memory_cgrp_id")
        })
        .and_then(|(_, id)| u32::try_from(id).ok())
        .ok_or_else(|| anyhow!("the kernel has no memory controller"))
}

/// Where the kernel keeps each cgroup's per-CPU CPU time (the rstat base stats), for the
/// cgroup iterator, and where a per-CPU array keeps its per-CPU pointer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RstatOffsets {
    /// The per-CPU pointer in `struct cgroup`: `rstat_base_cpu` (6.15+) or `rstat_cpu`.
    pub cgroup_rstat_cpu: u32,
    /// `bstat.cputime` in the per-CPU struct it points to.
    pub cputime: u32,
    /// `utime`, `stime` and `sum_exec_runtime` in `struct task_cputime`.
    pub utime: u32,
    /// See `utime`.
    pub stime: u32,
    /// See `utime`.
    pub sum_exec_runtime: u32,
    /// The union of `value`, `ptrs` and `pptrs` in `struct bpf_array`.
    pub bpf_array_pptrs: u32,
}

/// The rstat offsets of this kernel (the per-CPU struct was split in 6.15).
pub fn rstat_offsets(btf: &Btf) -> anyhow::Result<RstatOffsets> {
    let (cgroup_rstat_cpu, cputime) = match member_offset(btf, "cgroup", &["rstat_base_cpu"]) {
        Ok(offset) => (
            offset,
            member_offset(btf, "cgroup_rstat_base_cpu", &["bstat", "cputime"])?,
        ),
        Err(_) => (
            member_offset(btf, "cgroup", &["rstat_cpu"])?,
            member_offset(btf, "cgroup_rstat_cpu", &["bstat", "cputime"])?,
        ),
    };
    let offsets = RstatOffsets {
        cgroup_rstat_cpu,
        cputime,
        utime: member_offset(btf, "task_cputime", &["utime"])?,
        stime: member_offset(btf, "task_cputime", &["stime"])?,
        sum_exec_runtime: member_offset(btf, "task_cputime", &["sum_exec_runtime"])?,
        bpf_array_pptrs: member_offset(btf, "bpf_array", &["pptrs"])?,
    };
    // The iterator copies the three in one read of CPUTIME_WORDS words.
    let copied = CPUTIME_WORDS as u32 * 8;
    for offset in [offsets.utime, offsets.stime, offsets.sum_exec_runtime] {
        ensure!(
            offset % 8 == 0 && offset + 8 <= copied,
            "struct task_cputime has a member at offset {offset}, outside the {copied} bytes the cgroup iterator copies"
        );
    }
    Ok(offsets)
}

fn sched_info_offsets(btf: &Btf) -> anyhow::Result<SchedInfoOffsets> {
    let field = |name| member_offset(btf, "task_struct", &["sched_info", name]);
    Ok(SchedInfoOffsets {
        pcount: field("pcount")?,
        run_delay: field("run_delay")?,
        last_arrival: field("last_arrival")?,
        last_queued: field("last_queued")?,
    })
}

/// Byte offset of a member reached through `path` from the start of struct `struct_name`,
/// looking through anonymous structs and unions on the way.
pub fn member_offset(btf: &Btf, struct_name: &str, path: &[&str]) -> anyhow::Result<u32> {
    let mut current = btf
        .named(struct_name, Kind::Struct)
        .ok_or_else(|| anyhow!("struct {struct_name} not in the kernel's BTF"))?;
    let mut offset_bits = 0u32;
    for name in path {
        let (member_bits, member_type) = find_member(&current, name)
            .ok_or_else(|| anyhow!("struct {struct_name} has no member {name}"))?;
        offset_bits += member_bits;
        current = member_type;
    }
    if !offset_bits.is_multiple_of(8) {
        bail!("{struct_name}.{} is a bit field", path.join("."));
    }
    Ok(offset_bits / 8)
}

/// Finds `name` among the members of a struct or union, descending into anonymous members.
/// Returns the member's bit offset from the start of `container` and its type, under any
/// typedefs and qualifiers.
fn find_member<'r, 'a>(container: &Type<'r, 'a>, name: &str) -> Option<(u32, Type<'r, 'a>)> {
    for member in container.members() {
        if member.name != name && !member.name.is_empty() {
            continue;
        }
        let member_type = member.ty?.resolved();
        if member.name == name {
            return Some((member.bit_offset, member_type));
        }
        if let Some((inner_bits, found)) = find_member(&member_type, name) {
            return Some((member.bit_offset + inner_bits, found));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member's byte offset as btf-rs, a full decoder, finds it.
    fn reference_offset(btf: &btf_rs::Btf, struct_name: &str, path: &[&str]) -> Option<u32> {
        use btf_rs::Type as T;
        fn resolved(btf: &btf_rs::Btf, mut ty: T) -> Option<T> {
            loop {
                ty = match &ty {
                    T::Typedef(t) => btf.resolve_chained_type(t).ok()?,
                    T::Const(t) => btf.resolve_chained_type(t).ok()?,
                    T::Volatile(t) => btf.resolve_chained_type(t).ok()?,
                    T::Restrict(t) => btf.resolve_chained_type(t).ok()?,
                    T::TypeTag(t) => btf.resolve_chained_type(t).ok()?,
                    _ => return Some(ty),
                }
            }
        }
        fn find(btf: &btf_rs::Btf, container: &T, name: &str) -> Option<(u32, T)> {
            let (T::Struct(s) | T::Union(s)) = container else {
                return None;
            };
            for member in &s.members {
                let member_name = btf.resolve_name(member).unwrap_or_default();
                let ty = resolved(btf, btf.resolve_chained_type(member).ok()?)?;
                if member_name == name {
                    return Some((member.bit_offset(), ty));
                }
                if member_name.is_empty()
                    && let Some((bits, found)) = find(btf, &ty, name)
                {
                    return Some((member.bit_offset() + bits, found));
                }
            }
            None
        }
        let mut current = btf
            .resolve_types_by_name(struct_name)
            .ok()?
            .into_iter()
            .find(|ty| matches!(ty, T::Struct(_)))?;
        let mut bits = 0;
        for name in path {
            let (member_bits, ty) = find(btf, &current, name)?;
            bits += member_bits;
            current = ty;
        }
        Some(bits / 8)
    }

    /// Every offset the programs read, as the loader's reader finds it in the running kernel's
    /// BTF, equals btf-rs's.
    #[test]
    fn offsets_match_a_full_decoders_on_the_running_kernel() {
        let bytes = std::fs::read(VMLINUX_BTF).expect("the kernel's BTF (the agent needs it)");
        let ours = Btf::parse(&bytes).unwrap();
        let reference = btf_rs::Btf::from_bytes(&bytes).unwrap();
        let paths: &[(&str, &[&str])] = &[
            ("sock", &["__sk_common", "skc_family"]),
            ("sock", &["__sk_common", "skc_daddr"]),
            ("sock", &["__sk_common", "skc_dport"]),
            ("sock", &["__sk_common", "skc_v6_daddr"]),
            ("socket", &["sk"]),
            ("task_struct", &["se", "sum_exec_runtime"]),
            ("task_struct", &["se", "prev_sum_exec_runtime"]),
            ("task_struct", &["policy"]),
            ("task_struct", &["sched_task_group"]),
            ("task_group", &["css", "cgroup"]),
            ("task_struct", &["sched_info", "pcount"]),
            ("task_struct", &["sched_info", "run_delay"]),
            ("task_struct", &["sched_info", "last_arrival"]),
            ("task_struct", &["sched_info", "last_queued"]),
            ("task_struct", &["pid"]),
            ("task_struct", &["tgid"]),
            ("task_struct", &["cgroups"]),
            ("task_struct", &["utime"]),
            ("task_struct", &["stime"]),
            ("task_struct", &["flags"]),
            ("task_struct", &["files"]),
            ("task_struct", &["signal"]),
            ("task_struct", &["start_time"]),
            ("task_struct", &["exit_code"]),
            ("task_struct", &["nvcsw"]),
            ("task_struct", &["nivcsw"]),
            ("task_struct", &["comm"]),
            ("task_struct", &["mm"]),
            ("css_set", &["dfl_cgrp"]),
            ("css_set", &["subsys"]),
            ("cgroup_subsys_state", &["cgroup"]),
            ("cgroup", &["kn"]),
            ("cgroup", &["rstat_base_cpu"]),
            ("cgroup_rstat_base_cpu", &["bstat", "cputime"]),
            ("task_cputime", &["utime"]),
            ("task_cputime", &["stime"]),
            ("task_cputime", &["sum_exec_runtime"]),
            ("bpf_array", &["pptrs"]),
            ("cgroup", &["root"]),
            ("cgroup", &["subsys"]),
            ("kernfs_node", &["id"]),
            ("cgroup_root", &["hierarchy_id"]),
            ("files_struct", &["fdt"]),
            ("fdtable", &["max_fds"]),
            ("fdtable", &["fd"]),
            ("file", &["f_inode"]),
            ("inode", &["i_mode"]),
            ("pt_regs", &["orig_ax"]),
            ("pt_regs", &["di"]),
            ("mm_struct", &["arg_start"]),
            ("mm_struct", &["arg_end"]),
            ("mm_struct", &["rss_stat"]),
            ("signal_struct", &["live"]),
            ("signal_struct", &["nr_threads"]),
            ("signal_struct", &["maxrss"]),
            ("mem_cgroup", &["css"]),
            ("mem_cgroup", &["memory", "watermark"]),
            ("mem_cgroup", &["memory", "usage"]),
            ("percpu_counter", &["count"]),
        ];
        for (struct_name, path) in paths {
            assert_eq!(
                member_offset(&ours, struct_name, path).ok(),
                reference_offset(&reference, struct_name, path),
                "{struct_name}.{}",
                path.join(".")
            );
        }
        // The anonymous members on the way are looked through (sock_common's are unions).
        assert!(member_offset(&ours, "sock", &["__sk_common", "skc_dport"]).unwrap() > 0);
    }
}
