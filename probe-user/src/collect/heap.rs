//! The agent's own memory: gives the pages of a burst's freed allocations back to the kernel.
//!
//! glibc keeps freed memory that is not at the top of its heap: after a burst (thousands of
//! workers ending while nobody reads the output) the agent stayed at its peak, 14 MB above
//! where it started, with most of that free. `malloc_trim` releases such pages, but each call
//! madvises every free page, which under emulation stalled the agent when done every second.
//! So it runs only when the free memory the agent holds has grown by [`TRIM_AFTER_BYTES`]
//! since the last trim: once after a burst, never in a steady state.

use std::time::{Duration, Instant};

/// Free but resident memory that must accumulate before the next trim.
const TRIM_AFTER_BYTES: u64 = 4 << 20;
/// How often, at most, the held memory is measured: mallinfo2 walks the free lists, about 3%
/// of the agent's CPU at 1,000 workers when done every second. A burst's memory
/// goes back within this long of its end.
const CHECK_EVERY: Duration = Duration::from_secs(5);

/// Decides when to give freed heap memory back (see the module's doc).
pub struct HeapReturn {
    /// Free-but-resident bytes right after the last trim (or at start).
    idle_after_trim_bytes: u64,
    checked_at: Instant,
}

impl HeapReturn {
    /// Starts from what the agent holds now.
    pub fn new() -> Self {
        Self {
            idle_after_trim_bytes: idle_resident_bytes().unwrap_or(0),
            checked_at: Instant::now(),
        }
    }

    /// Trims if enough freed memory has gathered; at most one check per [`CHECK_EVERY`].
    pub fn maybe_trim(&mut self) {
        if self.checked_at.elapsed() < CHECK_EVERY {
            return;
        }
        self.checked_at = Instant::now();
        let Some(idle_bytes) = idle_resident_bytes() else {
            return;
        };
        if idle_bytes < self.idle_after_trim_bytes {
            // Freed memory was reused: the next burst is measured from here.
            self.idle_after_trim_bytes = idle_bytes;
        }
        if idle_bytes < self.idle_after_trim_bytes + TRIM_AFTER_BYTES {
            return;
        }
        // SAFETY: malloc_trim only gives free memory back to the kernel.
        unsafe { libc::malloc_trim(0) };
        self.idle_after_trim_bytes = idle_resident_bytes().unwrap_or(idle_bytes);
    }
}

/// Anonymous resident memory not in use by an allocation: freed heap pages glibc keeps, plus
/// a constant share for thread stacks. None when /proc cannot be read.
fn idle_resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let mut pages = statm.split_whitespace().skip(1).map(str::parse::<u64>);
    let (resident, shared) = (pages.next()?.ok()?, pages.next()?.ok()?);
    let anon_bytes = resident.saturating_sub(shared) * super::memory::page_bytes();
    // SAFETY: mallinfo2 only reads the allocator's statistics.
    let heap = unsafe { libc::mallinfo2() };
    let in_use_bytes = (heap.uordblks + heap.hblkhd) as u64;
    Some(anon_bytes.saturating_sub(in_use_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_pages_are_counted_as_idle_and_given_back() {
        // Many small allocations, then free all but every 64th: the survivors pin the heap's
        // top, so only a trim can release the pages between them.
        let mut blocks: Vec<Vec<u8>> = (0..40_000).map(|_| vec![1u8; 1_000]).collect();
        let before = idle_resident_bytes().expect("statm and mallinfo2");
        let mut kept = Vec::new();
        for (index, block) in blocks.drain(..).enumerate() {
            if index % 64 == 0 {
                kept.push(block);
            }
        }
        let freed = idle_resident_bytes().expect("statm and mallinfo2");
        assert!(
            freed >= before + 20_000_000,
            "40 MB freed but idle memory went from {before} to {freed} bytes"
        );
        let mut heap = HeapReturn {
            idle_after_trim_bytes: before,
            checked_at: Instant::now() - CHECK_EVERY,
        };
        heap.maybe_trim();
        let after = idle_resident_bytes().expect("statm and mallinfo2");
        assert!(
            after + 20_000_000 <= freed,
            "the trim gave back too little: idle {freed} -> {after} bytes"
        );
        // The next trim waits for a new burst, measured from after this one.
        assert!(heap.idle_after_trim_bytes + 20_000_000 <= freed);
        drop(kept);
    }
}
