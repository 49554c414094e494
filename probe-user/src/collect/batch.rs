//! Reading a whole per-CPU hash map in a few system calls (`BPF_MAP_LOOKUP_BATCH`, Linux 5.6),
//! which aya 0.14 does not offer: iterating key by key costs two calls per worker per tick.

use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd},
};

/// `BPF_MAP_LOOKUP_BATCH` from linux/bpf.h.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Every entry of a per-CPU hash map: (key, one value per possible CPU).
///
/// # Safety
/// `fd` must be a `BPF_MAP_TYPE_PERCPU_HASH` with keys of type `K` and values of type `V`,
/// both valid for any bit pattern.
pub unsafe fn lookup_all_percpu<K: Copy + Default, V: Copy + Default>(
    fd: BorrowedFd<'_>,
    cpus: usize,
) -> io::Result<Vec<(K, Vec<V>)>> {
    // SAFETY: as the caller promised.
    unsafe { lookup_first_percpu(fd, cpus, usize::MAX) }
}

/// The first `max_keys` entries of a per-CPU map, in its order (for an array, indexes
/// `0..max_keys`). A plain map with 8-byte values reads the same with `cpus` 1.
///
/// # Safety
/// As [`lookup_all_percpu`], for a per-CPU hash or array (`K` = `u32` for an array).
pub unsafe fn lookup_first_percpu<K: Copy + Default, V: Copy + Default>(
    fd: BorrowedFd<'_>,
    cpus: usize,
    max_keys: usize,
) -> io::Result<Vec<(K, Vec<V>)>> {
    if max_keys == 0 {
        return Ok(Vec::new());
    }
    let stride = std::mem::size_of::<V>().div_ceil(8) * 8;
    let mut chunk = 1024usize.min(max_keys);
    let mut entries = Vec::new();
    let mut in_token = 0u64;
    let mut first = true;
    loop {
        let mut keys = vec![K::default(); chunk];
        let mut values = vec![0u8; chunk * cpus * stride];
        let mut out_token = 0u64;
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &in_token as *const u64 as u64
            },
            out_batch: &mut out_token as *mut u64 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: attr points to buffers sized for `count` keys and values, as the kernel
        // expects for this map; they outlive the call.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>(),
            )
        };
        let error = (ret < 0).then(io::Error::last_os_error);
        if let Some(err) = &error
            && err.raw_os_error() == Some(libc::ENOSPC)
        {
            // A hash bucket holds more entries than `count`: retry with room for them.
            chunk *= 4;
            continue;
        }
        if let Some(err) = &error
            && err.raw_os_error() != Some(libc::ENOENT)
        {
            return Err(io::Error::new(err.kind(), err.to_string()));
        }
        for (index, &key) in keys.iter().take(attr.count as usize).enumerate() {
            let per_cpu = (0..cpus)
                .map(|cpu| {
                    let offset = (index * cpus + cpu) * stride;
                    // SAFETY: the kernel wrote a V at this offset (8-byte aligned stride);
                    // read_unaligned copes with the Vec<u8>'s alignment.
                    unsafe { std::ptr::read_unaligned(values[offset..].as_ptr().cast::<V>()) }
                })
                .collect();
            entries.push((key, per_cpu));
        }
        // ENOENT: that was the last batch.
        if error.is_some() || entries.len() >= max_keys {
            entries.truncate(max_keys);
            return Ok(entries);
        }
        in_token = out_token;
        first = false;
    }
}
