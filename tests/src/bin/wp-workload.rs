//! Known work for the integration tests; each mode prints its own counts as one JSON line, so
//! tests compare workerprobe against what the workload itself did.
//!
//! Modes:
//! - `spin MS THREADS [asleep]`: THREADS threads each busy-loop until it has run MS milliseconds
//!   of CPU time (its own thread CPU clock), however busy the machine is. With `asleep`, first
//!   prints `{"ready":true}` and sleeps until SIGUSR1.
//! - `recv tcp|udp|unix|unixgram|seqpacket|udp-mmsg|tcp-splice|unix-splice|tcp-uring ADDR DATAGRAMS`: bind ADDR (port 0 = any; a path
//!   for unix and seqpacket), print `{"addr":…}`, then receive until EOF (stream, seqpacket)
//!   or DATAGRAMS datagrams / 2 s of silence (udp, unixgram: recv; udp-mmsg: recvmmsg in batches of 8);
//!   every mode MSG_PEEKs first. Prints `{"received_bytes","received_calls","peeked_bytes"}`,
//!   a call being one message (one datagram of a recvmmsg). `tcp-splice` and `unix-splice`
//!   read a stream with splice(2) into a pipe instead (a call being one splice), never read;
//!   `tcp-uring` with io_uring recv.
//! - `send tcp|udp|unix|unixgram|seqpacket|udp-mmsg|tcp-zerocopy|tcp-splice-in|tcp-uring ADDR
//!   TOTAL SIZES`: send TOTAL bytes in messages cycling through the comma-separated SIZES
//!   (udp-mmsg: sendmmsg of up to 8, addressed to ADDR on an unconnected socket;
//!   tcp-zerocopy: send with MSG_ZEROCOPY; tcp-splice-in: each message written into a pipe and
//!   spliced into the socket, at most 64 KiB; tcp-uring: io_uring send), then try one send
//!   that must fail. Prints `{"sent_bytes","sent_calls","failed_sends"}`.
//! - `nap COUNT MS [wait]`: sleep COUNT times MS milliseconds; prints `{"slept_ns"}`, the naps
//!   as it timed them. With `wait`: first print `{"ready":true}` and stay on the CPU, never
//!   sleeping, until SIGUSR1 arrives, so a test can start its window after the process's
//!   start-up sleeps (loading, page faults) have ended.
//! - `pinned-spin MS THREADS CPU`: like `spin` (MS of CPU time each), every thread pinned to
//!   CPU; prints the
//!   kernel's own run-queue delay of the spinning threads (`/proc/thread-self/schedstat`).
//! - `fsync DIR COUNT`: COUNT times write 4 KiB to a file in DIR and fsync it (D state).
//! - `reasons SCRATCH PEER`: after start-up (`ready`, then SIGUSR1, as `nap … wait`), one
//!   thread waits in turn on a timer (0.5 s nanosleep), the network (two pings to PEER, which
//!   answers each when it likes: one answer read with read(2), one with recv(2)), a lock
//!   (held 0.4 s by a spinning thread), a child (spinning 0.3 s), an empty pipe (written
//!   after 0.3 s by a spinning thread) and fsync in SCRATCH; the helpers never sleep. Prints
//!   what each wait took by its own clock, less the time the thread meanwhile ran or waited
//!   for a CPU (its schedstat), i.e. the time it was asleep:
//!   `{"timer_ns","network_ns","lock_ns","child_ns","pipe_ns","disk_ns"}`.
//! - `fetch STORE REQUESTS BYTES PEER UPLOAD`: REQUESTS times asks STORE for BYTES (`GET n`
//!   line, one connection each), then sends UPLOAD bytes to PEER and reads its `ok`. Prints
//!   the bytes it sent to and received from each.
//! - `fanout ADDR… BYTES`: sends BYTES to each ADDR and reads its `ok`; prints the totals.
//! - `cpu-mix MS`: one thread runs MS of CPU time, about half in user mode (a busy loop) and
//!   half in the kernel (1-byte reads of /dev/zero); prints its own `getrusage` split
//!   `{"utime_ns","stime_ns"}`.
//! - `hold MIB MS`: allocates MIB MiB and writes every page (resident), prints `ready`, then
//!   for MS of wall time spins 1 ms in every 10 (active, so a table shows it) and exits.
//! - `sendfile ADDR BYTES`: write a file of BYTES in $WP_SCRATCH, connect to ADDR over TCP and
//!   send the file with sendfile(2) (up to 1 MiB per call), then close. Prints
//!   `{"sent_bytes","sendfile_calls"}`.
//! - `forks COUNT US CGROUP`: COUNT children one after another, made straight in the cgroup2
//!   directory CGROUP (clone3 with CLONE_INTO_CGROUP), each running US µs of CPU time and
//!   exiting with its index mod 7; prints per child its pid, status, rusage and maxrss.
//! - `life MS`: one thread: spin MS of CPU time, nap 5 × MS/5, fsync 10 times in $WP_SCRATCH
//!   (default /var/tmp); prints `{"lived_ns"}`, its life from the start of `main`.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream, UdpSocket},
    os::{
        fd::AsRawFd as _,
        unix::net::{UnixListener, UnixStream},
    },
    time::Duration,
};

fn main() {
    // What `life` reports as its own life: from here, after exec and the loader.
    let born = std::time::Instant::now();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str).unwrap_or_else(|| usage());
    match arg(0) {
        "spin" => {
            if args.get(3).map(String::as_str) == Some("asleep") {
                sleep_until_go();
            }
            spin(num(arg(1)), num(arg(2)) as usize)
        }
        "recv" => recv(arg(1), arg(2), num(arg(3))),
        "send" => send(arg(1), arg(2), num(arg(3)), arg(4)),
        "pinned-spin" => pinned_spin(num(arg(1)), num(arg(2)) as usize, num(arg(3)) as usize),
        "fsync" => fsync(arg(1), num(arg(2))),
        "life" => {
            let ms = num(arg(1));
            spin_cpu(Duration::from_millis(ms));
            for _ in 0..5 {
                std::thread::sleep(Duration::from_millis(ms / 5));
            }
            fsync(&scratch_dir(), 10);
            println!(r#"{{"lived_ns":{}}}"#, born.elapsed().as_nanos());
        }
        "reasons" => reasons(arg(1), arg(2)),
        "cpu-mix" => cpu_mix(num(arg(1))),
        "hold" => hold(num(arg(1)), num(arg(2))),
        "fetch" => fetch(arg(1), num(arg(2)), num(arg(3)), arg(4), num(arg(5))),
        "fanout" => fanout(&args[1..args.len() - 1], num(&args[args.len() - 1])),
        "sendfile" => send_file(arg(1), num(arg(2))),
        "forks" => forks(num(arg(1)), num(arg(2)), arg(3)),
        "rss-at-exit" => rss_at_exit(num(arg(1))),
        "rusage-of" => rusage_of(arg(1), &args[2..]),
        "threads" => threads(
            num(arg(1)),
            num(arg(2)),
            args.get(3).map(String::as_str) == Some("main-first"),
        ),
        "tree" => tree(num(arg(2)), num(arg(3))),
        "hold-recv" => hold_recv(arg(2), num(arg(3))),
        "nap" => {
            if args.get(3).map(String::as_str) == Some("wait") {
                wait_for_go();
            }
            let mut slept = Duration::ZERO;
            for _ in 0..num(arg(1)) {
                let at = std::time::Instant::now();
                std::thread::sleep(Duration::from_millis(num(arg(2))));
                slept += at.elapsed();
            }
            println!(r#"{{"slept_ns":{}}}"#, slept.as_nanos());
        }
        _ => usage(),
    }
}

fn usage() -> ! {
    eprintln!(
        "usage: wp-workload spin MS THREADS | recv PROTO ADDR N | send PROTO ADDR TOTAL SIZES | nap COUNT MS"
    );
    std::process::exit(2)
}

fn num(text: &str) -> u64 {
    text.parse().unwrap_or_else(|_| usage())
}

/// Spins on the CPU, never sleeping, for `duration` of wall time (a helper that must not add
/// sleeps of its own to the worker's).
fn spin_wall(duration: Duration) {
    let until = std::time::Instant::now() + duration;
    while std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
}

fn reasons(scratch: &str, peer: &str) {
    let mut peer = TcpStream::connect(peer).expect("connect to the peer");
    wait_for_go();
    // Each wait by the thread's own clock, less the time it meanwhile ran (its CPU clock) and
    // waited for a CPU (the kernel's run_delay): neither is sleep, and emulation makes both
    // large (after a fork the parent's copy-on-write faults alone ran 11 ms; each wakeup
    // queues for tens).
    let timed = |work: &mut dyn FnMut()| {
        let before = ThreadClocks::now();
        work();
        ThreadClocks::now().asleep_since(&before)
    };
    let timer_ns = timed(&mut || std::thread::sleep(Duration::from_millis(500)));
    // The peer answers each ping after a quarter of a second: once read with read(2), whose
    // wait is known by the file's kind, once with recv(2), a call on sockets only.
    peer.write_all(b"ping\n").expect("send");
    let mut answer = [0u8; 1];
    let read_ns = timed(&mut || peer.read_exact(&mut answer).expect("read"));
    peer.write_all(b"ping\n").expect("send");
    let recv_ns = timed(&mut || {
        // SAFETY: one byte into a valid buffer, from our own connected socket.
        let n = unsafe { libc::recv(peer.as_raw_fd(), answer.as_mut_ptr().cast(), 1, 0) };
        assert_eq!(n, 1, "recv");
    });
    let network_ns = read_ns + recv_ns;
    let lock = std::sync::Arc::new(std::sync::Mutex::new(()));
    let held = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let (lock, held) = (lock.clone(), held.clone());
        std::thread::spawn(move || {
            let _guard = lock.lock().expect("lock");
            held.store(true, std::sync::atomic::Ordering::SeqCst);
            spin_wall(Duration::from_millis(400));
        });
    }
    while !held.load(std::sync::atomic::Ordering::SeqCst) {
        std::hint::spin_loop();
    }
    let lock_ns = timed(&mut || drop(lock.lock().expect("lock")));
    // SAFETY: the child only spins and exits; no locks are taken after fork.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let until = std::time::Instant::now() + Duration::from_millis(300);
        while std::time::Instant::now() < until {}
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(0) };
    }
    // Only the wait: the fork is on the CPU (and slow under emulation).
    let child_ns = timed(&mut || {
        let mut status = 0;
        // SAFETY: our own child; status is valid for writing.
        unsafe { libc::waitpid(pid, &mut status, 0) };
    });
    let mut fds = [0i32; 2];
    // SAFETY: pipe(2) into a two-int array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
    let (read_fd, write_fd) = (fds[0], fds[1]);
    std::thread::spawn(move || {
        spin_wall(Duration::from_millis(300));
        // SAFETY: one byte to our pipe.
        unsafe { libc::write(write_fd, b"x".as_ptr().cast(), 1) };
    });
    let pipe_ns = timed(&mut || {
        let mut byte = [0u8; 1];
        // SAFETY: one byte into a valid buffer.
        unsafe { libc::read(read_fd, byte.as_mut_ptr().cast(), 1) };
    });
    let path = std::path::Path::new(scratch).join(format!("wp-reasons-{}", std::process::id()));
    let block = vec![1u8; 4096];
    // The file's whole life, since its creation and removal wait on the journal too.
    let disk_ns = timed(&mut || {
        let mut file = std::fs::File::create(&path).expect("create");
        for _ in 0..50 {
            file.write_all(&block).expect("write");
            file.sync_all().expect("fsync");
        }
        drop(file);
        let _ = std::fs::remove_file(&path);
    });
    println!(
        r#"{{"timer_ns":{timer_ns},"network_ns":{network_ns},"lock_ns":{lock_ns},"child_ns":{child_ns},"pipe_ns":{pipe_ns},"disk_ns":{disk_ns}}}"#
    );
}

fn send_file(peer: &str, bytes: u64) {
    let path =
        std::path::Path::new(&scratch_dir()).join(format!("wp-sendfile-{}", std::process::id()));
    let block: Vec<u8> = (0..1 << 16).map(|i| (i % 251) as u8).collect();
    {
        let mut file = std::fs::File::create(&path).expect("create");
        let mut left = bytes;
        while left > 0 {
            let n = left.min(block.len() as u64) as usize;
            file.write_all(&block[..n]).expect("write");
            left -= n as u64;
        }
    }
    let file = std::fs::File::open(&path).expect("open");
    let stream = TcpStream::connect(peer).expect("connect");
    let (mut offset, mut calls): (libc::off_t, u64) = (0, 0);
    while (offset as u64) < bytes {
        let chunk = (bytes - offset as u64).min(1 << 20) as usize;
        // SAFETY: two open descriptors; offset is valid for writing.
        let sent =
            unsafe { libc::sendfile(stream.as_raw_fd(), file.as_raw_fd(), &mut offset, chunk) };
        assert!(sent > 0, "sendfile: {}", std::io::Error::last_os_error());
        calls += 1;
    }
    drop(stream);
    let _ = std::fs::remove_file(&path);
    println!(r#"{{"sent_bytes":{offset},"sendfile_calls":{calls}}}"#);
}

/// Moves a connection's bytes to its end with splice(2) into a pipe (and on to /dev/null),
/// never through a read; (bytes, splice calls from the socket).
fn splice_to_end(socket: i32) -> (u64, u64) {
    let mut pipe = [0i32; 2];
    // SAFETY: pipe(2) fills the two descriptors.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0, "pipe");
    let devnull = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/null")
        .expect("open /dev/null");
    let (mut bytes, mut calls) = (0u64, 0u64);
    loop {
        let moved = splice(socket, pipe[1], 1 << 20);
        if moved == 0 {
            break; // EOF
        }
        bytes += moved;
        calls += 1;
        let mut left = moved;
        while left > 0 {
            left -= splice(pipe[0], devnull.as_raw_fd(), left as usize);
        }
    }
    // SAFETY: the pipe's own descriptors, closed once.
    unsafe {
        libc::close(pipe[0]);
        libc::close(pipe[1]);
    }
    (bytes, calls)
}

/// One splice(2) between two unseekable descriptors: the bytes it moved.
fn splice(from: i32, to: i32, len: usize) -> u64 {
    // SAFETY: open descriptors; no offsets (neither end is seekable).
    let moved = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE,
        )
    };
    assert!(moved >= 0, "splice: {}", std::io::Error::last_os_error());
    moved as u64
}

/// Reads a connection to its end; how many bytes.
fn read_to_end(stream: &mut TcpStream) -> u64 {
    let mut buf = vec![0u8; 1 << 16];
    let mut total = 0;
    loop {
        let n = stream.read(&mut buf).expect("read");
        if n == 0 {
            return total;
        }
        total += n as u64;
    }
}

fn fetch(store: &str, requests: u64, bytes: u64, peer: &str, upload: u64) {
    let (mut store_sent, mut store_received) = (0u64, 0u64);
    for _ in 0..requests {
        let mut stream = TcpStream::connect(store).expect("connect to the store");
        let request = format!("GET {bytes}\n");
        stream.write_all(request.as_bytes()).expect("request");
        store_sent += request.len() as u64;
        store_received += read_to_end(&mut stream);
    }
    let mut stream = TcpStream::connect(peer).expect("connect to the peer");
    let payload = vec![3u8; 1 << 16];
    let mut peer_sent = 0u64;
    while peer_sent < upload {
        let n = (upload - peer_sent).min(payload.len() as u64) as usize;
        stream.write_all(&payload[..n]).expect("upload");
        peer_sent += n as u64;
    }
    stream
        .shutdown(std::net::Shutdown::Write)
        .expect("shutdown");
    let peer_received = read_to_end(&mut stream);
    println!(
        r#"{{"store_sent":{store_sent},"store_received":{store_received},"peer_sent":{peer_sent},"peer_received":{peer_received}}}"#
    );
}

fn fanout(addrs: &[String], bytes: u64) {
    let (mut sent, mut received) = (0u64, 0u64);
    let payload = vec![5u8; bytes as usize];
    for addr in addrs {
        let mut stream = TcpStream::connect(addr.as_str()).expect("connect");
        stream.write_all(&payload).expect("send");
        sent += bytes;
        stream
            .shutdown(std::net::Shutdown::Write)
            .expect("shutdown");
        received += read_to_end(&mut stream);
    }
    println!(
        r#"{{"sent_bytes":{sent},"received_bytes":{received},"peers":{}}}"#,
        addrs.len()
    );
}

/// Forks `count` children one after another straight into the cgroup2 directory `cgroup`
/// (so that its `cpu.stat` is theirs alone), each burning `burn_us` of CPU and exiting with
/// its index mod 7; prints, per child, what wait4 said of it.
fn forks(count: u64, burn_us: u64, cgroup: &str) {
    let cgroup = std::fs::File::open(cgroup).expect("open the children's cgroup");
    for index in 0..count {
        let (pid, status, usage) = fork_and_wait_in(Some(&cgroup), || {
            spin_cpu(Duration::from_micros(burn_us));
            (index % 7) as i32
        });
        println!(
            r#"{{"pid":{pid},"status":{status},"utime_us":{},"stime_us":{},"maxrss_kb":{}}}"#,
            usage.ru_utime.tv_sec * 1_000_000 + usage.ru_utime.tv_usec,
            usage.ru_stime.tv_sec * 1_000_000 + usage.ru_stime.tv_usec,
            usage.ru_maxrss,
        );
    }
}

/// A child that touches `mib` MiB, reads its own VmRSS (/proc/self/status) and exits at
/// once without freeing anything: prints its pid, that VmRSS and its ru_maxrss.
fn rss_at_exit(mib: u64) {
    let mut pipe = [0i32; 2];
    // SAFETY: fills two descriptors.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0, "pipe");
    let (pid, status, usage) = fork_and_wait(|| {
        let mut held = vec![0u8; (mib as usize) << 20];
        for page in held.chunks_mut(4096) {
            page[0] = 1;
        }
        std::hint::black_box(&held);
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let vm_rss_kb: u64 = status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        let bytes = vm_rss_kb.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer into our pipe.
        unsafe { libc::write(pipe[1], bytes.as_ptr().cast(), bytes.len()) };
        std::mem::forget(held);
        0
    });
    let mut bytes = [0u8; 8];
    // SAFETY: reads 8 bytes into a live buffer from our pipe.
    let read = unsafe { libc::read(pipe[0], bytes.as_mut_ptr().cast(), bytes.len()) };
    assert_eq!(read, 8, "the child's VmRSS");
    println!(
        r#"{{"pid":{pid},"status":{status},"vm_rss_kb":{},"maxrss_kb":{}}}"#,
        u64::from_ne_bytes(bytes),
        usage.ru_maxrss,
    );
}

/// A process tree (its name on the command line is for rules to match): forks `children`
/// processes at once, each burning `burn_ms` of CPU, burns as much itself, waits for them,
/// and prints its own and its children's rusage CPU just before it exits.
fn tree(children: u64, burn_ms: u64) {
    let mut pids = Vec::new();
    for _ in 0..children {
        // SAFETY: this process is single-threaded here; the child only computes and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            spin_cpu(Duration::from_millis(burn_ms));
            // SAFETY: leaves the child without running the parent's exit handlers.
            unsafe { libc::_exit(0) };
        }
        pids.push(pid);
    }
    spin_cpu(Duration::from_millis(burn_ms));
    for pid in pids {
        let mut status = 0;
        // SAFETY: waits for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
    }
    let cpu_us = |who| {
        // SAFETY: a zeroed rusage is valid for getrusage to fill.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: a valid `who` and a writable rusage.
        unsafe { libc::getrusage(who, &mut usage) };
        (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1_000_000
            + usage.ru_utime.tv_usec
            + usage.ru_stime.tv_usec
    };
    println!(
        r#"{{"pid":{},"self_cpu_us":{},"children_cpu_us":{}}}"#,
        std::process::id(),
        cpu_us(libc::RUSAGE_SELF),
        cpu_us(libc::RUSAGE_CHILDREN)
    );
}

/// Receives `bytes` from a TCP peer at `addr`, says how many it received (one JSON line),
/// then stays alive until its stdin closes: a process whose bytes can be read while it runs.
/// (Its first argument, a label, is for `--process` rules.)
fn hold_recv(addr: &str, bytes: u64) {
    let mut stream = TcpStream::connect(addr).expect("connect");
    let mut buf = vec![0u8; 1 << 16];
    let mut received = 0u64;
    while received < bytes {
        let n = stream.read(&mut buf).expect("read");
        assert!(n > 0, "the peer closed after {received} bytes");
        received += n as u64;
    }
    println!(r#"{{"received_bytes":{received}}}"#);
    std::io::stdout().flush().expect("flush");
    let mut rest = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut rest);
}

/// `count` threads each burning `burn_ms` of CPU; with `main_first` the main thread ends
/// (pthread_exit) as soon as they are started, and the process ends with the last of them.
fn threads(count: u64, burn_ms: u64, main_first: bool) {
    let handles: Vec<_> = (0..count)
        .map(|_| std::thread::spawn(move || spin_cpu(Duration::from_millis(burn_ms))))
        .collect();
    if main_first {
        // SAFETY: the raw exit system call ends only the calling thread (exit_group would end
        // them all); the others run on and the process ends with the last (exit status 0).
        unsafe { libc::syscall(libc::SYS_exit, 0) };
    }
    for handle in handles {
        handle.join().expect("a thread panicked");
    }
}

/// Runs `command` as a child and waits for it; writes what wait4 said of its whole life (its
/// CPU and that of the children it waited for) to `DIR/<child pid>.json`, then exits as it
/// did. Its output is the command's.
fn rusage_of(dir: &str, command: &[String]) -> ! {
    let child = std::process::Command::new(&command[0])
        .args(&command[1..])
        .spawn()
        .expect("start the command");
    let pid = child.id() as i32;
    let (status, usage) = reap_when_off_cpu(pid);
    // This process's own CPU since its fork, before its exec too (in its parent's image).
    // SAFETY: a zeroed rusage is valid for getrusage to fill.
    let mut own: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid out pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut own) };
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 / 1e6;
    let record = format!(
        r#"{{"pid":{pid},"args":{:?},"cpu_s":{},"own_cpu_s":{},"status":{status}}}"#,
        command.join(" "),
        seconds(usage.ru_utime) + seconds(usage.ru_stime),
        seconds(own.ru_utime) + seconds(own.ru_stime)
    );
    std::fs::write(format!("{dir}/{pid}.json"), record).expect("write the rusage record");
    std::process::exit(if status & 0x7f == 0 {
        (status >> 8) & 0xff
    } else {
        128 + (status & 0x7f)
    })
}

/// Forks a child that runs `work` and exits with its result; returns the child's pid, wait
/// status and rusage.
fn fork_and_wait(work: impl FnOnce() -> i32) -> (i32, i32, libc::rusage) {
    fork_and_wait_in(None, work)
}

/// [`fork_and_wait`] with the child made in `cgroup` (a cgroup2 directory), when given,
/// rather than in ours.
fn fork_and_wait_in(
    cgroup: Option<&std::fs::File>,
    work: impl FnOnce() -> i32,
) -> (i32, i32, libc::rusage) {
    use std::os::fd::AsRawFd as _;
    /// `CLONE_INTO_CGROUP` (5.7+), as clone3's 64-bit flags take it.
    const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
    let pid = match cgroup {
        // SAFETY: this process is single-threaded here; the child only computes and exits.
        None => unsafe { libc::fork() },
        Some(cgroup) => {
            // SAFETY: zeroed clone_args ask for a plain fork.
            let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
            args.flags = CLONE_INTO_CGROUP;
            args.exit_signal = libc::SIGCHLD as u64;
            args.cgroup = cgroup.as_raw_fd() as u64;
            // SAFETY: a fork (no new stack, no shared memory) of a single-threaded process,
            // as above; the arguments live across the call.
            unsafe {
                libc::syscall(
                    libc::SYS_clone3,
                    &raw mut args,
                    std::mem::size_of::<libc::clone_args>(),
                ) as i32
            }
        }
    };
    assert!(pid >= 0, "fork failed: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = work();
        // SAFETY: leaves the child without running the parent's exit handlers.
        unsafe { libc::_exit(code) };
    }
    let (status, usage) = reap_when_off_cpu(pid);
    (pid, status, usage)
}

/// Waits for child `pid` to exit, then for its last slice (a child is a zombie, and wait4
/// could reap it, while its exit path still runs: on a slow machine milliseconds of CPU that
/// rusage would miss), then reaps it: its status and whole rusage.
fn reap_when_off_cpu(pid: i32) -> (i32, libc::rusage) {
    // SAFETY: a zeroed siginfo is valid for waitid to fill.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waits, without reaping, for our own child.
    unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOWAIT,
        )
    };
    let runtime = || {
        std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
            .ok()
            .and_then(|text| text.split_whitespace().next()?.parse::<u64>().ok())
    };
    let mut last = runtime();
    for _ in 0..200 {
        std::thread::sleep(Duration::from_millis(2));
        let now = runtime();
        if now == last {
            break;
        }
        last = now;
    }
    let mut status = 0;
    // SAFETY: a zeroed rusage is valid for wait4 to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: reaps our own child, with writable status and rusage.
    unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    (status, usage)
}

fn cpu_mix(ms: u64) {
    let half = Duration::from_millis(ms / 2);
    spin_cpu(half);
    let zero = std::fs::File::open("/dev/zero").expect("open /dev/zero");
    let until = thread_cpu_time() + half;
    let mut byte = [0u8; 1];
    while thread_cpu_time() < until {
        for _ in 0..1000 {
            std::io::Read::read(&mut &zero, &mut byte).expect("read");
        }
    }
    // SAFETY: a zeroed rusage is valid for getrusage to fill.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_SELF with a valid out pointer.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1_000;
    println!(
        r#"{{"utime_ns":{},"stime_ns":{}}}"#,
        ns(usage.ru_utime),
        ns(usage.ru_stime)
    );
}

/// Set by the SIGUSR1 handler.
static GO: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_go(_signal: libc::c_int) {
    GO.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Prints that start-up is over, then spins (on the CPU, no system call, never asleep) until
/// SIGUSR1 arrives.
fn wait_for_go() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGUSR1, on_go as *const () as libc::sighandler_t) };
    announce_ready();
    while !GO.load(std::sync::atomic::Ordering::SeqCst) {
        std::hint::spin_loop();
    }
}

fn hold(mib: u64, ms: u64) {
    let mut held = vec![0u8; (mib as usize) << 20];
    for page in held.chunks_mut(4096) {
        page[0] = 1;
    }
    std::hint::black_box(&held);
    announce_ready();
    // Active in any window of 10 ms or more, at a tenth of a core.
    let until = std::time::Instant::now() + Duration::from_millis(ms);
    while std::time::Instant::now() < until {
        spin_wall(Duration::from_millis(1));
        std::thread::sleep(Duration::from_millis(9));
    }
    std::hint::black_box(&held);
}

/// Prints that start-up is over, then sleeps (off the CPU, its slices all accounted) until
/// SIGUSR1.
fn sleep_until_go() {
    // SAFETY: plain signal-set calls on a zeroed set; SIGUSR1 is blocked before anyone is
    // told to send it, so it waits for sigwait, which takes it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        announce_ready();
        let mut signal = 0;
        libc::sigwait(&set, &mut signal);
    }
}

fn announce_ready() {
    println!(r#"{{"ready":true}}"#);
    let _ = std::io::stdout().flush();
}

/// Where file I/O goes: `$WP_SCRATCH` (a disk-backed directory the VM tests pass, since their
/// /var/tmp is memory), else /var/tmp.
fn scratch_dir() -> String {
    std::env::var("WP_SCRATCH").unwrap_or_else(|_| "/var/tmp".into())
}

/// CPU time this thread has run so far (CLOCK_THREAD_CPUTIME_ID).
fn thread_cpu_time() -> Duration {
    // SAFETY: a zeroed timespec is valid for clock_gettime to fill.
    let mut now: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and a writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// Busy-loops on this thread until it has run `cpu` more CPU time: a fixed amount of work
/// however loaded the machine (or slow the emulated CPU) is.
fn spin_cpu(cpu: Duration) -> u64 {
    let until = thread_cpu_time() + cpu;
    let mut x = 0u64;
    while thread_cpu_time() < until {
        for i in 0..10_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
    }
    x
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET stays within it for small CPU numbers.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set),
            0,
            "pin"
        );
    }
}

/// The calling thread's run-queue delay so far (ns) and how many times it got a CPU after
/// waiting for one, from the kernel's schedstat.
fn own_schedstat() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    let field = |n| {
        text.split_whitespace()
            .nth(n)
            .and_then(|v| v.parse().ok())
            .expect("schedstat field")
    };
    (field(1), field(2))
}

/// The calling thread's run-queue delay so far, from the kernel's schedstat (ns).
fn own_run_delay_ns() -> u64 {
    own_schedstat().0
}

/// The calling thread's wall clock, CPU time and run-queue delay, read at one instant.
struct ThreadClocks {
    wall: std::time::Instant,
    cpu: Duration,
    run_delay_ns: u64,
}

impl ThreadClocks {
    /// Reads the three together. The kernel adds a run-queue wait to run_delay when the
    /// thread gets its CPU back, so a wait between the run_delay read and the wall clock's
    /// would count on one side of a window only (a 25 ms one, just after a fork, once made
    /// a timed wait short by as much in a loaded 6.12 VM): read again until no such return
    /// (schedstat's count of them) fell between.
    fn now() -> Self {
        loop {
            let (run_delay_ns, returns) = own_schedstat();
            let wall = std::time::Instant::now();
            let cpu = thread_cpu_time();
            if own_schedstat().1 == returns {
                return Self {
                    wall,
                    cpu,
                    run_delay_ns,
                };
            }
        }
    }

    /// The time since `before` the thread was neither on a CPU nor waiting for one: asleep.
    fn asleep_since(&self, before: &Self) -> u64 {
        let took = self.wall - before.wall;
        let ran = self.cpu - before.cpu;
        let queued_ns = self.run_delay_ns - before.run_delay_ns;
        (took.as_nanos() as u64).saturating_sub(ran.as_nanos() as u64 + queued_ns)
    }
}

fn pinned_spin(ms: u64, threads: usize, cpu: usize) {
    pin_to(cpu);
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            std::thread::spawn(move || {
                let born = std::time::Instant::now();
                spin_cpu(Duration::from_millis(ms));
                (own_run_delay_ns(), born.elapsed().as_nanos() as u64)
            })
        })
        .collect();
    let (mut run_delay_ns, mut life_ns) = (0, 0);
    for worker in workers {
        let (delay, life) = worker.join().expect("join");
        run_delay_ns += delay;
        life_ns += life;
    }
    println!(r#"{{"spinner_run_delay_ns":{run_delay_ns},"spinner_life_ns":{life_ns}}}"#);
}

fn fsync(dir: &str, count: u64) {
    let path = std::path::Path::new(dir).join(format!("wp-fsync-{}", std::process::id()));
    let mut file = std::fs::File::create(&path).expect("create");
    let block = vec![1u8; 4096];
    for _ in 0..count {
        file.write_all(&block).expect("write");
        file.sync_all().expect("fsync");
    }
    drop(file);
    let _ = std::fs::remove_file(&path);
}

fn spin(ms: u64, threads: usize) {
    let workers: Vec<_> = (0..threads)
        .map(|_| std::thread::spawn(move || spin_cpu(Duration::from_millis(ms))))
        .collect();
    for worker in workers {
        let _ = worker.join();
    }
}

fn peek(fd: i32, buf: &mut [u8]) -> u64 {
    // SAFETY: buf is valid for buf.len() bytes.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK) };
    n.max(0) as u64
}

fn recv(proto: &str, addr: &str, datagrams: u64) {
    let mut buf = vec![0u8; 1 << 20];
    let (mut bytes, mut calls, mut peeked) = (0u64, 0u64, 0u64);
    match proto {
        "tcp" | "unix" => {
            let mut stream: Box<dyn std::io::Read> = if proto == "tcp" {
                let listener = TcpListener::bind(addr).expect("bind tcp");
                announce(&listener.local_addr().expect("addr").to_string());
                let (stream, _) = listener.accept().expect("accept");
                peeked += peek(stream.as_raw_fd(), &mut buf[..4096]);
                Box::new(stream)
            } else {
                let listener = UnixListener::bind(addr).expect("bind unix");
                announce(addr);
                let (stream, _) = listener.accept().expect("accept");
                peeked += peek(stream.as_raw_fd(), &mut buf[..4096]);
                Box::new(stream)
            };
            loop {
                let n = stream.read(&mut buf).expect("read");
                if n == 0 {
                    break; // EOF: a zero-byte read is not counted by the kernel side either
                }
                bytes += n as u64;
                calls += 1;
            }
        }
        "tcp-uring" => {
            let listener = TcpListener::bind(addr).expect("bind tcp");
            announce(&listener.local_addr().expect("addr").to_string());
            let (stream, _) = listener.accept().expect("accept");
            peeked += peek(stream.as_raw_fd(), &mut buf[..4096]);
            let mut ring = io_uring::IoUring::new(8).expect("io_uring");
            loop {
                let recv = io_uring::opcode::Recv::new(
                    io_uring::types::Fd(stream.as_raw_fd()),
                    buf.as_mut_ptr(),
                    buf.len() as u32,
                )
                .build();
                let n = uring_result(&mut ring, recv).expect("io_uring recv");
                if n == 0 {
                    break;
                }
                bytes += n as u64;
                calls += 1;
            }
        }
        "tcp-splice" | "unix-splice" => {
            let buf = &mut buf[..4096];
            let stream: Box<dyn std::os::fd::AsRawFd> = if proto == "tcp-splice" {
                let listener = TcpListener::bind(addr).expect("bind tcp");
                announce(&listener.local_addr().expect("addr").to_string());
                Box::new(listener.accept().expect("accept").0)
            } else {
                let listener = UnixListener::bind(addr).expect("bind unix");
                announce(addr);
                Box::new(listener.accept().expect("accept").0)
            };
            peeked += peek(stream.as_raw_fd(), buf);
            (bytes, calls) = splice_to_end(stream.as_raw_fd());
        }
        "unixgram" => {
            let socket = std::os::unix::net::UnixDatagram::bind(addr).expect("bind unixgram");
            announce(addr);
            socket
                .set_read_timeout(Some(Duration::from_secs(2)))
                .expect("timeout");
            loop {
                let got = peek(socket.as_raw_fd(), &mut buf[..65536]);
                if got > 0 {
                    peeked += got;
                    break;
                }
            }
            while calls < datagrams {
                match socket.recv(&mut buf) {
                    Ok(n) => {
                        bytes += n as u64;
                        calls += 1;
                    }
                    Err(_) => break,
                }
            }
        }
        "seqpacket" => {
            let listener = seqpacket_listen(addr);
            announce(addr);
            // SAFETY: accept on our listening descriptor.
            let conn =
                unsafe { libc::accept(listener, std::ptr::null_mut(), std::ptr::null_mut()) };
            assert!(conn >= 0, "accept seqpacket");
            peeked += peek(conn, &mut buf[..4096]);
            loop {
                // SAFETY: buf is valid for its length.
                let n = unsafe { libc::recv(conn, buf.as_mut_ptr().cast(), buf.len(), 0) };
                assert!(n >= 0, "recv seqpacket");
                if n == 0 {
                    break;
                }
                bytes += n as u64;
                calls += 1;
            }
        }
        "udp-mmsg" => {
            let socket = UdpSocket::bind(addr).expect("bind udp");
            set_rcvbuf(socket.as_raw_fd(), 8 << 20);
            announce(&socket.local_addr().expect("addr").to_string());
            socket
                .set_read_timeout(Some(Duration::from_secs(2)))
                .expect("timeout");
            loop {
                let got = peek(socket.as_raw_fd(), &mut buf[..65536]);
                if got > 0 {
                    peeked += got;
                    break;
                }
            }
            while calls < datagrams {
                match recv_batch(socket.as_raw_fd(), &mut buf) {
                    Some(lengths) => {
                        bytes += lengths.iter().sum::<u64>();
                        calls += lengths.len() as u64;
                    }
                    None => break,
                }
            }
        }
        "udp" => {
            let socket = UdpSocket::bind(addr).expect("bind udp");
            set_rcvbuf(socket.as_raw_fd(), 8 << 20);
            announce(&socket.local_addr().expect("addr").to_string());
            socket
                .set_read_timeout(Some(Duration::from_secs(2)))
                .expect("timeout");
            peeked += {
                let mut waiting = true;
                let mut got = 0;
                while waiting {
                    got = peek(socket.as_raw_fd(), &mut buf);
                    waiting = got == 0;
                }
                got
            };
            while calls < datagrams {
                match socket.recv(&mut buf) {
                    Ok(n) => {
                        bytes += n as u64;
                        calls += 1;
                    }
                    Err(_) => break, // silence: the rest was dropped on the way
                }
            }
        }
        _ => usage(),
    }
    println!(r#"{{"received_bytes":{bytes},"received_calls":{calls},"peeked_bytes":{peeked}}}"#);
}

/// Datagrams in one recvmmsg or sendmmsg.
const BATCH: usize = 8;

/// One recvmmsg of up to [`BATCH`] datagrams of up to 64 KiB each into `buf`; their lengths, or
/// `None` after the socket's timeout.
fn recv_batch(fd: i32, buf: &mut [u8]) -> Option<Vec<u64>> {
    let slot = 65536;
    // SAFETY: zeroed iovec and mmsghdr are valid; each iovec points into its own part of buf.
    let mut iovecs: Vec<libc::iovec> = (0..BATCH)
        .map(|i| libc::iovec {
            iov_base: buf[i * slot..].as_mut_ptr().cast(),
            iov_len: slot,
        })
        .collect();
    let mut messages: Vec<libc::mmsghdr> = iovecs
        .iter_mut()
        .map(|iov| {
            // SAFETY: an all-zero mmsghdr is valid.
            let mut message: libc::mmsghdr = unsafe { std::mem::zeroed() };
            message.msg_hdr.msg_iov = iov;
            message.msg_hdr.msg_iovlen = 1;
            message
        })
        .collect();
    // SAFETY: messages and their buffers stay valid for the call.
    let n = unsafe {
        libc::recvmmsg(
            fd,
            messages.as_mut_ptr(),
            BATCH as u32,
            libc::MSG_WAITFORONE,
            std::ptr::null_mut(),
        )
    };
    (n > 0).then(|| {
        messages[..n as usize]
            .iter()
            .map(|m| u64::from(m.msg_len))
            .collect()
    })
}

/// A listening SOCK_SEQPACKET unix socket at `path`.
fn seqpacket_listen(path: &str) -> i32 {
    let (addr, len) = unix_addr(path);
    // SAFETY: plain socket calls on a descriptor we own, with a valid address.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0);
        assert!(fd >= 0, "socket seqpacket");
        assert_eq!(
            libc::bind(fd, (&addr as *const libc::sockaddr_un).cast(), len),
            0,
            "bind seqpacket"
        );
        assert_eq!(libc::listen(fd, 1), 0, "listen seqpacket");
        fd
    }
}

/// A SOCK_SEQPACKET unix socket connected to `path`.
fn seqpacket_connect(path: &str) -> i32 {
    let (addr, len) = unix_addr(path);
    // SAFETY: as above.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0);
        assert!(fd >= 0, "socket seqpacket");
        assert_eq!(
            libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), len),
            0,
            "connect seqpacket"
        );
        fd
    }
}

fn unix_addr(path: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: an all-zero sockaddr_un is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (dst, src) in addr.sun_path.iter_mut().zip(path.as_bytes()) {
        *dst = *src as libc::c_char;
    }
    (
        addr,
        std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
    )
}

/// One sendmmsg of `sizes.len()` datagrams from `payload` to `to`; how many it sent.
fn send_batch(fd: i32, to: &std::net::SocketAddr, payload: &[u8], sizes: &[usize]) -> usize {
    let std::net::SocketAddr::V4(v4) = to else {
        panic!("udp-mmsg sends to IPv4 only")
    };
    // SAFETY: an all-zero sockaddr_in is valid.
    let mut addr: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    addr.sin_family = libc::AF_INET as libc::sa_family_t;
    addr.sin_port = v4.port().to_be();
    addr.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
    let mut iovecs: Vec<libc::iovec> = sizes
        .iter()
        .map(|&size| libc::iovec {
            iov_base: payload.as_ptr() as *mut _,
            iov_len: size,
        })
        .collect();
    let mut messages: Vec<libc::mmsghdr> = iovecs
        .iter_mut()
        .map(|iov| {
            // SAFETY: an all-zero mmsghdr is valid.
            let mut message: libc::mmsghdr = unsafe { std::mem::zeroed() };
            // The same address on every message: the kernel's fast path for repeats.
            message.msg_hdr.msg_name = (&mut addr as *mut libc::sockaddr_in).cast();
            message.msg_hdr.msg_namelen = std::mem::size_of::<libc::sockaddr_in>() as u32;
            message.msg_hdr.msg_iov = iov;
            message.msg_hdr.msg_iovlen = 1;
            message
        })
        .collect();
    // SAFETY: messages, the address and the payload stay valid for the call.
    let n = unsafe { libc::sendmmsg(fd, messages.as_mut_ptr(), messages.len() as u32, 0) };
    assert!(n > 0, "sendmmsg: {}", std::io::Error::last_os_error());
    n as usize
}

fn set_rcvbuf(fd: i32, bytes: i32) {
    // SAFETY: passes a valid int to setsockopt.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&bytes as *const i32).cast(),
            4,
        )
    };
}

fn announce(addr: &str) {
    println!(r#"{{"addr":"{addr}"}}"#);
    let _ = std::io::stdout().flush();
}

fn send(proto: &str, addr: &str, total: u64, sizes: &str) {
    let sizes: Vec<usize> = sizes.split(',').map(|s| num(s) as usize).collect();
    let payload = vec![7u8; *sizes.iter().max().unwrap_or_else(|| usage())];
    let (mut bytes, mut calls) = (0u64, 0u64);
    let mut write_all = |write: &mut dyn FnMut(&[u8]) -> std::io::Result<usize>| {
        let mut next = 0;
        while bytes < total {
            let size = sizes[next % sizes.len()].min((total - bytes) as usize);
            next += 1;
            let n = write(&payload[..size]).expect("send");
            bytes += n as u64;
            calls += 1;
        }
    };
    let failed = match proto {
        "tcp" => {
            let mut stream = TcpStream::connect(addr).expect("connect tcp");
            write_all(&mut |buf| stream.write(buf));
            stream
                .shutdown(std::net::Shutdown::Write)
                .expect("shutdown");
            // A send after shutdown fails with EPIPE and must count nothing.
            failing_send(stream.as_raw_fd())
        }
        "tcp-zerocopy" => {
            let stream = TcpStream::connect(addr).expect("connect tcp");
            let fd = stream.as_raw_fd();
            let on: libc::c_int = 1;
            // SAFETY: an int option on our socket.
            let set = unsafe {
                libc::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    libc::SO_ZEROCOPY,
                    (&on as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as u32,
                )
            };
            assert_eq!(set, 0, "SO_ZEROCOPY: {}", std::io::Error::last_os_error());
            let mut sends = 0u64;
            write_all(&mut |buf| {
                sends += 1;
                if sends.is_multiple_of(32) {
                    drain_error_queue(fd);
                }
                // SAFETY: buf is valid for its length.
                let n =
                    unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_ZEROCOPY) };
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            drain_error_queue(fd);
            stream
                .shutdown(std::net::Shutdown::Write)
                .expect("shutdown");
            failing_send(fd)
        }
        "tcp-splice-in" => {
            // Each chunk is written into a pipe, then spliced from the pipe into the socket.
            let stream = TcpStream::connect(addr).expect("connect tcp");
            let mut pipe = [0i32; 2];
            // SAFETY: pipe(2) fills the two descriptors.
            assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0, "pipe");
            write_all(&mut |buf| {
                let buf = &buf[..buf.len().min(65536)]; // what a default pipe holds
                // SAFETY: buf is valid for its length; the pipe is ours.
                let written = unsafe { libc::write(pipe[1], buf.as_ptr().cast(), buf.len()) };
                assert_eq!(written, buf.len() as isize, "write to the pipe");
                let mut left = buf.len();
                while left > 0 {
                    left -= splice(pipe[0], stream.as_raw_fd(), left) as usize;
                }
                Ok(buf.len())
            });
            stream
                .shutdown(std::net::Shutdown::Write)
                .expect("shutdown");
            failing_send(stream.as_raw_fd())
        }
        "tcp-uring" => {
            let stream = TcpStream::connect(addr).expect("connect tcp");
            let mut ring = io_uring::IoUring::new(8).expect("io_uring");
            write_all(&mut |buf| {
                let send = io_uring::opcode::Send::new(
                    io_uring::types::Fd(stream.as_raw_fd()),
                    buf.as_ptr(),
                    buf.len() as u32,
                )
                .build();
                uring_result(&mut ring, send)
            });
            stream
                .shutdown(std::net::Shutdown::Write)
                .expect("shutdown");
            failing_send(stream.as_raw_fd())
        }
        "unix" => {
            let mut stream = UnixStream::connect(addr).expect("connect unix");
            write_all(&mut |buf| stream.write(buf));
            stream
                .shutdown(std::net::Shutdown::Write)
                .expect("shutdown");
            failing_send(stream.as_raw_fd())
        }
        "unixgram" => {
            let socket = std::os::unix::net::UnixDatagram::unbound().expect("unixgram");
            socket.connect(addr).expect("connect unixgram");
            write_all(&mut |buf| socket.send(buf));
            // Not connected, no address: ENOTCONN.
            let unconnected = std::os::unix::net::UnixDatagram::unbound().expect("unixgram");
            failing_send(unconnected.as_raw_fd())
        }
        "seqpacket" => {
            let fd = seqpacket_connect(addr);
            write_all(&mut |buf| {
                // SAFETY: buf is valid for its length.
                let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), 0) };
                if n < 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(n as usize)
                }
            });
            // SAFETY: shutdown of our descriptor.
            unsafe { libc::shutdown(fd, libc::SHUT_WR) };
            failing_send(fd)
        }
        "udp-mmsg" => {
            let socket = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
            let to: std::net::SocketAddr = addr.parse().expect("udp address");
            let mut next = 0;
            while bytes < total {
                let mut batch = Vec::new();
                let mut planned = bytes;
                while batch.len() < BATCH && planned < total {
                    let size = sizes[next % sizes.len()].min((total - planned) as usize);
                    next += 1;
                    planned += size as u64;
                    batch.push(size);
                }
                std::thread::sleep(Duration::from_micros(20 * batch.len() as u64));
                let sent = send_batch(socket.as_raw_fd(), &to, &payload, &batch);
                bytes += batch[..sent].iter().map(|&size| size as u64).sum::<u64>();
                calls += sent as u64;
                // What was not sent goes again in the next batch.
                next -= batch.len() - sent;
            }
            let unconnected = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
            failing_send(unconnected.as_raw_fd())
        }
        "udp" => {
            let socket = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
            socket.connect(addr).expect("connect udp");
            write_all(&mut |buf| {
                // Pace datagrams so the receiver's buffer never overflows.
                std::thread::sleep(Duration::from_micros(20));
                socket.send(buf)
            });
            // An unconnected socket with no address cannot send: EDESTADDRREQ.
            let unconnected = UdpSocket::bind("127.0.0.1:0").expect("bind udp");
            failing_send(unconnected.as_raw_fd())
        }
        _ => usage(),
    };
    println!(r#"{{"sent_bytes":{bytes},"sent_calls":{calls},"failed_sends":{failed}}}"#);
}

/// Reads the zerocopy completions off a socket's error queue (they would otherwise fill it).
fn drain_error_queue(fd: i32) {
    let mut control = [0u8; 256];
    loop {
        // SAFETY: an all-zero msghdr is valid; control outlives the call.
        let mut message: libc::msghdr = unsafe { std::mem::zeroed() };
        message.msg_control = control.as_mut_ptr().cast();
        message.msg_controllen = control.len();
        // SAFETY: message points at valid memory.
        let n = unsafe { libc::recvmsg(fd, &mut message, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
        if n < 0 {
            return;
        }
    }
}

/// Submits one io_uring operation and waits for it: its result as a read or write's.
fn uring_result(
    ring: &mut io_uring::IoUring,
    entry: io_uring::squeue::Entry,
) -> std::io::Result<usize> {
    // SAFETY: the buffer the entry points at outlives the wait below.
    unsafe { ring.submission().push(&entry) }.expect("submission queue full");
    ring.submit_and_wait(1)?;
    let result = ring.completion().next().expect("a completion").result();
    if result < 0 {
        Err(std::io::Error::from_raw_os_error(-result))
    } else {
        Ok(result as usize)
    }
}

/// Makes one send that the kernel refuses; returns 1 if it failed as expected.
fn failing_send(fd: i32) -> u64 {
    let byte = [1u8];
    // SAFETY: one valid byte; MSG_NOSIGNAL keeps EPIPE from raising SIGPIPE.
    let n = unsafe { libc::send(fd, byte.as_ptr().cast(), 1, libc::MSG_NOSIGNAL) };
    u64::from(n < 0)
}
