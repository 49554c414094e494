//! Why a thread was off the CPU: each sleep (voluntary switch-out) gets one wait reason, from
//! the system call the thread is in and, for calls on a file descriptor, the kind of file.
//! The reasons of a worker's sleeps add up to its blocked-I/O plus sleep time.

/// Blocked on a socket (recv/read/accept/connect/send on a socket fd).
pub const WAIT_NETWORK: u32 = 0;
/// File I/O, fsync, page faults on file-backed memory; any uninterruptible wait outside a
/// known call.
pub const WAIT_DISK: u32 = 1;
/// futex waits: mutexes, condition variables, Python's GIL handoff.
pub const WAIT_LOCK: u32 = 2;
/// nanosleep / clock_nanosleep.
pub const WAIT_TIMER: u32 = 3;
/// wait4 / waitid.
pub const WAIT_CHILD: u32 = 4;
/// Reading or writing a pipe or FIFO.
pub const WAIT_PIPE: u32 = 5;
/// poll / select / epoll_wait.
pub const WAIT_POLL: u32 = 6;
/// Anything else (and kernel threads).
pub const WAIT_OTHER: u32 = 7;
/// Number of reasons.
pub const WAIT_REASONS: usize = 8;
/// Reason names, in order, as shown to users and in labels.
pub const WAIT_NAMES: [&str; WAIT_REASONS] = [
    "network", "disk", "lock", "timer", "child", "pipe", "poll", "other",
];

/// What a system call tells of a sleep in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyscallWait {
    /// The call itself says why.
    Reason(u32),
    /// A call on the file descriptor in its first argument: the file's kind says why.
    OnFd,
    /// Nothing known: disk if the sleep is uninterruptible, else other.
    Unknown,
}

/// The wait a sleep in x86-64 system call `nr` is (`nr < 0`: not in a system call, e.g. a
/// page fault).
#[inline(always)]
pub const fn syscall_wait(nr: i64) -> SyscallWait {
    use SyscallWait::{OnFd, Reason, Unknown};
    match nr {
        // connect, accept, sendto, recvfrom, sendmsg, recvmsg, accept4, recvmmsg, sendmmsg:
        // calls on sockets only (any other descriptor fails before it could sleep), so what
        // the file's kind would say, without reading it.
        42 | 43 | 44 | 45 | 46 | 47 | 288 | 299 | 307 => Reason(WAIT_NETWORK),
        // read, write, pread64, pwrite64, readv, writev, sendfile, splice, preadv, pwritev,
        // preadv2, pwritev2
        0 | 1 | 17 | 18 | 19 | 20 | 40 | 275 | 295 | 296 | 327 | 328 => OnFd,
        // futex, futex_waitv
        202 | 449 => Reason(WAIT_LOCK),
        // nanosleep, clock_nanosleep
        35 | 230 => Reason(WAIT_TIMER),
        // wait4, waitid
        61 | 247 => Reason(WAIT_CHILD),
        // poll, select, epoll_wait, pselect6, ppoll, epoll_pwait, epoll_pwait2
        7 | 23 | 232 | 270 | 271 | 281 | 441 => Reason(WAIT_POLL),
        // msync, fsync, fdatasync, sync, sync_file_range, syncfs
        26 | 74 | 75 | 162 | 277 | 306 => Reason(WAIT_DISK),
        _ => Unknown,
    }
}

/// System call numbers the table below covers (x86-64 has fewer than 512).
pub const SYSCALLS: usize = 512;
/// [`SYSCALL_WAITS`] entry: nothing known.
pub const TABLE_UNKNOWN: u8 = 0;
/// [`SYSCALL_WAITS`] entry: a call on the file descriptor in the first argument.
pub const TABLE_ON_FD: u8 = 1;
/// [`SYSCALL_WAITS`] entries from here on are `TABLE_REASON + reason`.
pub const TABLE_REASON: u8 = 2;

/// [`syscall_wait`] as a table indexed by system call number: one load on the scheduler's hot
/// path instead of a chain of comparisons.
pub const SYSCALL_WAITS: [u8; SYSCALLS] = {
    let mut table = [TABLE_UNKNOWN; SYSCALLS];
    let mut nr = 0;
    while nr < SYSCALLS {
        table[nr] = match syscall_wait(nr as i64) {
            SyscallWait::Unknown => TABLE_UNKNOWN,
            SyscallWait::OnFd => TABLE_ON_FD,
            SyscallWait::Reason(reason) => TABLE_REASON + reason as u8,
        };
        nr += 1;
    }
    table
};

/// `S_IFMT` bits of an inode's `i_mode`.
const S_IFMT: u16 = 0o170000;
const S_IFSOCK: u16 = 0o140000;
const S_IFIFO: u16 = 0o010000;
const S_IFREG: u16 = 0o100000;
const S_IFBLK: u16 = 0o060000;

/// The wait of a call on a file of mode `i_mode`.
#[inline(always)]
pub fn file_wait(i_mode: u16) -> u32 {
    match i_mode & S_IFMT {
        S_IFSOCK => WAIT_NETWORK,
        S_IFIFO => WAIT_PIPE,
        S_IFREG | S_IFBLK => WAIT_DISK,
        // Terminals, eventfd, timerfd, signalfd, inotify, …
        _ => WAIT_OTHER,
    }
}

/// The wait when nothing else tells: an uninterruptible sleep is I/O.
#[inline(always)]
pub fn unknown_wait(uninterruptible: bool) -> u32 {
    if uninterruptible {
        WAIT_DISK
    } else {
        WAIT_OTHER
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_and_files_map_to_reasons() {
        assert_eq!(syscall_wait(202), SyscallWait::Reason(WAIT_LOCK));
        assert_eq!(syscall_wait(230), SyscallWait::Reason(WAIT_TIMER));
        assert_eq!(syscall_wait(61), SyscallWait::Reason(WAIT_CHILD));
        assert_eq!(syscall_wait(232), SyscallWait::Reason(WAIT_POLL));
        assert_eq!(syscall_wait(74), SyscallWait::Reason(WAIT_DISK));
        assert_eq!(syscall_wait(0), SyscallWait::OnFd);
        assert_eq!(syscall_wait(40), SyscallWait::OnFd);
        // recvfrom, sendmmsg: sockets only.
        assert_eq!(syscall_wait(45), SyscallWait::Reason(WAIT_NETWORK));
        assert_eq!(syscall_wait(307), SyscallWait::Reason(WAIT_NETWORK));
        assert_eq!(syscall_wait(-1), SyscallWait::Unknown);
        assert_eq!(file_wait(0o140777), WAIT_NETWORK);
        assert_eq!(file_wait(0o010600), WAIT_PIPE);
        assert_eq!(file_wait(0o100644), WAIT_DISK);
        assert_eq!(file_wait(0o020620), WAIT_OTHER);
        assert_eq!(file_wait(0o600), WAIT_OTHER); // anonymous inodes: eventfd, timerfd
        assert_eq!(unknown_wait(true), WAIT_DISK);
        assert_eq!(WAIT_NAMES.len(), WAIT_REASONS);
        assert_eq!(SYSCALL_WAITS[202], TABLE_REASON + WAIT_LOCK as u8);
        assert_eq!(SYSCALL_WAITS[0], TABLE_ON_FD);
        assert_eq!(SYSCALL_WAITS[500], TABLE_UNKNOWN);
    }
}
