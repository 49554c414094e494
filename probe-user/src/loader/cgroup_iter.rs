//! The cgroup iterator's link and walks: aya 0.14 attaches an iterator without the link info
//! a cgroup iterator needs (its walk order), so the link is made here with `BPF_LINK_CREATE`,
//! and each walk is a `BPF_ITER_CREATE` descriptor read to its end.

use std::{
    io::Read as _,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
};

/// `BPF_LINK_CREATE` and `BPF_ITER_CREATE` (linux/bpf.h).
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;
/// `BPF_TRACE_ITER` attach type.
const BPF_TRACE_ITER: u32 = 28;
/// `BPF_CGROUP_ITER_DESCENDANTS_PRE`: every cgroup under the root, parents first.
const DESCENDANTS_PRE: u32 = 2;

/// `union bpf_iter_link_info`'s cgroup member: a walk of the whole cgroup2 hierarchy.
#[repr(C)]
struct CgroupIterInfo {
    order: u32,
    cgroup_fd: u32,
    cgroup_id: u64,
}

/// The `link_create` member of `union bpf_attr`, with the iterator's info.
#[repr(C)]
#[derive(Default)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    iter_info: u64,
    iter_info_len: u32,
    /// The rest of `union bpf_attr` the kernel may look at, zero.
    rest: [u32; 25],
}

/// An attached cgroup iterator: each [`CgroupIter::walk`] runs its program over every cgroup.
#[derive(Debug)]
pub struct CgroupIter {
    link: OwnedFd,
}

impl CgroupIter {
    /// Attaches the loaded `iter/cgroup` program `program` to walk every cgroup, parents first.
    pub fn attach(program: BorrowedFd<'_>) -> std::io::Result<Self> {
        let info = CgroupIterInfo {
            order: DESCENDANTS_PRE,
            cgroup_fd: 0,
            cgroup_id: 0,
        };
        let attr = LinkCreateAttr {
            prog_fd: program.as_raw_fd() as u32,
            attach_type: BPF_TRACE_ITER,
            iter_info: &info as *const CgroupIterInfo as u64,
            iter_info_len: std::mem::size_of::<CgroupIterInfo>() as u32,
            ..LinkCreateAttr::default()
        };
        Ok(Self {
            link: bpf(BPF_LINK_CREATE, &attr)?,
        })
    }

    /// Runs the program over every cgroup and returns what it wrote (appended to `output`,
    /// which is cleared first).
    pub fn walk(&self, output: &mut Vec<u8>) -> std::io::Result<()> {
        #[repr(C)]
        #[derive(Default)]
        struct IterCreateAttr {
            link_fd: u32,
            flags: u32,
            rest: [u32; 30],
        }
        let attr = IterCreateAttr {
            link_fd: self.link.as_raw_fd() as u32,
            ..IterCreateAttr::default()
        };
        let mut walk = std::fs::File::from(bpf(BPF_ITER_CREATE, &attr)?);
        output.clear();
        walk.read_to_end(output)?;
        Ok(())
    }
}

/// The `bpf(2)` system call for a command that returns a new descriptor.
fn bpf<A>(command: libc::c_long, attr: &A) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is a whole, zero-padded attribute of the command, its pointers valid for
    // the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attr as *const A,
            std::mem::size_of::<A>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a non-negative return of these commands is a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
