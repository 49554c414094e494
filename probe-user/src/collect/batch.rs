//! Reading a whole per-CPU hash map in a few system calls (`BPF_MAP_LOOKUP_BATCH`, Linux 5.6),
//! which aya 0.14 does not offer: iterating key by key costs two calls per worker per tick.
//!
//! The kernel writes keys and values straight into [`PerCpuEntries`]' buffers, which a
//! caller keeps from one sample to the next: at 1,000 workers the CPU slots alone are over a
//! megabyte a read, and allocating it afresh each time (a new mapping, faulted in page by
//! page, then unmapped) and splitting it into a vector per entry cost the agent a tenth of
//! its CPU.

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

/// A per-CPU map's entries as one read left them: keys, and `cpus` values per key in one
/// flat buffer. Kept between reads so that its buffers are reused.
pub struct PerCpuEntries<K, V> {
    cpus: usize,
    keys: Vec<K>,
    values: Vec<V>,
}

impl<K: Copy, V: Copy> PerCpuEntries<K, V> {
    /// Empty, for a map with `cpus` values per key (1 for a plain map).
    pub fn new(cpus: usize) -> Self {
        Self {
            cpus: cpus.max(1),
            keys: Vec::new(),
            values: Vec::new(),
        }
    }

    /// Values per key.
    pub fn cpus(&self) -> usize {
        self.cpus
    }

    /// Empties it, keeping its buffers (for a read that is skipped).
    pub fn clear(&mut self) {
        self.keys.clear();
        self.values.clear();
    }

    /// How many entries the last read found.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Each entry: its key and its values, one per CPU.
    pub fn iter(&self) -> impl Iterator<Item = (K, &[V])> {
        self.keys
            .iter()
            .copied()
            .zip(self.values.chunks_exact(self.cpus))
    }

    /// The values of the entry at `index`, writable.
    pub fn get_mut(&mut self, index: usize) -> Option<&mut [V]> {
        let start = index.checked_mul(self.cpus)?;
        self.values.get_mut(start..start + self.cpus)
    }

    /// The entry at `index` in the map's order (for an array, the key `index`).
    pub fn get(&self, index: usize) -> Option<(K, &[V])> {
        let key = *self.keys.get(index)?;
        let start = index * self.cpus;
        Some((key, self.values.get(start..start + self.cpus)?))
    }

    /// Gives back buffer room four times what the last read needed: a burst of workers (a
    /// thousand ending at once) would otherwise stay in the agent's memory for good.
    fn shrink_after_burst(&mut self) {
        if self.values.capacity() > 4 * self.values.len().max(256) {
            self.keys.shrink_to(2 * self.keys.len());
            self.values.shrink_to(2 * self.values.len());
        }
    }

    /// Adds an entry (for readers that fill it key by key); `values` holds one per CPU.
    pub fn push(&mut self, key: K, values: &[V]) {
        debug_assert_eq!(values.len(), self.cpus);
        self.keys.push(key);
        self.values.extend_from_slice(values);
    }

    /// Every entry copied out, a vector of values each: for readers that keep them.
    pub fn to_vec(&self) -> Vec<(K, Vec<V>)> {
        self.iter()
            .map(|(key, values)| (key, values.to_vec()))
            .collect()
    }
}

/// Reads the first `max_keys` entries of a per-CPU map, in its order (for an array, indexes
/// `0..max_keys`), into `into`, replacing what it held. A plain map reads the same with
/// `into` made for 1 CPU.
///
/// # Safety
/// `fd` must be a per-CPU hash or array (`K` = `u32` for an array), or a plain hash, whose
/// keys are of type `K` and values of type `V` (per CPU), both valid for any bit pattern.
pub unsafe fn read_first<K: Copy, V: Copy>(
    fd: BorrowedFd<'_>,
    max_keys: usize,
    into: &mut PerCpuEntries<K, V>,
) -> io::Result<()> {
    // The kernel lays a per-CPU value out every 8 bytes (a plain one, at its size): a V of a
    // multiple of 8 bytes and alignment at most 8 sits in a Vec<V> exactly as written.
    const {
        assert!(size_of::<V>().is_multiple_of(8) && align_of::<V>() <= 8);
    }
    into.clear();
    // SAFETY: as the caller promised.
    let read = unsafe { read_into(fd, max_keys, into) };
    into.shrink_after_burst();
    read
}

/// [`read_first`] into emptied buffers.
///
/// # Safety
/// As [`read_first`].
unsafe fn read_into<K: Copy, V: Copy>(
    fd: BorrowedFd<'_>,
    max_keys: usize,
    into: &mut PerCpuEntries<K, V>,
) -> io::Result<()> {
    let cpus = into.cpus;
    if max_keys == 0 {
        return Ok(());
    }
    // An array's reads ask for what they want in one call; a hash's in chunks.
    let mut chunk = if max_keys == usize::MAX {
        1024
    } else {
        max_keys.min(1 << 16)
    };
    let mut in_token = 0u64;
    let mut first = true;
    loop {
        into.keys.reserve(chunk);
        into.values.reserve(chunk * cpus);
        let mut out_token = 0u64;
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &in_token as *const u64 as u64
            },
            out_batch: &mut out_token as *mut u64 as u64,
            keys: into.keys.spare_capacity_mut().as_mut_ptr() as u64,
            values: into.values.spare_capacity_mut().as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd.as_raw_fd() as u32,
            ..BatchAttr::default()
        };
        // SAFETY: attr points to spare room for `count` keys and values (reserved above), as
        // the kernel expects for this map; it outlives the call.
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
        let found = (attr.count as usize).min(chunk);
        // SAFETY: the kernel wrote `found` keys and `found * cpus` values into the spare room
        // (reserved above), and any bit pattern is a valid K and V.
        unsafe {
            into.keys.set_len(into.keys.len() + found);
            into.values.set_len(into.values.len() + found * cpus);
        }
        // ENOENT: that was the last batch.
        if error.is_some() || into.keys.len() >= max_keys {
            into.keys.truncate(max_keys);
            into.values.truncate(max_keys.saturating_mul(cpus));
            return Ok(());
        }
        in_token = out_token;
        first = false;
    }
}
