//! `iter/cgroup`: every cgroup's CPU time per CPU from the kernel's own accounting (the rstat
//! base stats the scheduler adds each slice to), written to a map at each sample's walk (a
//! cgroup iterator's own output holds 8 pages a walk, too few for a node's cgroups times its
//! CPUs); and the same read at a cgroup's removal, kept for its final numbers. With these, CPU
//! time per worker needs no program on `sched_switch`.
//!
//! The base stats are per-CPU kernel memory: a CPU's copy is at the per-CPU pointer plus that
//! CPU's per-CPU offset. Without kernel symbols the offset is learnt from a per-CPU array of
//! our own: `bpf_map_lookup_percpu_elem` gives a CPU's copy of its element, the array's
//! `pptrs[0]` the per-CPU pointer it was made from; the difference is the CPU's offset. The
//! addresses are taken as numbers through a map slot, which the kernel allows a program loaded
//! with CAP_PERFMON, and read with `bpf_probe_read_kernel`, which faults safely.

use core::{
    ffi::c_void,
    ptr::{read_volatile, write_volatile},
};

use aya_ebpf::{
    Global,
    bindings::seq_file,
    helpers::{
        bpf_probe_read_kernel,
        generated::{bpf_map_lookup_percpu_elem, bpf_seq_write},
    },
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use probe_common::{
    drops::{DROP_CPU_NOW, DROP_FINAL_CPU, DROP_MEMORY_NOW},
    memory::{MemoryNow, ProcessRss},
    rstat::{CPUTIME_WORDS, MAX_CPUS, RstatCpu, RstatKey, RstatNow},
};

use crate::{
    sched::{BPF_F_NO_PREALLOC, count_drop},
    task,
};

#[unsafe(no_mangle)]
static CGROUP_RSTAT_CPU_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static RSTAT_CPUTIME_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CPUTIME_UTIME_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CPUTIME_STIME_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CPUTIME_RUNTIME_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BPF_ARRAY_PPTRS_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static POSSIBLE_CPUS: Global<u32> = Global::new(1);

/// A per-CPU array whose own storage tells each CPU's per-CPU offset.
#[map]
static PERCPU_BASE: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Where an address is stored to be read back as a number: one slot for the cgroup programs
/// (the iterators over cgroups and the removal program, which the kernel's cgroup mutex keeps
/// apart), one for the process walk (one walk at a time), one for the exit tracepoint (run
/// with preemption off): no program can come between another's store and load on a CPU.
#[map]
static ADDRESS_SLOT: PerCpuArray<u64> = PerCpuArray::with_max_entries(ADDRESS_SLOTS, 0);

/// How many slots [`ADDRESS_SLOT`] has.
pub(crate) const ADDRESS_SLOTS: u32 = 3;

/// [`ADDRESS_SLOT`]'s slot of the cgroup programs.
const CGROUP_SLOT: u32 = 0;
/// [`ADDRESS_SLOT`]'s slot of the process walk.
pub(crate) const WALK_SLOT: u32 = 1;
/// [`ADDRESS_SLOT`]'s slot of the exit tracepoint.
pub(crate) const EXIT_SLOT: u32 = 2;

/// Every cgroup's times per CPU, as the last walk that visited it found them.
#[map]
static CPU_NOW: HashMap<RstatKey, RstatNow> = HashMap::with_max_entries(1, BPF_F_NO_PREALLOC);

/// The id of the last walk that ended.
#[map]
static LAST_WALK: Array<u64> = Array::with_max_entries(1, 0);

/// Removed cgroups' times per CPU at their removal, until user space finishes them.
#[map]
static FINAL_CPU: HashMap<RstatKey, RstatCpu> = HashMap::with_max_entries(1, BPF_F_NO_PREALLOC);

/// Whether CPU time comes from here: the iterator has walked (the agent walks once when it
/// attaches it), so the removal program keeps final times for it.
#[inline(always)]
pub fn on() -> bool {
    LAST_WALK.get(0).is_some_and(|walk| *walk != 0)
}

/// `iter/cgroup`: puts the cgroup's times on each CPU it ran on in [`CPU_NOW`].
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/cgroup")]
pub fn cpu_rstat(ctx: *mut c_void) -> i32 {
    let Some((walk, cgroup)) = walk_step(ctx, &LAST_WALK) else {
        return 0;
    };
    let cgroup: task::Cgroup = cgroup.cast();
    for_each_cpu(cgroup, task::id_of_cgroup(cgroup), |key, cpu| {
        let now = RstatNow { cpu, walk };
        // In place when the entry is there (the walks run one at a time, in the agent's
        // sampling thread, which reads the map after each): no allocation per CPU per walk.
        match CPU_NOW.get_ptr_mut(key) {
            // SAFETY: a value of this map; no other writer (see above).
            Some(entry) => unsafe { write_volatile(entry, now) },
            None => {
                if CPU_NOW.insert(key, now, 0).is_err() {
                    count_drop(DROP_CPU_NOW);
                }
            }
        }
    });
    0
}

/// Every cgroup's memory counters, as the last memory walk that visited it found them.
#[map]
static MEMORY_NOW: HashMap<u64, MemoryNow> = HashMap::with_max_entries(1, BPF_F_NO_PREALLOC);

/// The id of the last memory walk that ended.
#[map]
static LAST_MEMORY_WALK: Array<u64> = Array::with_max_entries(1, 0);

/// `iter/cgroup`: puts the memory counters of each cgroup with a memory controller of its own
/// (what `memory.current` and `memory.peak` show) in [`MEMORY_NOW`]: one walk a sample instead
/// of two files per worker.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/cgroup")]
pub fn memory_walk(ctx: *mut c_void) -> i32 {
    let Some((walk, cgroup)) = walk_step(ctx, &LAST_MEMORY_WALK) else {
        return 0;
    };
    let cgroup: task::Cgroup = cgroup.cast();
    let Some((current_pages, peak_pages)) = task::memory_pages(cgroup) else {
        return 0;
    };
    let now = MemoryNow {
        current_pages,
        peak_pages,
        walk,
    };
    let cgroup_id = task::id_of_cgroup(cgroup);
    // In place when the entry is there, as in `cpu_rstat`.
    match MEMORY_NOW.get_ptr_mut(cgroup_id) {
        // SAFETY: a value of this map; no other writer (walks run one at a time).
        Some(entry) => unsafe { write_volatile(entry, now) },
        None => {
            if MEMORY_NOW.insert(cgroup_id, now, 0).is_err() {
                count_drop(DROP_MEMORY_NOW);
            }
        }
    }
    0
}

/// One call of a cgroup walk (`struct bpf_iter__cgroup { struct bpf_iter_meta *meta; struct
/// cgroup *cgroup; }`): the walk's id and the cgroup visited; `None` at the walk's end, after
/// storing the id in `last_walk` (entries the walk did not rewrite are of cgroups now gone).
#[inline(always)]
fn walk_step(ctx: *mut c_void, last_walk: &Array<u64>) -> Option<(u64, *const u8)> {
    // SAFETY: the context's two pointers, loads the verifier checks against BTF; the walk's
    // id is `meta->session_id`, after its seq_file pointer.
    unsafe {
        let meta = read_volatile(ctx as *const *const u64);
        if meta.is_null() {
            return None;
        }
        let walk = read_volatile(meta.add(1));
        let object = read_volatile((ctx as *const *const u8).add(1));
        if object.is_null() {
            if let Some(done) = last_walk.get_ptr_mut(0) {
                write_volatile(done, walk);
            }
            return None;
        }
        Some((walk, object))
    }
}

/// `iter/task`: writes each process's resident pages (at its leader; kernel threads have
/// none) with its cgroup2 cgroup to the walk's output, one [`ProcessRss`] each, for user space
/// to sum by cgroup. Where the memory walk cannot run, one walk a sample instead of each
/// worker's process list and each process's statm file. Output, not a map: no hash lookup per
/// process, no entries of gone cgroups to free, no limit on cgroups; and a process the kernel
/// visits again after its output overflowed a read has its first record taken back.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub fn rss_walk(ctx: *mut c_void) -> i32 {
    // SAFETY: the context's two pointers (`struct bpf_iter__task { struct bpf_iter_meta
    // *meta; struct task_struct *task; }`) and the meta's seq_file pointer, loads the verifier
    // checks against BTF.
    let (seq, task) = unsafe {
        let meta = read_volatile(ctx as *const *const *mut seq_file);
        let task = read_volatile((ctx as *const *const u8).add(1));
        if meta.is_null() || task.is_null() {
            return 0;
        }
        (read_volatile(meta), task)
    };
    if task::tid(task) != task::tgid(task) || task::is_kthread(task) {
        return 0;
    }
    let record = ProcessRss {
        cgroup_id: task::cgroup_id(task),
        rss_pages: crate::process::rss_pages(task, WALK_SLOT, true).unwrap_or(0),
        memory_cgroup_id: task::memory_cgroup_id(task),
        pid: task::tgid(task),
        reserved: 0,
    };
    // SAFETY: the walk's seq_file and a record on the stack. A full output is the kernel's
    // to handle (it visits this process again in the next read).
    unsafe {
        bpf_seq_write(
            seq,
            (&record as *const ProcessRss).cast(),
            size_of::<ProcessRss>() as u32,
        );
    }
    0
}

/// At a cgroup's removal: keeps its times per CPU for user space's final read.
#[inline(always)]
pub fn keep_final(cgroup: task::Cgroup, cgroup_id: u64) {
    for_each_cpu(cgroup, cgroup_id, |key, cpu| {
        if FINAL_CPU.insert(key, cpu, 0).is_err() {
            count_drop(DROP_FINAL_CPU);
        }
    });
}

/// Calls `each` with the cgroup's times on every possible CPU it ran on.
#[inline(always)]
fn for_each_cpu(cgroup: task::Cgroup, cgroup_id: u64, mut each: impl FnMut(RstatKey, RstatCpu)) {
    let Some(rstat) = per_cpu_pointer(cgroup) else {
        return;
    };
    let cputime = u64::from(RSTAT_CPUTIME_OFFSET.load());
    // The word of each figure in the copy (the loader checked the offsets are 8-byte aligned
    // and within it).
    let word = |offset: u32| (offset / 8) as usize % CPUTIME_WORDS;
    let (runtime, utime, stime) = (
        word(CPUTIME_RUNTIME_OFFSET.load()),
        word(CPUTIME_UTIME_OFFSET.load()),
        word(CPUTIME_STIME_OFFSET.load()),
    );
    for_each_cpu_offset(CGROUP_SLOT, |cpu, cpu_offset| {
        // One read for the three: where the cgroup ran on many CPUs, three times fewer.
        let times = rstat.wrapping_add(cpu_offset).wrapping_add(cputime);
        // SAFETY: bpf_probe_read_kernel faults safely.
        let Ok(times) = (unsafe { bpf_probe_read_kernel(times as *const [u64; CPUTIME_WORDS]) })
        else {
            return;
        };
        let runtime_ns = times[runtime];
        if runtime_ns == 0 {
            return;
        }
        each(
            RstatKey {
                cgroup_id,
                cpu,
                reserved: 0,
            },
            RstatCpu {
                runtime_ns,
                user_tick_ns: times[utime],
                system_tick_ns: times[stime],
            },
        );
    });
}

/// A CPU's per-CPU offset once learnt.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CpuOffset {
    /// What the kernel adds to a per-CPU pointer for this CPU's copy.
    offset: u64,
    /// 1 once `offset` is learnt.
    known: u64,
}

/// Each possible CPU's per-CPU offset, learnt at the first walk: the kernel sets them at boot
/// and never changes them, so the walks need not learn them again for every cgroup and process
/// (two helper calls and a read per CPU each time).
#[map]
static CPU_OFFSETS: Array<CpuOffset> = Array::with_max_entries(MAX_CPUS, 0);

/// Calls `each` with every possible CPU and its per-CPU offset (what the kernel adds to a
/// per-CPU pointer for that CPU's copy), learning the offsets first if not yet known, using
/// `slot` of [`ADDRESS_SLOT`].
#[inline(always)]
pub(crate) fn for_each_cpu_offset(slot: u32, mut each: impl FnMut(u32, u64)) {
    let learnt = CPU_OFFSETS.get(0).is_some_and(|first| first.known != 0);
    if !learnt {
        learn_cpu_offsets(slot);
    }
    let possible = POSSIBLE_CPUS.load();
    for cpu in 0..MAX_CPUS {
        if cpu >= possible {
            break;
        }
        match CPU_OFFSETS.get(cpu) {
            Some(known) if known.known != 0 => each(cpu, known.offset),
            _ => {}
        }
    }
}

/// Rare path: learns every possible CPU's per-CPU offset from [`PERCPU_BASE`]'s copies. CPU 0
/// last, as [`for_each_cpu_offset`] takes its entry to say all are known. Programs that learn
/// at once on two CPUs write the same values.
#[inline(always)]
fn learn_cpu_offsets(slot: u32) {
    let Some(per_cpu_pointer_0) = base_per_cpu_pointer(slot) else {
        return;
    };
    let possible = POSSIBLE_CPUS.load();
    for step in 0..MAX_CPUS {
        if step >= possible {
            break;
        }
        let cpu = possible - 1 - step;
        let Some(copy) = base_copy_address(cpu, slot) else {
            continue;
        };
        if let Some(entry) = CPU_OFFSETS.get_ptr_mut(cpu) {
            // SAFETY: a value of this map; every writer stores the same offset.
            unsafe {
                write_volatile(
                    entry,
                    CpuOffset {
                        offset: copy.wrapping_sub(per_cpu_pointer_0),
                        known: 1,
                    },
                )
            };
        }
    }
}

/// The cgroup's per-CPU base stats pointer, as a number.
#[inline(always)]
fn per_cpu_pointer(cgroup: task::Cgroup) -> Option<u64> {
    let cgroup = as_number(cgroup as u64, CGROUP_SLOT)?;
    let rstat = read_u64(cgroup, CGROUP_RSTAT_CPU_OFFSET.load());
    (rstat != 0).then_some(rstat)
}

/// `PERCPU_BASE`'s per-CPU pointer (`pptrs[0]` of its `struct bpf_array`).
#[inline(always)]
fn base_per_cpu_pointer(slot: u32) -> Option<u64> {
    let map = &PERCPU_BASE as *const PerCpuArray<u64> as u64;
    let map = as_number(map, slot)?;
    let pointer = read_u64(map, BPF_ARRAY_PPTRS_OFFSET.load());
    (pointer != 0).then_some(pointer)
}

/// The address of `PERCPU_BASE`'s element on `cpu`.
#[inline(always)]
fn base_copy_address(cpu: u32, slot: u32) -> Option<u64> {
    let key = 0u32;
    // SAFETY: a per-CPU array and a key of its key size; `cpu` below the possible CPUs.
    let copy = unsafe {
        bpf_map_lookup_percpu_elem(
            &PERCPU_BASE as *const PerCpuArray<u64> as *mut c_void,
            &key as *const u32 as *const c_void,
            cpu,
        )
    };
    if copy.is_null() {
        return None;
    }
    as_number(copy as u64, slot)
}

/// A kernel address as a plain number (stored in `slot` of [`ADDRESS_SLOT`] and read back).
/// Each slot's programs cannot come between one another's store and load on a CPU (see
/// [`ADDRESS_SLOT`]).
#[inline(always)]
pub(crate) fn as_number(address: u64, slot: u32) -> Option<u64> {
    let slot = ADDRESS_SLOT.get_ptr_mut(slot)?;
    // SAFETY: this CPU's slot; volatile so the round trip is kept.
    unsafe {
        write_volatile(slot, address);
        Some(read_volatile(slot))
    }
}

/// The `u64` at `base + offset` in kernel memory, 0 if it cannot be read.
#[inline(always)]
pub(crate) fn read_u64(base: u64, offset: u32) -> u64 {
    // SAFETY: bpf_probe_read_kernel faults safely.
    unsafe { bpf_probe_read_kernel(base.wrapping_add(u64::from(offset)) as *const u64) }
        .unwrap_or(0)
}
