//! The event rings' readers: a thread per ring that empties the kernel's ring (cgroup events,
//! process events) as soon as the kernel wakes it, into memory the agent owns. Whatever else keeps the agent busy
//! (a long sample, a reader of its output that is slow to take lines) then never lets the
//! ring fill and exit summaries go missing; the ring only has to hold what arrives within one
//! wake-up.

use std::{
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
        mpsc::{Receiver, Sender, TryRecvError},
    },
    time::Duration,
};

use aya::maps::{MapData, RingBuf};
use probe_common::{
    lifecycle::{CGROUP_MADE, CgroupEvent},
    process::{
        PROCESS_EXECED, PROCESS_EXITING, PROCESS_FORKED, ProcessExec, ProcessExiting, ProcessFork,
        THREAD_ENDED, ThreadEnd,
    },
};

use crate::{
    cgroup::command_from_args,
    model::process::{ProcessEvent, ThreadTotals},
};

/// Events read but not yet taken. A consumer that falls this far behind pauses the reader, and
/// the ring then fills and counts its drops, which the agent reports. The queue grows only
/// as far as it is used (a preallocated one would cost its whole size in resident memory).
const QUEUE_EVENTS: usize = 262_144;
/// How long a reader whose queue is full waits before it looks again for room.
const FULL_WAIT: Duration = Duration::from_millis(100);

/// One cgroup event as the ring told it, path decoded.
#[derive(Clone, Debug)]
pub struct RingEvent {
    /// cgroup v2 id.
    pub cgroup_id: u64,
    /// CLOCK_MONOTONIC ns when it happened.
    pub at_ns: u64,
    /// At a removal, its memory cgroup's high-water mark in pages (0: none).
    pub memory_peak_pages: u64,
    /// True for a cgroup made, false for one removed.
    pub made: bool,
    /// Path relative to the cgroup2 mount ("" for the root).
    pub path: String,
}

/// The reading thread's handle: events come out of [`RingReader::try_next`]; dropping it wakes
/// the thread, which ends.
pub struct RingReader<T> {
    events: Receiver<T>,
    shared: Arc<Shared>,
}

/// What the reader and its thread share.
struct Shared {
    /// Set when the agent is done with events.
    stop: AtomicBool,
    /// Events queued and not yet taken.
    queued: AtomicUsize,
    /// Written when `stop` is set: the thread waits on it beside the ring, so it sleeps until
    /// an event or the end instead of waking on a timer (10 wake-ups a second per ring were
    /// 3% of the agent's CPU at 1,000 workers, and went on on an idle node).
    stop_fd: OwnedFd,
}

impl<T: Send + 'static> RingReader<T> {
    /// Starts a thread that owns `ring` and reads it, each record through `decode`, until the
    /// reader is dropped.
    pub fn start(
        ring: RingBuf<MapData>,
        name: &str,
        decode: fn(&[u8]) -> Option<T>,
    ) -> anyhow::Result<Self> {
        let (sender, events) = std::sync::mpsc::channel();
        // SAFETY: eventfd takes no pointers; a descriptor it returns is ours alone.
        let stop_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if stop_fd < 0 {
            anyhow::bail!(
                "could not open the event reader's wake-up descriptor ({}): raise the open-file \
                 limit (ulimit -n) and start workerprobe again",
                std::io::Error::last_os_error()
            );
        }
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            queued: AtomicUsize::new(0),
            // SAFETY: a descriptor just opened, owned by nothing else.
            stop_fd: unsafe { OwnedFd::from_raw_fd(stop_fd) },
        });
        let thread_shared = Arc::clone(&shared);
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || read_ring(ring, &sender, &thread_shared, decode))
            .map_err(|err| anyhow::anyhow!("could not start the event reader thread: {err}"))?;
        Ok(Self { events, shared })
    }

    /// True when events wait to be taken.
    pub fn waiting(&self) -> bool {
        self.shared.queued.load(Ordering::Relaxed) > 0
    }

    /// The oldest event not yet taken, if any.
    pub fn try_next(&self) -> Option<T> {
        match self.events.try_recv() {
            Ok(event) => {
                self.shared.queued.fetch_sub(1, Ordering::Relaxed);
                Some(event)
            }
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => None,
        }
    }
}

impl<T> Drop for RingReader<T> {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let one = 1u64.to_ne_bytes();
        // SAFETY: 8 bytes from a live buffer to the eventfd; a failed write (the counter at
        // its maximum) leaves it readable, which wakes the thread all the same.
        unsafe {
            libc::write(
                self.shared.stop_fd.as_raw_fd(),
                one.as_ptr().cast(),
                one.len(),
            )
        };
    }
}

/// The thread: waits on the ring's descriptor, then moves every event into the queue.
fn read_ring<T>(
    mut ring: RingBuf<MapData>,
    sender: &Sender<T>,
    shared: &Shared,
    decode: fn(&[u8]) -> Option<T>,
) {
    let wait_on = |fd: libc::c_int| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let (ring_fd, stop_fd) = (ring.as_raw_fd(), shared.stop_fd.as_raw_fd());
    while !shared.stop.load(Ordering::Relaxed) {
        if shared.queued.load(Ordering::Relaxed) >= QUEUE_EVENTS {
            std::thread::sleep(FULL_WAIT);
            continue;
        }
        let mut waits = [wait_on(ring_fd), wait_on(stop_fd)];
        // SAFETY: two valid pollfds; the ring and the eventfd (and so their descriptors) live
        // as long as this function. An interrupted or failed wait just reads the ring anyway.
        unsafe { libc::poll(waits.as_mut_ptr(), waits.len() as libc::nfds_t, -1) };
        while let Some(item) = ring.next() {
            let Some(event) = decode(&item) else {
                continue;
            };
            drop(item); // frees its room in the ring
            // Counted before it is sent, so the count never goes below what is queued.
            let queued = shared.queued.fetch_add(1, Ordering::Relaxed) + 1;
            if sender.send(event).is_err() {
                return; // the agent is done with events
            }
            if queued >= QUEUE_EVENTS {
                break;
            }
        }
    }
}

/// Decodes one lifecycle record; `None` for a record too short to be an event.
pub fn decode_cgroup_event(item: &[u8]) -> Option<RingEvent> {
    let event: CgroupEvent = record(item)?;
    Some(RingEvent {
        cgroup_id: event.cgroup_id,
        at_ns: event.at_ns,
        memory_peak_pages: event.memory_peak_pages,
        made: event.kind == CGROUP_MADE,
        path: String::from_utf8_lossy(event.path_bytes()).into_owned(),
    })
}

/// Copies a record a program wrote (to a ring buffer or a walk's output) into a `T` when it is
/// long enough to be one.
pub(super) fn record<T: Copy>(item: &[u8]) -> Option<T> {
    if item.len() < std::mem::size_of::<T>() {
        return None;
    }
    // SAFETY: the program wrote a whole T (checked above) of plain integers; read_unaligned
    // copes with any alignment of the bytes.
    Some(unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) })
}

/// Decodes one process record by its leading kind; `None` for anything else.
pub fn decode_process_event(item: &[u8]) -> Option<ProcessEvent> {
    let kind = u32::from_ne_bytes(item.get(..4)?.try_into().ok()?);
    match kind {
        PROCESS_FORKED => {
            let fork: ProcessFork = record(item)?;
            Some(ProcessEvent::Forked {
                pid: fork.pid,
                parent_pid: fork.parent_pid,
            })
        }
        PROCESS_EXECED => {
            let exec: ProcessExec = record(item)?;
            let len = (exec.args_len as usize).min(exec.args.len());
            Some(ProcessEvent::Execed {
                pid: exec.pid,
                command: (len > 0).then(|| command_from_args(&exec.args[..len])),
            })
        }
        PROCESS_EXITING => {
            let exiting: ProcessExiting = record(item)?;
            Some(ProcessEvent::Exiting {
                pid: exiting.pid,
                rss_bytes: exiting.rss_pages * super::memory::page_bytes(),
            })
        }
        THREAD_ENDED => {
            let end: ThreadEnd = record(item)?;
            let comm_len = end.comm.iter().position(|&b| b == 0).unwrap_or(16);
            Some(ProcessEvent::ThreadEnded(ThreadTotals {
                tid: end.tid,
                pid: end.pid,
                exit_code: end.exit_code,
                // Every thread past do_exit's count, and none left unreleased but this one
                // (or the main thread, released only when reaped).
                last_of_process: end.live_threads == 0 && end.unreleased_threads <= 1,
                cgroup_id: end.cgroup_id,
                started_ns: end.started_ns,
                exited_ns: end.exited_ns,
                runtime_ns: end.runtime_ns,
                utime_ns: end.utime_ns,
                stime_ns: end.stime_ns,
                run_delay_ns: end.run_delay_ns,
                voluntary_switches: end.voluntary_switches,
                involuntary_switches: end.involuntary_switches,
                max_rss_bytes: end.max_rss_pages * super::memory::page_bytes(),
                sent_bytes: end.sent_bytes,
                received_bytes: end.received_bytes,
                wait_ns: end.wait_ns,
                comm: String::from_utf8_lossy(&end.comm[..comm_len]).into_owned(),
            }))
        }
        _ => None,
    }
}
