//! `workerprobe top` as a person sees it: the interactive screen in a real terminal (a tmux
//! pane), driven by keys; and the plain tables it still prints when piped.
//!
//! Needs root and tmux (`cargo xtask setup` installs it). Never skips.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use workerprobe_tests::{TestCgroup, require_root, workerprobe_path};

/// The start of the key help line, which the screen shows once it is up.
const KEY_HELP: &str = "↑/↓ select   sort: c CPU%";

/// How long the agent may take to load its programs and draw.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a key may take to show on screen (a few 500ms ticks).
const KEY_TIMEOUT: Duration = Duration::from_secs(10);

/// A tmux server of its own (so no user configuration or session is touched) running one
/// command in a pane 40 lines high. Dropping it kills the server, and with it the command.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// Starts `command` (run by `sh -c`) in a detached session `width` columns wide, named
    /// for this process and `test`, so tests running side by side each have their own
    /// server. The pane stays after the command exits, so its exit and the terminal state it
    /// left can be read.
    fn start_with_width(test: &str, command: &str, width: u16) -> Self {
        require_root();
        let found = Command::new("tmux").arg("-V").output();
        assert!(
            found.is_ok_and(|output| output.status.success()),
            "tmux is missing: these tests drive `workerprobe top` in a real terminal; install it \
             (`cargo xtask setup` does, or `apt-get install -y tmux`)"
        );
        let name = format!("wp-tui-{}-{test}", std::process::id());
        let tmux = Self {
            socket: name.clone(),
        };
        // One tmux invocation: remain-on-exit is set before the session's command starts.
        tmux.run(&[
            "start-server",
            ";",
            "set-option",
            "-g",
            "remain-on-exit",
            "on",
            ";",
            "new-session",
            "-d",
            "-s",
            &name,
            "-x",
            &width.to_string(),
            "-y",
            "40",
            command,
        ]);
        tmux
    }

    /// Runs a tmux command against this server; panics naming it if it fails.
    fn run(&self, args: &[&str]) -> String {
        let output = self
            .command(args)
            .output()
            .unwrap_or_else(|err| panic!("run tmux {args:?}: {err}"));
        assert!(
            output.status.success(),
            "tmux {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("tmux");
        // -u: the pane holds UTF-8 (arrows, bars); -f /dev/null: no user configuration.
        command
            .args(["-u", "-f", "/dev/null", "-L", &self.socket])
            .args(args);
        command
    }

    /// The text of the pane.
    fn capture(&self) -> String {
        self.run(&["capture-pane", "-p", "-t", &self.socket])
    }

    /// Sends keys (tmux key names: `w`, `Enter`, `C-c`, or literal text).
    fn send(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", &self.socket];
        args.extend_from_slice(keys);
        self.run(&args);
    }

    /// Whether the pane's command has exited.
    fn pane_dead(&self) -> bool {
        self.run(&["display-message", "-p", "-t", &self.socket, "#{pane_dead}"])
            .trim()
            == "1"
    }

    /// Waits until the pane shows what `ready` accepts; panics with the pane's text if it does
    /// not within `timeout`.
    fn wait_for(&self, what: &str, timeout: Duration, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let screen = self.capture();
            if ready(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline && !self.pane_dead(),
                "waited {timeout:?} for {what}; the pane shows:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the command has exited and returns the pane's text, history included;
    /// panics with the pane's text if it does not exit.
    fn wait_exit(&self, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        while !self.pane_dead() {
            assert!(
                Instant::now() < deadline,
                "workerprobe top did not exit within {timeout:?}; the pane shows:\n{}",
                self.capture()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // With the history: leaving the alternate screen may scroll the shell's first line
        // out of view.
        self.run(&["capture-pane", "-p", "-S", "-", "-t", &self.socket])
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        // Ends the session and its command whatever happened (SIGHUP to the pane).
        let _ = self.command(&["kill-server"]).output();
    }
}

/// A workload that is stopped when the test ends, passed or not, so its cgroup can go.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `workerprobe top` in the pane, then what the terminal was left like: its exit status
/// and `stty -a`, which shows whether raw mode was undone.
fn top_in_tmux(test: &str) -> Tmux {
    top_in_tmux_with_width(test, 160)
}

/// As `top_in_tmux`, in a pane `width` columns wide.
fn top_in_tmux_with_width(test: &str, width: u16) -> Tmux {
    let agent = workerprobe_path();
    Tmux::start_with_width(
        test,
        &format!(
            "'{}' top --interval 500ms; echo \"top exited: $?\"; stty -a",
            agent.display()
        ),
        width,
    )
}

/// The first line of the pane: workers, interval, drops, CPUs, sort and filter.
fn header(screen: &str) -> &str {
    screen.lines().next().unwrap_or_default()
}

/// Asserts `top` exited with 0 and left the terminal as it found it: off the alternate
/// screen (the table is gone) and out of raw mode (line editing, echo and signals back on).
fn assert_terminal_restored(screen: &str) {
    assert!(
        screen.contains("top exited: 0"),
        "pane after exit:\n{screen}"
    );
    assert!(
        !screen.contains(KEY_HELP),
        "the screen was left on the TUI:\n{screen}"
    );
    let stty: Vec<&str> = screen.split_whitespace().collect();
    for flag in ["icanon", "echo", "isig", "opost"] {
        assert!(
            stty.contains(&flag),
            "`{flag}` is off after top exited (raw mode left on):\n{screen}"
        );
    }
}

#[test]
fn top_screen_sorts_filters_and_quits_cleanly() {
    require_root();
    // A worker known to be busy, with a name no other cgroup has, to filter on.
    let cgroup = TestCgroup::new("tui-spin");
    let name = cgroup.name();
    let _spin = KillOnDrop(cgroup.spawn_workload(&["spin", "60000", "1"]));
    let tmux = top_in_tmux("keys");

    let screen = tmux.wait_for("the screen with the worker", START_TIMEOUT, |screen| {
        screen.contains(KEY_HELP) && screen.contains(&name)
    });
    let footer = screen
        .lines()
        .find(|line| line.starts_with(KEY_HELP))
        .expect("key help line");
    for keys in [
        "w RUNQ%", "i IO%", "l SLEEP%", "s SEND/s", "r RECV/s", "/ filter", "q quit",
    ] {
        assert!(footer.contains(keys), "{keys:?} missing in {footer:?}");
    }
    assert!(header(&screen).starts_with("workers active: "), "{screen}");
    assert!(header(&screen).contains("node CPUs: "), "{screen}");
    assert!(header(&screen).contains("sort: CPU%"), "{screen}");
    assert!(screen.contains("CPU%▼"), "{screen}");
    assert!(screen.contains("per-CPU cores, total "), "{screen}");

    tmux.send(&["w"]);
    let screen = tmux.wait_for("sorting by run-queue wait", KEY_TIMEOUT, |screen| {
        header(screen).contains("sort: RUNQ%")
    });
    assert!(
        screen.contains("RUNQ%▼") && !screen.contains("CPU%▼"),
        "{screen}"
    );

    tmux.send(&["/"]);
    tmux.send(&["-l", &name]);
    tmux.send(&["Enter"]);
    let screen = tmux.wait_for("the filter", KEY_TIMEOUT, |screen| {
        header(screen).contains(&format!("filter: {name}")) && screen.contains(KEY_HELP)
    });
    // Only the test worker is left: it is the one row, selected, with its detail below.
    let rows: Vec<&str> = screen
        .lines()
        .skip(2)
        .take_while(|line| !line.trim().is_empty())
        .collect();
    assert_eq!(rows.len(), 1, "{screen}");
    assert!(rows[0].starts_with(&format!("▶/{name}")), "{screen}");
    assert!(screen.contains(&format!("┌ /{name} ─")), "{screen}");
    assert!(screen.contains("cpu0 "), "{screen}");
    assert!(screen.contains("runq p50 "), "{screen}");

    tmux.send(&["q"]);
    let screen = tmux.wait_exit(KEY_TIMEOUT);
    assert_terminal_restored(&screen);
}

/// On an 80-column terminal no number is cut: columns go whole, in a stated order, a long
/// path is shortened in the middle, and the detail panel's parts are stacked.
#[test]
fn an_80_column_screen_drops_whole_columns_and_cuts_no_number() {
    require_root();
    let cgroup = TestCgroup::new("tui-narrow-with-a-long-name-to-shorten");
    let name = cgroup.name();
    let _holder = KillOnDrop(cgroup.spawn_workload(&["hold", "64", "60000"]));
    let tmux = top_in_tmux_with_width("narrow", 80);
    let tail = &name[name.len() - 12..];
    // Until its memory is on screen (read at the first tick it is active).
    let screen = tmux.wait_for("the worker's row with memory", START_TIMEOUT, |screen| {
        screen
            .lines()
            .any(|line| line.contains(tail) && line.trim_end().ends_with("MiB"))
    });
    let titles = [
        "WORKER",
        "CORES",
        "CPU%",
        "RUNQ%",
        "IO%",
        "SLEEP%",
        "WAITING",
        "ON",
        "SEND/s",
        "RECV/s",
        "MEM",
        "CPU-TOTAL",
        "SENT",
        "RECV",
    ];
    let table_header = screen
        .lines()
        .find(|line| line.contains("WORKER"))
        .expect("table header");
    for word in table_header.split_whitespace() {
        let word = word.trim_end_matches(['▼', '▲']);
        assert!(
            titles.contains(&word),
            "cut title {word:?} in {table_header:?}"
        );
    }
    assert!(table_header.contains("MEM"), "{screen}");
    let row = screen
        .lines()
        .find(|line| line.contains(tail))
        .expect("the worker's row");
    assert!(
        row.contains('…'),
        "the long path is not shortened in the middle: {row:?}"
    );
    // 64 MiB held: its memory reads whole, e.g. `66.1MiB`, never `6.1MiB` or `1MiB`.
    let memory = row.split_whitespace().last().expect("a last cell");
    let mib: f64 = memory
        .strip_suffix("MiB")
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("memory cell {memory:?} in {row:?}"));
    assert!(
        (64.0..200.0).contains(&mib),
        "{memory} for 64 MiB held: {row:?}"
    );

    // The worker's detail panel: its parts stacked, every figure whole.
    tmux.send(&["/"]);
    tmux.send(&["-l", &name]);
    tmux.send(&["Enter"]);
    // (At 80 columns the header is too short to show the filter: the panel's title tells.)
    let screen = tmux.wait_for("the worker's detail", KEY_TIMEOUT, |screen| {
        detail_panel(screen)
            .first()
            .is_some_and(|title| title.contains(tail))
    });
    let detail = detail_panel(&screen);
    let shown = detail.join("\n");
    let line_with = |text: &str| {
        detail
            .iter()
            .find(|line| line.contains(text))
            .unwrap_or_else(|| panic!("no {text:?} in the detail panel:\n{shown}"))
    };
    // At 80 columns the parts are one above the other, never side by side.
    assert!(
        !line_with("per-CPU cores, total ").contains("thread time"),
        "{shown}"
    );
    assert!(
        !line_with("thread time, % of interval").contains("family"),
        "{shown}"
    );
    // CPUs 0, 1, 2, … in turn, each with one whole `d.dd` figure.
    let words: Vec<&str> = detail
        .iter()
        .filter(|line| line.starts_with("│cpu"))
        .flat_map(|line| line.split(|ch: char| ch.is_whitespace() || ch == '│'))
        .collect();
    let cpus: Vec<&str> = words
        .iter()
        .copied()
        .filter(|word| word.starts_with("cpu"))
        .collect();
    let per_cpu: Vec<&str> = words
        .iter()
        .copied()
        .filter(|word| word.parse::<f64>().is_ok())
        .collect();
    let expected: Vec<String> = (0..cpus.len()).map(|cpu| format!("cpu{cpu}")).collect();
    assert!(!cpus.is_empty() && cpus == expected, "{shown}");
    assert_eq!(per_cpu.len(), cpus.len(), "{shown}");
    for cores in per_cpu {
        assert!(
            cores.len() == 4 && cores.as_bytes()[1] == b'.',
            "per-CPU figure {cores:?} cut:\n{shown}"
        );
    }
    // A row per family: two rates and two counts, each standing alone.
    for family in ["ipv4", "ipv6", "unix", "other"] {
        let cells: Vec<&str> = line_with(&format!("│{family} "))
            .trim_matches('│')
            .split_whitespace()
            .collect();
        assert!(
            cells.len() == 5
                && cells[1..3].iter().all(|rate| rate.ends_with("B/s"))
                && cells[3..].iter().all(|count| count.parse::<u64>().is_ok()),
            "{family} row {cells:?}:\n{shown}"
        );
    }
    // The same 64 MiB and more, whole, in the memory line.
    let memory = line_with("│memory ")
        .split_whitespace()
        .nth(1)
        .and_then(|current| current.trim_end_matches(',').strip_suffix("MiB"))
        .and_then(|value| value.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("memory in the detail panel:\n{shown}"));
    assert!((64.0..200.0).contains(&memory), "{shown}");
    assert!(line_with("switches: ").contains(" involuntary"), "{shown}");
    tmux.send(&["q"]);
    assert_terminal_restored(&tmux.wait_exit(KEY_TIMEOUT));
}

/// The lines of the detail panel: from its top border with the worker's path to its bottom
/// border.
fn detail_panel(screen: &str) -> Vec<&str> {
    screen
        .lines()
        .skip_while(|line| !line.starts_with("┌ /"))
        .take_while(|line| !line.starts_with('└'))
        .collect()
}

#[test]
fn ctrl_c_leaves_the_terminal_usable() {
    require_root();
    let tmux = top_in_tmux("ctrl-c");
    tmux.wait_for("the screen", START_TIMEOUT, |screen| {
        screen.contains(KEY_HELP)
    });
    // Mid-filter, where every other key is text.
    tmux.send(&["/", "x"]);
    tmux.wait_for("the filter prompt", KEY_TIMEOUT, |screen| {
        screen.contains("filter: x▏")
    });
    tmux.send(&["C-c"]);
    let screen = tmux.wait_exit(KEY_TIMEOUT);
    assert_terminal_restored(&screen);
}

#[test]
fn piped_and_once_output_are_plain_tables() {
    require_root();
    let once = Command::new(workerprobe_path())
        .args(["top", "--once", "--interval", "200ms"])
        .output()
        .expect("run workerprobe top --once");
    assert!(once.status.success(), "top --once failed: {once:?}");
    let text = String::from_utf8(once.stdout).expect("utf-8");
    assert!(text.starts_with("workers active: "), "{text}");
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|line| line.starts_with("WORKER ")),
        "{text}"
    );
    assert!(
        !text.contains('\x1b'),
        "escape sequences in piped output: {text:?}"
    );

    // Without --once into a pipe: table after table, and an exit once the reader goes.
    let mut agent = Command::new(workerprobe_path())
        .args(["top", "--interval", "200ms"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start workerprobe top");
    let mut lines = BufReader::new(agent.stdout.take().expect("stdout")).lines();
    let mut tables = 0;
    while tables < 2 {
        let line = lines
            .next()
            .expect("top stopped printing")
            .expect("read top output");
        assert!(
            !line.contains('\x1b'),
            "escape sequences in piped output: {line:?}"
        );
        if line.starts_with("workers active: ") {
            tables += 1;
        }
    }
    drop(lines); // like `| head` closing the pipe
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = agent.try_wait().expect("wait for top") {
            assert!(
                status.success(),
                "top ended with {status} after its reader went"
            );
            break;
        }
        if Instant::now() > deadline {
            let _ = agent.kill();
            panic!("top kept running after its reader went away");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
