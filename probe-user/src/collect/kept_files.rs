//! Files read again every interval (a worker's memory counters and process list, a process's
//! `statm`), kept open and re-read from their start.
//!
//! Opening a cgroup or /proc file costs a path walk and an allocation: 5 to 9 µs here against
//! 0.5 to 1 µs for a `pread` of one already open, and at 1,000 workers the opens were most of
//! the agent's CPU. A kept file names the object it was opened on, not its path: a removed
//! cgroup or an ended process fails the read (`ENODEV`, `ESRCH`), and the path is opened
//! afresh, so a reused name never reads its predecessor.

use std::{
    collections::HashMap,
    fs::File,
    io::Read as _,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
};

/// Passes ([`KeptFiles::end_pass`]) a file may go unread before it is closed: a worker idle
/// for a few intervals gives its descriptors back.
const IDLE_PASSES: u64 = 8;

/// Share of the process's descriptor limit kept files may use; the rest stays for maps,
/// programs, sockets and recordings.
const BUDGET_SHARE: u64 = 2;

/// Kept files never exceed this, whatever the limit.
const MAX_KEPT: usize = 1 << 16;

/// One kept file.
struct Kept {
    file: File,
    /// The pass it was last read in.
    read_in_pass: u64,
}

/// Open files re-read from their start, within a share of the descriptor limit; beyond it a
/// path is opened, read and closed each time.
pub struct KeptFiles {
    files: HashMap<PathBuf, Kept>,
    budget: usize,
    pass: u64,
    buffer: Vec<u8>,
}

impl KeptFiles {
    /// Kept files within half the process's descriptor limit (see [`raise_fd_limit`]).
    pub fn new() -> Self {
        Self::with_budget(fd_limit().map_or(0, |limit| {
            usize::try_from(limit / BUDGET_SHARE)
                .unwrap_or(MAX_KEPT)
                .min(MAX_KEPT)
        }))
    }

    /// At most `budget` files kept open.
    pub fn with_budget(budget: usize) -> Self {
        Self {
            files: HashMap::new(),
            budget,
            pass: 0,
            buffer: Vec::with_capacity(4096),
        }
    }

    /// The whole text of the file at `path` now; `None` when it cannot be opened or read.
    pub fn read(&mut self, path: &Path) -> Option<&str> {
        self.read_into_buffer(path)?;
        std::str::from_utf8(&self.buffer).ok()
    }

    /// Reads the file into `buffer`, from the kept descriptor if there is one and it still
    /// reads, else from a fresh open (kept if the budget allows).
    fn read_into_buffer(&mut self, path: &Path) -> Option<()> {
        self.buffer.clear();
        if let Some(kept) = self.files.get_mut(path) {
            kept.read_in_pass = self.pass;
            if read_from_start(&kept.file, &mut self.buffer).is_ok() {
                return Some(());
            }
            // Its cgroup or process is gone; the path may name a new one now.
            self.files.remove(path);
            self.buffer.clear();
        }
        let mut file = File::open(path).ok()?;
        if self.files.len() < self.budget {
            read_from_start(&file, &mut self.buffer).ok()?;
            self.files.insert(
                path.to_path_buf(),
                Kept {
                    file,
                    read_in_pass: self.pass,
                },
            );
        } else {
            file.read_to_end(&mut self.buffer).ok()?;
        }
        Some(())
    }

    /// Ends one pass over the workers: files unread for [`IDLE_PASSES`] passes are closed.
    pub fn end_pass(&mut self) {
        let pass = self.pass;
        self.files
            .retain(|_, kept| pass.saturating_sub(kept.read_in_pass) < IDLE_PASSES);
        self.pass += 1;
    }

    /// How many files are open now.
    pub fn open_count(&self) -> usize {
        self.files.len()
    }
}

impl Default for KeptFiles {
    fn default() -> Self {
        Self::new()
    }
}

/// Reads the whole file from offset 0 into `buffer` (seq files regenerate their text when
/// read from the start). A read that leaves room is the end: cgroup and /proc files are seq
/// files, which fill a read to its end or theirs, so most files take one system call.
fn read_from_start(file: &File, buffer: &mut Vec<u8>) -> std::io::Result<()> {
    loop {
        if buffer.capacity() - buffer.len() < 1024 {
            buffer.reserve(buffer.capacity().max(4096));
        }
        let start = buffer.len();
        let room = buffer.capacity() - start;
        buffer.resize(buffer.capacity(), 0);
        let read = file.read_at(&mut buffer[start..], start as u64);
        let read = match read {
            Ok(read) => read,
            Err(error) => {
                buffer.truncate(start);
                return Err(error);
            }
        };
        buffer.truncate(start + read);
        if read < room {
            return Ok(());
        }
    }
}

/// The descriptor limits (soft, hard).
fn fd_limits() -> Option<libc::rlimit> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass.
    (unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0).then_some(limit)
}

/// The soft descriptor limit.
fn fd_limit() -> Option<u64> {
    fd_limits().map(|limit| limit.rlim_cur)
}

/// Raises the soft descriptor limit to the hard one, as Go's runtime does: systemd's soft
/// limit of 1,024 is for programs that use `select`. For the agents that watch every worker;
/// not for `exec`, whose command would inherit it.
pub fn raise_fd_limit() {
    if let Some(limit) = fd_limits().filter(|limit| limit.rlim_cur < limit.rlim_max) {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we pass. Failing leaves the limit as it was.
        let _ = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_file_reads_its_new_contents() {
        let dir = std::env::temp_dir().join(format!("kept-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("value");
        std::fs::write(&path, "first").unwrap();
        let mut files = KeptFiles::with_budget(4);
        assert_eq!(files.read(&path), Some("first"));
        assert_eq!(files.open_count(), 1);
        std::fs::write(&path, "second, longer").unwrap();
        assert_eq!(files.read(&path), Some("second, longer"));
        assert_eq!(files.open_count(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_ended_process_file_reads_as_gone_not_as_its_last_text() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let path = PathBuf::from(format!("/proc/{}/statm", child.id()));
        let mut files = KeptFiles::with_budget(4);
        assert!(files.read(&path).is_some_and(|statm| !statm.is_empty()));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(files.read(&path), None);
        assert_eq!(files.open_count(), 0);
    }

    #[test]
    fn beyond_the_budget_files_are_read_without_being_kept_and_idle_ones_close() {
        let dir = std::env::temp_dir().join(format!("kept-budget-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let paths: Vec<_> = (0..3).map(|i| dir.join(format!("f{i}"))).collect();
        for (i, path) in paths.iter().enumerate() {
            std::fs::write(path, "x".repeat(5000 * (i + 1))).unwrap();
        }
        let mut files = KeptFiles::with_budget(2);
        for (i, path) in paths.iter().enumerate() {
            assert_eq!(files.read(path).map(str::len), Some(5000 * (i + 1)));
        }
        assert_eq!(files.open_count(), 2);
        for _ in 0..=IDLE_PASSES {
            files.read(&paths[0]);
            files.end_pass();
        }
        assert_eq!(files.open_count(), 1);
        assert_eq!(files.read(&dir.join("missing")), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
