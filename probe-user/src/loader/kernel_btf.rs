//! Struct member offsets read from the running kernel's BTF.
//!
//! Rust eBPF has no CO-RE relocations, so every struct field the programs read is located here
//! at load time and handed to them as a read-only global.

use anyhow::{Context as _, anyhow, bail};
use btf_rs::{Btf, Type};
use probe_common::{
    memory::MemoryOffsets,
    process::ProcessOffsets,
    task::{SchedInfoOffsets, TaskOffsets, WaitOffsets},
};

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
/// `struct percpu_counter` (Linux 6.2+, and so every kernel that tells a process's end
/// before releasing its memory). The other offsets are left 0.
fn rss_counter_offsets(btf: &Btf) -> anyhow::Result<ProcessOffsets> {
    let mm = btf
        .resolve_types_by_name("mm_struct")?
        .into_iter()
        .find(|candidate| matches!(candidate, Type::Struct(_)))
        .ok_or_else(|| anyhow!("mm_struct is not a struct in the kernel's BTF"))?;
    let Some((_, Type::Array(counters))) = find_member(btf, &mm, "rss_stat")? else {
        bail!("mm_struct.rss_stat is not an array of counters");
    };
    let Type::Struct(counter) = strip_modifiers(btf, btf.resolve_chained_type(&counters)?)? else {
        bail!("mm_struct.rss_stat holds no structs");
    };
    let count = member_offset(btf, "percpu_counter", &["count"])?;
    let stride = counter.size() as u32;
    let highest = probe_common::process::RSS_COUNTERS
        .iter()
        .max()
        .copied()
        .unwrap_or(0);
    if counters.len() as u32 <= highest || stride < count + 8 {
        bail!("mm_struct.rss_stat has an unexpected shape");
    }
    Ok(ProcessOffsets {
        mm_rss_stat: member_offset(btf, "mm_struct", &["rss_stat"])?,
        rss_counter_stride: stride,
        rss_counter_count: count,
        ..ProcessOffsets::default()
    })
}

/// Where the memory peaks are kept: a process's `signal->maxrss`, and a memory cgroup's
/// `memory.watermark` reached from its cgroup. Without a memory controller in the kernel, the
/// cgroup part is 0 (the programs then read no cgroup peak).
pub fn memory_offsets(btf: &Btf) -> anyhow::Result<MemoryOffsets> {
    let cgroup_memory_css = memory_controller_id(btf)
        .and_then(|id| Ok(member_offset(btf, "cgroup", &["subsys"])? + 8 * id))
        .unwrap_or(0);
    let memcg_watermark = (|| {
        let watermark = member_offset(btf, "mem_cgroup", &["memory", "watermark"])?;
        let css = member_offset(btf, "mem_cgroup", &["css"])?;
        anyhow::Ok(watermark - css)
    })()
    .unwrap_or(0);
    Ok(MemoryOffsets {
        task_signal: member_offset(btf, "task_struct", &["signal"])?,
        signal_maxrss: member_offset(btf, "signal_struct", &["maxrss"])?,
        cgroup_memory_css: if memcg_watermark == 0 {
            0
        } else {
            cgroup_memory_css
        },
        memcg_watermark,
    })
}

/// `memory_cgrp_id` in `enum cgroup_subsys_id`: the memory controller's slot in
/// `cgroup.subsys`.
fn memory_controller_id(btf: &Btf) -> anyhow::Result<u32> {
    for candidate in btf.resolve_types_by_name("cgroup_subsys_id")? {
        if let Type::Enum(subsystems) = candidate {
            for member in &subsystems.members {
                if btf.resolve_name(member)? == "memory_cgrp_id" {
                    return Ok(member.val());
                }
            }
        }
    }
    bail!("the kernel has no memory controller")
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
        .resolve_types_by_name(struct_name)
        .with_context(|| format!("struct {struct_name} not in the kernel's BTF"))?
        .into_iter()
        .find(|candidate| matches!(candidate, Type::Struct(_)))
        .ok_or_else(|| anyhow!("{struct_name} is not a struct in the kernel's BTF"))?;
    let mut offset_bits = 0u32;
    for name in path {
        let (member_bits, member_type) = find_member(btf, &current, name)?
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
/// Returns the member's bit offset from the start of `container` and its (typedef-resolved)
/// type.
fn find_member(btf: &Btf, container: &Type, name: &str) -> anyhow::Result<Option<(u32, Type)>> {
    let members = match container {
        Type::Struct(s) | Type::Union(s) => &s.members,
        _ => return Ok(None),
    };
    for member in members {
        let member_name = btf.resolve_name(member).unwrap_or_default();
        // Types are resolved only where needed: resolving copies a struct's members, and
        // doing it for each of task_struct's members made most of the time offsets took.
        if member_name != name && !member_name.is_empty() {
            continue;
        }
        let member_type = strip_modifiers(btf, btf.resolve_chained_type(member)?)?;
        if member_name == name {
            return Ok(Some((member.bit_offset(), member_type)));
        }
        if let Some((inner_bits, found)) = find_member(btf, &member_type, name)? {
            return Ok(Some((member.bit_offset() + inner_bits, found)));
        }
    }
    Ok(None)
}

/// Follows typedefs and qualifiers to the underlying type.
fn strip_modifiers(btf: &Btf, mut ty: Type) -> anyhow::Result<Type> {
    loop {
        ty = match &ty {
            Type::Typedef(t) => btf.resolve_chained_type(t)?,
            Type::Const(t) => btf.resolve_chained_type(t)?,
            Type::Volatile(t) => btf.resolve_chained_type(t)?,
            Type::Restrict(t) => btf.resolve_chained_type(t)?,
            Type::TypeTag(t) => btf.resolve_chained_type(t)?,
            _ => return Ok(ty),
        };
    }
}
