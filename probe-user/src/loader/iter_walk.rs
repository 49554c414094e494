//! The iterators' links and walks (cgroup and task iterators): aya 0.14 attaches an iterator
//! without the link info a cgroup iterator needs (its walk order), so the link is made here
//! with `BPF_LINK_CREATE`, and each walk is a `BPF_ITER_CREATE` descriptor read to its end.

use std::{
    io::Read as _,
    os::fd::{AsRawFd as _, BorrowedFd, OwnedFd},
};

use aya_obj::generated::{
    bpf_attach_type::BPF_TRACE_ITER, bpf_attr,
    bpf_cgroup_iter_order::BPF_CGROUP_ITER_DESCENDANTS_PRE, bpf_cmd,
};

use super::features::bpf;

/// `union bpf_iter_link_info`'s cgroup member (not in aya's bindings): a walk order from a
/// cgroup given by descriptor or id, the root when both are 0.
#[repr(C)]
struct CgroupIterInfo {
    order: u32,
    cgroup_fd: u32,
    cgroup_id: u64,
}

/// An attached iterator: each [`IterWalk::walk`] runs its program over every cgroup or task.
#[derive(Debug)]
pub struct IterWalk {
    link: OwnedFd,
}

impl IterWalk {
    /// Attaches the loaded iterator program `program` of `target` (`"cgroup"`: every cgroup,
    /// parents first; `"task"`: every task).
    pub fn attach(program: BorrowedFd<'_>, target: &str) -> std::io::Result<Self> {
        let info = CgroupIterInfo {
            order: BPF_CGROUP_ITER_DESCENDANTS_PRE as u32,
            cgroup_fd: 0,
            cgroup_id: 0,
        };
        // SAFETY: an all-zero bpf_attr is the kernel's "unset" for every field.
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        attr.link_create.__bindgen_anon_1.prog_fd = program.as_raw_fd() as u32;
        attr.link_create.attach_type = BPF_TRACE_ITER as u32;
        // A task iterator without link info walks every task; the same bytes would name one.
        if target == "cgroup" {
            attr.link_create.__bindgen_anon_3.__bindgen_anon_1.iter_info =
                &info as *const CgroupIterInfo as u64;
            attr.link_create
                .__bindgen_anon_3
                .__bindgen_anon_1
                .iter_info_len = std::mem::size_of::<CgroupIterInfo>() as u32;
        }
        Ok(Self {
            link: bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr)?,
        })
    }

    /// Runs the program over every cgroup or task, for a program that writes what it finds
    /// to its maps, nothing to the walk's output.
    pub fn walk(&self) -> std::io::Result<()> {
        self.walk_into(&mut Vec::new())
    }

    /// Runs the program over every cgroup or task, appending what it writes to the walk's
    /// output to `output`.
    pub fn walk_into(&self, output: &mut Vec<u8>) -> std::io::Result<()> {
        // SAFETY: as above.
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        attr.iter_create.link_fd = self.link.as_raw_fd() as u32;
        let mut walk = std::fs::File::from(bpf(bpf_cmd::BPF_ITER_CREATE, &mut attr)?);
        // The walk runs as the descriptor is read, to its end.
        walk.read_to_end(output)?;
        Ok(())
    }
}
