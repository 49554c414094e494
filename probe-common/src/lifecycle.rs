//! Worker lifecycle: the kernel tells of each cgroup2 directory made or removed, through a
//! ring buffer, so the agent never polls the hierarchy to learn of workers.

/// Name of the ring buffer of [`CgroupEvent`]s.
pub const EVENTS_MAP: &str = "CGROUP_EVENTS";
/// Size of the ring buffer: room for about 4,000 events (2,000 short workers) between two
/// reads, twice the first size's, should a sample keep the reader busy. Each MiB costs the
/// agent 2 MiB of resident memory: the kernel maps the ring whole, and twice.
pub const EVENTS_BYTES: u32 = 2 * 1024 * 1024;
/// Longest path carried in an event (longer ones are cut; the id stays exact).
pub const EVENT_PATH_BYTES: usize = 480;

/// [`CgroupEvent::kind`]: a cgroup was made.
pub const CGROUP_MADE: u32 = 1;
/// [`CgroupEvent::kind`]: a cgroup was removed (it had no tasks left).
pub const CGROUP_REMOVED: u32 = 2;

/// One cgroup2 directory made or removed.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CgroupEvent {
    /// cgroup v2 id (inode of the directory).
    pub cgroup_id: u64,
    /// CLOCK_MONOTONIC ns when it happened.
    pub at_ns: u64,
    /// At a removal, the memory cgroup's high-water mark in pages (its `memory.peak`); 0 when
    /// the cgroup had no memory controller, and at a creation.
    pub memory_peak_pages: u64,
    /// `CGROUP_MADE` or `CGROUP_REMOVED`.
    pub kind: u32,
    /// Bytes of `path` used (without the terminating NUL).
    pub path_len: u32,
    /// Path relative to the cgroup2 mount, NUL-terminated.
    pub path: [u8; EVENT_PATH_BYTES],
}

const _: () = assert!(core::mem::size_of::<CgroupEvent>() == 32 + EVENT_PATH_BYTES);

impl CgroupEvent {
    /// The path as text (lossy for non-UTF-8 names).
    pub fn path_bytes(&self) -> &[u8] {
        let len = (self.path_len as usize).min(EVENT_PATH_BYTES);
        &self.path[..len]
    }
}
