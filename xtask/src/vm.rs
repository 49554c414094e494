//! `cargo xtask vm-test`: the integration tests whose outcome depends on the kernel or the
//! cgroup layout, run in a VM of each kernel our users run (Debian's own builds), on pure
//! cgroup2 with the cpu, memory, io and pids controllers on, then one table of the matrix.
//!
//! The VM is virtme-ng (PyPI): it boots a kernel with this machine's root file system shared
//! read-only over virtiofs, so the test binaries built here run there unchanged. The `vmtest`
//! crate was the other candidate; it shares the root over 9p, which Debian's -cloud kernels
//! do not have, and cannot load the modules they need. One boot per kernel runs every test
//! binary one after the other; the tests write only to a scratch ext4 disk and to the
//! results directory shared read-write.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use clap::Args;

use crate::{cmd, setup};

/// Options of `cargo xtask vm-test`.
#[derive(Args, Debug, Default)]
pub struct VmArgs {
    /// Boot only this kernel of the matrix (6.1, 6.12); repeat for several. Default: all.
    #[arg(long = "kernel", value_name = "NAME")]
    pub kernels: Vec<String>,
    /// Also rewrite the matrix in README.md and the VM per-event costs in BENCHMARKS.md from
    /// this run.
    #[arg(long)]
    pub update_docs: bool,
    /// Run only this test binary of the matrix (as the table names it: `waits`, `net`);
    /// repeat for several. Default: all. For trying a fix, not for the docs.
    #[arg(long = "test", value_name = "NAME", conflicts_with = "update_docs")]
    pub tests: Vec<String>,
}

/// A kernel of the matrix: a Debian package, the newest of its series in the archive, named
/// `<prefix><number><suffix>`.
pub struct KernelSpec {
    /// Short name (`--kernel`).
    pub name: &'static str,
    /// Who ships it, for the table.
    pub distribution: &'static str,
    /// Package name before the number that moves with each update.
    pub prefix: &'static str,
    /// Package name after it.
    pub suffix: &'static str,
}

impl KernelSpec {
    /// The `apt-cache search --names-only` pattern of the series.
    pub fn pattern(&self) -> String {
        let escape = |text: &str| {
            text.chars().fold(String::new(), |mut out, c| {
                if matches!(c, '.' | '+') {
                    out.push('\\');
                }
                out.push(c);
                out
            })
        };
        format!("^{}[0-9]+{}$", escape(self.prefix), escape(self.suffix))
    }

    /// Whether a package name is of this series.
    pub fn matches(&self, package: &str) -> bool {
        package
            .strip_prefix(self.prefix)
            .and_then(|rest| rest.strip_suffix(self.suffix))
            .is_some_and(|number| !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()))
    }
}

/// The kernels booted in VMs. -cloud builds: the same kernel, fewer drivers, faster boots.
pub const MATRIX: &[KernelSpec] = &[
    KernelSpec {
        name: "6.1",
        distribution: "Debian 12 (bookworm)",
        prefix: "linux-image-6.1.0-",
        suffix: "-cloud-amd64-unsigned",
    },
    KernelSpec {
        name: "6.12",
        distribution: "Debian 13 (trixie), Debian 12 backports",
        prefix: "linux-image-6.12.",
        suffix: "+deb12-cloud-amd64-unsigned",
    },
];

/// An integration test binary and how it runs in a VM.
pub struct VmTest {
    /// Its binary (tests/tests/<binary>.rs).
    pub binary: &'static str,
    /// Its row in the table (the binary, or the binary and what differs).
    pub name: &'static str,
    /// Extra libtest arguments inside a VM.
    pub vm_args: &'static [&'static str],
    /// Environment for the run.
    pub env: &'static [(&'static str, &'static str)],
    /// Run only where the kernel has both socket variants (the second run of net.rs).
    pub both_net_variants: bool,
}

const fn plain(binary: &'static str) -> VmTest {
    VmTest {
        binary,
        name: binary,
        vm_args: &[],
        env: &[],
        both_net_variants: false,
    }
}

/// The test binaries whose outcome depends on the kernel or the cgroup layout: the programs
/// and their variants, cgroups, memory, exec, bytes, pinning, privileges. Pure user-space
/// tests (pictures, flag parsing, the screens, Prometheus) run on the host only.
pub const VM_TESTS: &[VmTest] = &[
    plain("cpu"),
    plain("delays"),
    plain("net"),
    // The fexit socket programs again on a kernel that also has the tracepoints: both
    // variants exact on one kernel.
    VmTest {
        binary: "net",
        name: "net (fexit forced)",
        vm_args: &[],
        env: &[("WP_TEST_NET_ATTACH", "fexit")],
        both_net_variants: true,
    },
    plain("waits"),
    plain("workers"),
    plain("processes"),
    plain("restart"),
    plain("privileges"),
    // The DaemonSet's container in a pod-like cgroup namespace: pure cgroup2 is what real
    // nodes have.
    plain("deploy"),
    // The churn of 10,000 workers takes minutes under emulation and tests the agent's own
    // bookkeeping, the same on every kernel: host only.
    VmTest {
        binary: "robustness",
        name: "robustness",
        vm_args: &["--skip", "ten_thousand_short_workers"],
        env: &[],
        both_net_variants: false,
    },
    plain("cli"),
];

/// Longest one VM may run before it is killed.
const VM_LIMIT: Duration = Duration::from_secs(40 * 60);

/// Longest one test binary may run in a VM before its kernel stacks are logged and it is
/// killed (the slowest takes about 3 minutes under emulation on a loaded host): a hang costs
/// this, not the whole VM's limit, and the binaries after it still run.
const BINARY_LIMIT_SECONDS: u64 = 600;

/// What the guest writes into a binary's log when it kills it at its limit.
const HUNG_MARKER: &str = "=== still running after";

/// Longest a VM may take to boot and write its first progress line (14–23 s under
/// emulation; once, in a rehearsal, a TCG boot wrote nothing at all, not even to its
/// console, and was killed only after [`SILENT_GUEST_LIMIT`]).
const BOOT_LIMIT: Duration = Duration::from_secs(5 * 60);

/// Boots of one VM before its binaries are reported as not run: a boot that never came up
/// says nothing of the kernel, so it is tried again.
const BOOT_ATTEMPTS: u32 = 2;

/// Longest a VM may go without a progress line (a binary's end, or the per-event costs'
/// several minutes) before it is taken for hung and killed.
const SILENT_GUEST_LIMIT: Duration = Duration::from_secs(20 * 60);

/// Where the matrix's files live: kernels, the virtme-ng environment, each run's results.
pub fn vm_dir() -> Result<PathBuf> {
    Ok(cmd::target_dir()?.join("vm"))
}

/// One test binary's outcome in one environment.
#[derive(Clone, Debug, Default)]
pub struct BinaryResult {
    /// Test names that passed.
    pub passed: Vec<String>,
    /// Test names that failed.
    pub failed: Vec<String>,
    /// Exit status of the binary (0 when every test passed).
    pub status: i32,
    /// Wall seconds it took.
    pub seconds: f64,
    /// The log, for a failure's report.
    pub log: PathBuf,
    /// Why it did not apply there (e.g. only one socket variant to force).
    pub not_applicable: Option<String>,
}

impl BinaryResult {
    fn ok(&self) -> bool {
        self.not_applicable.is_some()
            || (self.status == 0 && self.failed.is_empty() && !self.passed.is_empty())
    }
}

/// One environment of the matrix: the host, or a kernel in a VM.
#[derive(Clone, Debug, Default)]
pub struct Row {
    /// "host" or the kernel's short name.
    pub name: String,
    /// Distribution / where it comes from.
    pub origin: String,
    /// `uname -r` there.
    pub release: String,
    /// How the VM ran (kvm, tcg) or "native".
    pub accel: String,
    /// cgroup layout (unified, hybrid) and the root's controllers.
    pub cgroups: String,
    /// Per program group, the variant `workerprobe check` reported (or why none).
    pub variants: BTreeMap<String, String>,
    /// Per test binary.
    pub results: BTreeMap<String, BinaryResult>,
    /// Per-event costs measured there.
    pub costs: Vec<(String, String, f64, f64)>,
    /// The agent's CPU at many workers there, by how memory was read.
    pub agent_costs: Vec<crate::bench::AgentCostRecord>,
    /// Seconds the whole environment took (boot included).
    pub seconds: f64,
}

impl Row {
    /// Whether every binary ran and passed.
    pub fn ok(&self) -> bool {
        !self.results.is_empty() && self.results.values().all(BinaryResult::ok)
    }
}

/// `cargo xtask vm-test`.
pub fn vm_test(args: &VmArgs) -> Result<()> {
    if !cmd::is_root() {
        bail!(
            "the VM tests load eBPF programs inside the VMs as root: run `sudo -E cargo xtask vm-test`"
        );
    }
    setup::setup()?;
    let specs = chosen(&args.kernels)?;
    let kernels = setup::setup_vm(&specs)?;
    // The docs' table has the host beside the VMs, as `cargo xtask test` runs it.
    let mut rows = Vec::new();
    if args.update_docs {
        cmd::run(cmd::cargo()?.args(["build", "-p", "probe-user"]))?;
        rows.push(run_on_host(&test_executables(false)?, &[])?);
    }
    let tests = chosen_tests(&args.tests)?;
    let executables = build_release()?;
    for kernel in &kernels {
        rows.push(run_in_vm(kernel, &executables, &tests)?);
    }
    finish(&rows, args.update_docs)
}

/// Prints the table, writes it to target/vm/matrix.md (and the docs when asked), and fails
/// if any environment failed.
pub fn finish(rows: &[Row], update_docs: bool) -> Result<()> {
    let table = render(rows);
    println!("\n{table}");
    let path = vm_dir()?.join("matrix.md");
    fs::create_dir_all(vm_dir()?)?;
    fs::write(&path, &table).with_context(|| format!("writing {}", path.display()))?;
    println!("matrix written to {}", path.display());
    let green = rows.iter().all(Row::ok);
    if update_docs && !green {
        println!("README.md and BENCHMARKS.md left as they were: only a green run goes there");
    }
    if update_docs && green {
        let root = cmd::workspace_root()?;
        replace_section(
            &root.join("README.md"),
            "kernel-matrix",
            &render_matrix(rows),
        )?;
        replace_section(
            &root.join("BENCHMARKS.md"),
            "vm-per-event",
            &render_costs(rows),
        )?;
    }
    let failed: Vec<String> = rows
        .iter()
        .filter(|row| !row.ok())
        .map(|row| {
            let failures: Vec<String> = row
                .results
                .iter()
                .filter(|(_, result)| !result.ok())
                .map(|(name, result)| {
                    if result.failed.is_empty() {
                        format!(
                            "{name} (exit {}, log {})",
                            result.status,
                            result.log.display()
                        )
                    } else {
                        format!(
                            "{name}: {} (log {})",
                            result.failed.join(", "),
                            result.log.display()
                        )
                    }
                })
                .collect();
            let failures = if failures.is_empty() {
                "no test ran".to_owned()
            } else {
                failures.join("; ")
            };
            format!("{}: {failures}", row.name)
        })
        .collect();
    if !failed.is_empty() {
        // The logs stay in the VM's directory, which a CI machine may not keep: show why.
        for row in rows.iter().filter(|row| !row.ok()) {
            for (name, result) in row.results.iter().filter(|(_, result)| !result.ok()) {
                let log = fs::read_to_string(&result.log).unwrap_or_default();
                println!(
                    "\n--- {} {name}: what failed ---\n{}",
                    row.name,
                    failure_excerpt(&log)
                );
            }
        }
        bail!("kernel matrix failed: {}", failed.join(" | "));
    }
    Ok(())
}

/// The part of a libtest log that says why its tests failed (each failure's output and
/// panic), at most `FAILURE_LINES` lines; the log's tail when it has no such part (a crash).
fn failure_excerpt(log: &str) -> String {
    const FAILURE_LINES: usize = 80;
    let lines: Vec<&str> = log.lines().collect();
    // A binary killed at its limit: from the test it was in (its line ends with the
    // marker), then its tasks' stacks.
    let start = lines
        .iter()
        .position(|line| line.contains(HUNG_MARKER))
        .or_else(|| lines.iter().position(|line| line.starts_with("---- ")))
        .unwrap_or(lines.len().saturating_sub(FAILURE_LINES));
    lines[start..]
        .iter()
        .take(FAILURE_LINES)
        .copied()
        .collect::<Vec<_>>()
        .join("\n")
}

/// The matrix kernels named by `--kernel`, or all.
fn chosen(names: &[String]) -> Result<Vec<&'static KernelSpec>> {
    if names.is_empty() {
        return Ok(MATRIX.iter().collect());
    }
    names
        .iter()
        .map(|name| {
            MATRIX
                .iter()
                .find(|spec| spec.name == name)
                .with_context(|| {
                    format!(
                        "`{name}` is not a kernel of the matrix: use one of {}",
                        MATRIX.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
                    )
                })
        })
        .collect()
}

/// A kernel ready to boot.
pub struct Kernel {
    /// Its spec.
    pub spec: &'static KernelSpec,
    /// Its vmlinuz (in the unpacked package, whose lib/modules virtme-ng reads).
    pub vmlinuz: PathBuf,
    /// Its release (the name under lib/modules).
    pub release: String,
}

/// Builds the release agent and test binaries; returns the test executables by name.
pub fn build_release() -> Result<BTreeMap<String, PathBuf>> {
    cmd::run(cmd::cargo()?.args(["build", "--release", "-p", "probe-user"]))?;
    test_executables(true)
}

/// The integration test executables (built if needed), by binary name.
pub fn test_executables(release: bool) -> Result<BTreeMap<String, PathBuf>> {
    let mut build = cmd::cargo()?;
    build.args([
        "test",
        "-p",
        "workerprobe-tests",
        "--tests",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    if release {
        build.arg("--release");
    }
    build.stdout(Stdio::piped());
    let output = build
        .spawn()
        .context("could not run cargo")?
        .wait_with_output()
        .context("waiting for cargo")?;
    if !output.status.success() {
        bail!("building the integration tests failed");
    }
    let mut executables = BTreeMap::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let is_test = message["target"]["kind"]
            .as_array()
            .is_some_and(|kinds| kinds.iter().any(|k| k == "test"));
        if message["reason"] == "compiler-artifact"
            && is_test
            && let (Some(name), Some(path)) = (
                message["target"]["name"].as_str(),
                message["executable"].as_str(),
            )
        {
            executables.insert(name.to_owned(), PathBuf::from(path));
        }
    }
    if executables.is_empty() {
        bail!("cargo built no integration test executables");
    }
    Ok(executables)
}

/// Runs `executables` on the host, one at a time (they share kernel state), as the host row.
pub fn run_on_host(
    executables: &BTreeMap<String, PathBuf>,
    extra: &[std::ffi::OsString],
) -> Result<Row> {
    let started = Instant::now();
    let root = cmd::workspace_root()?;
    let logs = vm_dir()?.join("host");
    fs::create_dir_all(&logs)?;
    let agent = cmd::target_dir()?.join("debug").join("workerprobe");
    let check = cmd::probe(Command::new(&agent).args(["check", "--json"]));
    let mut row = Row {
        name: "host".into(),
        origin: "this machine".into(),
        accel: "native".into(),
        ..Row::default()
    };
    if let Some(text) = check {
        describe_from_check(&mut row, &text);
    }
    for (name, executable) in executables {
        println!("==> host: {name}");
        let log = logs.join(format!("{name}.log"));
        let begun = Instant::now();
        let status = run_logged(
            Command::new(executable)
                .arg("--test-threads=1")
                .args(extra)
                .current_dir(root),
            &log,
        )?;
        let mut result = parse_libtest(&fs::read_to_string(&log).unwrap_or_default());
        result.status = status;
        result.seconds = begun.elapsed().as_secs_f64();
        result.log = log;
        row.results.insert(name.clone(), result);
    }
    row.seconds = started.elapsed().as_secs_f64();
    Ok(row)
}

/// Runs a command with its output both shown and written to `log`; returns its exit code.
fn run_logged(command: &mut Command, log: &Path) -> Result<i32> {
    let file = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(file.try_clone()?)
        .spawn()
        .with_context(|| format!("could not start {}", cmd::describe(command)))?;
    let mut stdout = child.stdout.take().context("stdout")?;
    let mut file = file;
    let mut buffer = [0u8; 8192];
    loop {
        let n = std::io::Read::read(&mut stdout, &mut buffer)?;
        if n == 0 {
            break;
        }
        std::io::Write::write_all(&mut std::io::stdout(), &buffer[..n])?;
        std::io::Write::write_all(&mut file, &buffer[..n])?;
    }
    Ok(child.wait()?.code().unwrap_or(128))
}

/// Reads libtest's output: the names of the tests that ran, and of those that failed (its
/// `failures:` list); a test's own output may split its `test NAME ... ok` line.
pub fn parse_libtest(text: &str) -> BinaryResult {
    let mut result = BinaryResult::default();
    let mut ran = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("test ")
            && let Some((name, _)) = rest.split_once(" ... ")
        {
            ran.push(name.to_owned());
        }
    }
    // The last `failures:` block lists the failed tests' names, indented, one per line.
    if let Some(at) = text.rfind("\nfailures:\n") {
        result.failed = text[at + "\nfailures:\n".len()..]
            .lines()
            .take_while(|line| !line.trim().is_empty())
            .filter_map(|line| line.strip_prefix("    "))
            .map(|name| name.trim().to_owned())
            .collect();
    }
    // Ignored tests are reported too; they are neither.
    let ignored: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("test ")?.strip_suffix(" ... ignored"))
        .collect();
    result.passed = ran
        .into_iter()
        .filter(|name| !result.failed.contains(name) && !ignored.contains(&name.as_str()))
        .collect();
    result
}

/// Fills a row's kernel, cgroup and variant cells from `workerprobe check --json`.
fn describe_from_check(row: &mut Row, text: &str) {
    let Ok(check) = serde_json::from_str::<serde_json::Value>(text) else {
        row.variants
            .insert("check".into(), "workerprobe check failed".into());
        return;
    };
    row.release = check["kernel"].as_str().unwrap_or("?").to_owned();
    let list = |value: &serde_json::Value| {
        value
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|i| i.as_str())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default()
    };
    row.cgroups = format!(
        "{} at {} (children get: {})",
        check["cgroup2"]["layout"].as_str().unwrap_or("?"),
        check["cgroup2"]["mount"].as_str().unwrap_or("?"),
        match list(&check["cgroup2"]["subtree_control"]) {
            text if text.is_empty() => "none".to_owned(),
            text => text,
        }
    );
    if let Some(groups) = check["groups"].as_object() {
        for (group, report) in groups {
            let mut cell = match report["variant"].as_str() {
                Some(variant) => variant.to_owned(),
                None => format!("not measured: {}", list(&report["missing"])),
            };
            // The variant's add-ons: what it also counts here, or cannot.
            for also in report["also_counted"].as_array().into_iter().flatten() {
                cell += &format!("; also {}", also.as_str().unwrap_or("?"));
            }
            for missing in report["not_counted"].as_array().into_iter().flatten() {
                let needs = missing["needs"].as_str().unwrap_or("?");
                cell += &format!(
                    "; **not counted**: {} (needs {})",
                    missing["what"].as_str().unwrap_or("?"),
                    needs.split(" (").next().unwrap_or(needs)
                );
            }
            row.variants.insert(group.clone(), cell);
        }
    }
    if let Some(memory) = check["memory"].as_str() {
        row.variants.insert("memory read".into(), memory.to_owned());
    }
}

/// Whether KVM can boot a stock kernel here; the reason when not.
fn kvm_usable(kernel: &Kernel, venv_bin: &Path) -> std::result::Result<(), String> {
    if !Path::new("/dev/kvm").exists() {
        return Err("no /dev/kvm".into());
    }
    // PVM (kvm_pvm) runs only kernels built for it: Debian's crash in their decompressor.
    if Path::new("/sys/module/kvm_pvm").exists() {
        return Err("/dev/kvm is PVM (kvm_pvm), which cannot boot stock kernels".into());
    }
    let marker = "workerprobe-kvm-boot-ok";
    let mut boot = vng(venv_bin, kernel, true);
    boot.args(["--memory", "1G", "--", &format!("echo {marker}")]);
    match output_within(&mut boot, Duration::from_secs(90)) {
        Some(text) if text.contains(marker) => Ok(()),
        _ => Err("a KVM boot did not come up; `-cpu host` fails on some nested hosts".into()),
    }
}

/// `vng` for `kernel`, with KVM or software emulation.
fn vng(venv_bin: &Path, kernel: &Kernel, kvm: bool) -> Command {
    let mut vng = Command::new(venv_bin.join("vng"));
    if !kvm {
        vng.arg("--disable-kvm");
    }
    vng.arg("--cpus").arg("2").arg("-r").arg(&kernel.vmlinuz);
    // vng runs virtme-run and virtiofsd from PATH.
    let path = cmd::path_with(&[venv_bin.to_path_buf()]).unwrap_or_default();
    vng.env("PATH", path);
    vng
}

/// Runs a command for at most `limit`; its stdout and stderr when it ended in time.
fn output_within(command: &mut Command, limit: Duration) -> Option<String> {
    let out = std::env::temp_dir().join(format!("wp-vm-probe-{}.log", std::process::id()));
    let file = fs::File::create(&out).ok()?;
    let mut child = command
        .stdin(Stdio::null())
        .stdout(file.try_clone().ok()?)
        .stderr(file)
        .process_group(0)
        .spawn()
        .ok()?;
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        if Instant::now() > deadline {
            kill_group(&mut child);
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let text = fs::read_to_string(&out).ok();
    let _ = fs::remove_file(&out);
    text
}

/// Boots `kernel` once and runs every VM test binary inside; returns its row.
pub fn run_in_vm(
    kernel: &Kernel,
    executables: &BTreeMap<String, PathBuf>,
    tests: &[&VmTest],
) -> Result<Row> {
    let started = Instant::now();
    let root = cmd::workspace_root()?;
    let venv_bin = vm_dir()?.join("venv").join("bin");
    let out = vm_dir()?.join("run").join(kernel.spec.name);
    if out.exists() {
        fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    fs::create_dir_all(&out)?;
    // A real disk for the tests' file I/O (fsync must block on a device, not on memory).
    let disk = out.join("scratch.img");
    fs::File::create(&disk)?.set_len(1 << 30)?;
    cmd::run(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&disk))?;

    let (kvm, accel) = match kvm_usable(kernel, &venv_bin) {
        Ok(()) => (true, "kvm".to_owned()),
        Err(reason) => (false, format!("tcg ({reason})")),
    };
    let agent = cmd::target_dir()?.join("release").join("workerprobe");
    let xtask = running_xtask()?;
    let script = guest_script(&out, &agent, &xtask, executables, tests)?;
    let script_path = out.join("guest.sh");
    fs::write(&script_path, script)?;

    println!(
        "==> VM {} ({}), {accel}: {} test binaries",
        kernel.spec.name,
        kernel.release,
        tests.len()
    );
    let mut boot = vng(&venv_bin, kernel, kvm);
    boot.arg("--memory")
        .arg("2G")
        .arg("--rwdir")
        .arg(&out)
        .arg(format!(
            "--qemu-opts=-drive file={},if=virtio,format=raw,cache=none",
            disk.display()
        ))
        .arg("--")
        .arg(format!("bash {}", script_path.display()))
        .current_dir(root);
    let console = out.join("console.log");
    for boot_attempt in 1..=BOOT_ATTEMPTS {
        if watch_vm(&mut boot, kernel, &out, &console)? == VmEnd::NeverBooted {
            println!(
                "    {} did not boot within {BOOT_LIMIT:?} (see {}){}",
                kernel.spec.name,
                console.display(),
                if boot_attempt < BOOT_ATTEMPTS {
                    ": booting it again"
                } else {
                    ""
                }
            );
            continue;
        }
        break;
    }
    let _ = fs::remove_file(&disk);

    let mut row = Row {
        name: kernel.spec.name.to_owned(),
        origin: kernel.spec.distribution.to_owned(),
        release: kernel.release.clone(),
        accel,
        ..Row::default()
    };
    describe_from_check(
        &mut row,
        &fs::read_to_string(out.join("check.json")).unwrap_or_default(),
    );
    for test in tests {
        let file = file_name(test.name);
        if let Ok(reason) = fs::read_to_string(out.join(format!("{file}.na"))) {
            row.results.insert(
                test.name.to_owned(),
                BinaryResult {
                    not_applicable: Some(reason.trim().to_owned()),
                    ..BinaryResult::default()
                },
            );
            continue;
        }
        let log = out.join(format!("{file}.log"));
        let Ok(text) = fs::read_to_string(&log) else {
            row.results.insert(
                test.name.to_owned(),
                BinaryResult {
                    status: -1,
                    log: console.clone(),
                    ..BinaryResult::default()
                },
            );
            continue;
        };
        let mut result = parse_libtest(&text);
        let rc = fs::read_to_string(out.join(format!("{file}.rc"))).unwrap_or_default();
        let mut fields = rc.split_whitespace();
        result.status = fields.next().and_then(|v| v.parse().ok()).unwrap_or(-1);
        result.seconds = fields.next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
        result.log = log;
        row.results.insert(test.name.to_owned(), result);
    }
    if let Ok(text) = fs::read_to_string(out.join("cost.json"))
        && let Ok(records) = serde_json::from_str::<Vec<crate::bench::ProgCostRecord>>(&text)
    {
        row.costs = records
            .into_iter()
            .map(|r| (r.owner, r.name, r.ns_per_event, r.events_per_second))
            .collect();
    }
    if let Ok(text) = fs::read_to_string(out.join(crate::bench::AGENT_COST_FILE))
        && let Ok(records) = serde_json::from_str(&text)
    {
        row.agent_costs = records;
    }
    row.seconds = started.elapsed().as_secs_f64();
    Ok(row)
}

/// How a boot of a matrix VM ended.
#[derive(PartialEq)]
enum VmEnd {
    /// The guest wrote no progress line in [`BOOT_LIMIT`]: killed before its script ran.
    NeverBooted,
    /// Its script ran: to its end, or until it was killed for a hang or the VM's limit.
    Ran,
}

/// Starts `boot` (vng) with its output in `console`, shows the guest's progress lines as it
/// writes them, and waits for it to end; kills it when it does not boot, hangs or outlives
/// [`VM_LIMIT`].
fn watch_vm(boot: &mut Command, kernel: &Kernel, out: &Path, console: &Path) -> Result<VmEnd> {
    let file = fs::File::create(console)?;
    // Its own process group, so that a kill at the limit reaches qemu and virtiofsd too: an
    // orphaned emulator would slow every later VM.
    let mut child = boot
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .process_group(0)
        .spawn()
        .context("could not start vng (virtme-ng)")?;
    let started = Instant::now();
    let mut shown = 0;
    let mut last_progress = Instant::now();
    loop {
        // Progress as the guest writes it.
        let progress = fs::read_to_string(out.join("progress")).unwrap_or_default();
        for line in progress.lines().skip(shown) {
            println!("    {} {line}", kernel.spec.name);
            shown += 1;
            last_progress = Instant::now();
        }
        if child.try_wait()?.is_some() {
            return Ok(VmEnd::Ran);
        }
        if shown == 0 && started.elapsed() > BOOT_LIMIT {
            kill_group(&mut child);
            return Ok(VmEnd::NeverBooted);
        }
        if started.elapsed() > VM_LIMIT {
            kill_group(&mut child);
            println!("    {} killed after {VM_LIMIT:?}", kernel.spec.name);
            return Ok(VmEnd::Ran);
        }
        // The guest kills a binary at its limit and says so: silence well beyond that is a
        // guest that no longer runs its script.
        if last_progress.elapsed() > SILENT_GUEST_LIMIT {
            kill_group(&mut child);
            println!(
                "    {} killed: no progress for {SILENT_GUEST_LIMIT:?} (the guest hung; see {})",
                kernel.spec.name,
                console.display()
            );
            return Ok(VmEnd::Ran);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Kills `child`'s process group (it was started as its leader) and reaps the child.
fn kill_group(child: &mut std::process::Child) {
    if let Ok(pgid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) with a negative id signals that process group; no memory involved.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// This xtask binary's path (even if a rebuild has replaced it meanwhile).
fn running_xtask() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("could not find the xtask binary")?;
    let text = exe.to_string_lossy();
    Ok(PathBuf::from(text.trim_end_matches(" (deleted)")))
}

/// The script the guest runs: pure cgroup2 with the controllers on, bpffs, the scratch disk,
/// then each test binary, then the per-event costs.
fn guest_script(
    out: &Path,
    agent: &Path,
    xtask: &Path,
    executables: &BTreeMap<String, PathBuf>,
    tests: &[&VmTest],
) -> Result<String> {
    let out = out.display();
    let mut script = format!(
        r#"#!/bin/bash
# Written by `cargo xtask vm-test`; runs inside the VM.
out={out}
progress() {{ echo "$*" >> $out/progress; }}
binary_limit={limit}
# Runs a test binary (in its own session) for at most $binary_limit s. One that outlives it gets
# its tasks' kernel stacks and the end of the kernel's log appended to its log (the whole
# kernel log beside it), then its whole session is killed, and the next binary runs.
run_limited() {{
  log=$1; shift
  setsid "$@" > $log 2>&1 &
  pid=$!
  waited=0
  while kill -0 $pid 2>/dev/null && [ $waited -lt $binary_limit ]; do sleep 1; waited=$((waited + 1)); done
  if kill -0 $pid 2>/dev/null; then
    echo "{hung_marker} $binary_limit s: kernel stacks of its session ===" >> $log
    for task in /proc/[0-9]*/task/[0-9]*; do
      # Fields after the command's closing parenthesis: state, ppid, pgrp, session.
      fields=$(sed 's/.*) //' $task/stat 2>/dev/null)
      [ "$(echo $fields | cut -d' ' -f4)" = "$pid" ] || continue
      echo "--- ${{task#/proc/}} $(cat $task/comm 2>/dev/null) state $(echo $fields | cut -d' ' -f1) wchan $(cat $task/wchan 2>/dev/null)" >> $log
      cat $task/stack >> $log 2>/dev/null
    done
    # Every CPU's backtrace into the kernel's log (a task spinning in the kernel shows there).
    [ -w /proc/sysrq-trigger ] && echo l > /proc/sysrq-trigger
    dmesg > $log.dmesg
    echo "=== the kernel's log, its end (all of it in $log.dmesg) ===" >> $log
    dmesg | tail -n 40 >> $log
    kill -KILL -- -$pid 2>/dev/null
    wait $pid
    return 124
  fi
  wait $pid
}}
cg=$(awk '$3 == "cgroup2" {{ print $2; exit }}' /proc/mounts)
[ -n "$cg" ] || {{ mount -t cgroup2 none /sys/fs/cgroup && cg=/sys/fs/cgroup; }}
# What a systemd host gives its slices.
echo "+cpu +memory +io +pids" > $cg/cgroup.subtree_control
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
mkdir -p /run/wp-scratch && mount -t ext4 /dev/vda /run/wp-scratch || progress "no scratch disk"
export WP_SCRATCH=/run/wp-scratch
# Debian's kernels allow fexit: the tests whose programs need it must find them attached.
export WP_EXPECT_FEXIT=1
progress "booted $(uname -r), cgroup2 at $cg"
{agent} check --json > $out/check.json 2> $out/check.err
{agent} check > $out/check.txt 2>&1
"#,
        agent = agent.display(),
        limit = BINARY_LIMIT_SECONDS,
        hung_marker = HUNG_MARKER,
    );
    for test in tests {
        let executable = executables
            .get(test.binary)
            .with_context(|| format!("no integration test binary `{}`", test.binary))?;
        let file = file_name(test.name);
        if test.both_net_variants {
            let _ = write!(
                script,
                r#"if ! grep -qa btf_trace_sock_send_length /sys/kernel/btf/vmlinux; then
  echo "one socket variant only (no sock_send_length tracepoint)" > $out/{file}.na
  progress "{name}: n/a here"
else
"#,
                name = test.name
            );
        }
        let env: String = test
            .env
            .iter()
            .map(|(key, value)| format!("{key}={value} "))
            .collect();
        let _ = write!(
            script,
            r#"started=$(date +%s.%N)
run_limited $out/{file}.log env {env}{exe} --test-threads=1 {args}
rc=$?
echo "$rc $(echo "$(date +%s.%N) - $started" | bc)" > $out/{file}.rc
if [ $rc = 124 ]; then
  progress "{name}: killed after {limit} s (its tasks' kernel stacks are in its log)"
else
  progress "{name}: $(grep -E '^test result' $out/{file}.log || echo "exit $rc")"
fi
"#,
            exe = executable.display(),
            args = test.vm_args.join(" "),
            name = test.name,
            limit = BINARY_LIMIT_SECONDS,
        );
        if test.both_net_variants {
            script.push_str("fi\n");
        }
    }
    let _ = write!(
        script,
        r#"progress "per-event cost (bpf_stats), then the agent's CPU at 1000 workers"
{xtask} bench --vm-guest --agent {agent} --out $out/cost.json > $out/cost.log 2>&1 || progress "per-event cost or agent CPU failed: see cost.log"
dmesg > $out/dmesg.txt
progress "done"
"#,
        xtask = xtask.display(),
        agent = agent.display()
    );
    Ok(script)
}

/// The matrix's tests named by `--test` (all when none is named).
pub fn chosen_tests(names: &[String]) -> Result<Vec<&'static VmTest>> {
    if names.is_empty() {
        return Ok(VM_TESTS.iter().collect());
    }
    names
        .iter()
        .map(|name| {
            VM_TESTS
                .iter()
                .find(|test| test.name == name)
                .with_context(|| {
                    let known: Vec<_> = VM_TESTS.iter().map(|test| test.name).collect();
                    format!("no VM test `{name}`: the matrix has {}", known.join(", "))
                })
        })
        .collect()
}

/// A table name as a file name (`net (fexit forced)` → `net-fexit-forced`).
fn file_name(name: &str) -> String {
    name.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

/// The matrix as text: what each program group uses per kernel, then each test binary's
/// outcome per kernel.
pub fn render(rows: &[Row]) -> String {
    let mut out = render_matrix(rows);
    out.push('\n');
    out.push_str(&render_costs(rows));
    out
}

/// The README's section: kernels, what runs there, tests.
pub fn render_matrix(rows: &[Row]) -> String {
    let mut out = String::new();
    let header: Vec<String> = rows
        .iter()
        .map(|row| format!("{} `{}`", row.name, row.release))
        .collect();
    let _ = writeln!(out, "| | {} |", header.join(" | "));
    let _ = writeln!(out, "|---|{}", "---|".repeat(rows.len()));
    let cell = |f: &dyn Fn(&Row) -> String| rows.iter().map(f).collect::<Vec<_>>().join(" | ");
    let _ = writeln!(out, "| from | {} |", cell(&|r| r.origin.clone()));
    let _ = writeln!(out, "| ran | {} |", cell(&|r| r.accel.clone()));
    let _ = writeln!(out, "| cgroups | {} |", cell(&|r| r.cgroups.clone()));
    let groups: std::collections::BTreeSet<&String> =
        rows.iter().flat_map(|r| r.variants.keys()).collect();
    for group in groups {
        let _ = writeln!(
            out,
            "| `{group}` | {} |",
            cell(&|r| r.variants.get(group).cloned().unwrap_or_else(|| "—".into()))
        );
    }
    let binaries: std::collections::BTreeSet<&String> =
        rows.iter().flat_map(|r| r.results.keys()).collect();
    for binary in binaries {
        let _ = writeln!(
            out,
            "| {binary} | {} |",
            cell(&|r| match r.results.get(binary) {
                None => "(not run here)".into(),
                Some(BinaryResult {
                    not_applicable: Some(reason),
                    ..
                }) => format!("n/a: {reason}"),
                Some(result) if result.ok() =>
                    format!("{} passed ({:.0} s)", result.passed.len(), result.seconds),
                Some(result) => format!(
                    "**{} failed** of {}",
                    result.failed.len().max(1),
                    result.passed.len() + result.failed.len()
                ),
            })
        );
    }
    let _ = writeln!(
        out,
        "| whole run | {} |",
        cell(&|r| format!("{:.0} s", r.seconds))
    );
    out
}

/// The per-event costs measured in each VM (bpf_stats on).
pub fn render_costs(rows: &[Row]) -> String {
    let mut out = String::new();
    let with_costs: Vec<&Row> = rows.iter().filter(|r| !r.costs.is_empty()).collect();
    if with_costs.is_empty() {
        return "No per-event costs were measured in the VMs.\n".into();
    }
    let _ = writeln!(
        out,
        "| kernel | program | loaded by | ns/event | events/s | × floor |\n|---|---|---|---|---|---|"
    );
    for row in with_costs {
        let floor = row
            .costs
            .iter()
            .find(|(_, name, _, _)| name == "switch_floor")
            .map(|(_, _, ns, _)| *ns);
        for (owner, name, ns, rate) in &row.costs {
            let ratio = floor
                .filter(|f| *f > 0.0)
                .map_or("n/a".to_owned(), |f| format!("{:.1}", ns / f));
            let _ = writeln!(
                out,
                "| {} `{}` | `{name}` | {owner} | {ns:.1} | {rate:.0} | {ratio} |",
                row.name, row.release
            );
        }
    }
    let with_agent_costs: Vec<&Row> = rows.iter().filter(|r| !r.agent_costs.is_empty()).collect();
    if !with_agent_costs.is_empty() {
        let _ = writeln!(
            out,
            "\nThe agent's CPU (`workerprobe top --interval 1s`, every group) with 1000 active \
             workers on pure cgroup2, by how their memory is read; median (min – max) of the \
             interleaved rounds, % of one emulated core (software emulation inflates it: compare \
             the rows, not with the host's figure):\n\n\
             | kernel | memory read | agent CPU |\n|---|---|---|"
        );
        for row in with_agent_costs {
            for cost in &row.agent_costs {
                let _ = writeln!(
                    out,
                    "| {} `{}` | {} | {:.2}% ({:.2} – {:.2}) |",
                    row.name,
                    row.release,
                    cost.memory_read,
                    cost.cpu_percent,
                    cost.cpu_percent_min,
                    cost.cpu_percent_max
                );
            }
        }
    }
    out
}

/// Replaces what lies between `<!-- NAME:begin -->` and `<!-- NAME:end -->` in `path`.
fn replace_section(path: &Path, name: &str, body: &str) -> Result<()> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let begin = format!("<!-- {name}:begin -->");
    let end = format!("<!-- {name}:end -->");
    let (Some(start), Some(stop)) = (text.find(&begin), text.find(&end)) else {
        bail!(
            "{} has no {begin} … {end} section to update",
            path.display()
        );
    };
    let updated = format!("{}{begin}\n{body}{}", &text[..start], &text[stop..]);
    fs::write(path, updated).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_libtest_lines() {
        let text = "running 4 tests\ntest a ... ok\ntest b ... FAILED\ntest c ... ignored\ntest d ... napper: 1 ms\nok\n\nfailures:\n\n---- b stdout ----\nboom\n\nfailures:\n    b\n\ntest result: FAILED. 2 passed; 1 failed;\n";
        let result = parse_libtest(text);
        assert_eq!(result.passed, ["a", "d"]);
        assert_eq!(result.failed, ["b"]);
        let excerpt = failure_excerpt(text);
        assert!(excerpt.starts_with("---- b stdout ----\nboom"), "{excerpt}");
        assert_eq!(failure_excerpt("one\ntwo\nkilled"), "one\ntwo\nkilled");
        let hung =
            "test a ... ok\ntest b ... === still running after 600 s: kernel stacks\n--- 7 b\n";
        assert!(
            failure_excerpt(hung).starts_with("test b ... ==="),
            "{}",
            failure_excerpt(hung)
        );
    }

    /// The guest's limit on a binary: an exit status passes through; a binary past the limit
    /// has its session's tasks named in its log and is killed, and the call returns 124.
    #[test]
    fn a_binary_past_its_limit_is_logged_and_killed() {
        let dir = std::env::temp_dir().join(format!("wp-xtask-limit-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("temp dir");
        let script = guest_script(
            &dir,
            Path::new("agent"),
            Path::new("xtask"),
            &BTreeMap::new(),
            &[],
        )
        .expect("script");
        let start = script.find("binary_limit=").expect("the limit");
        let end = start + script[start..].find("\n}\n").expect("the function's end") + 3;
        let (quick, hung) = (dir.join("quick.log"), dir.join("hung.log"));
        let test = format!(
            "{}binary_limit=2\nrun_limited {} sh -c 'echo hi; exit 3'; echo \"rc $?\"\nrun_limited {} sleep 60; echo \"rc $?\"\n",
            &script[start..end],
            quick.display(),
            hung.display()
        );
        let started = Instant::now();
        let output = Command::new("bash")
            .arg("-c")
            .arg(&test)
            .output()
            .expect("bash");
        let said = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            said,
            "rc 3\nrc 124\n",
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(fs::read_to_string(&quick).expect("quick log"), "hi\n");
        let log = fs::read_to_string(&hung).expect("hung log");
        assert!(log.contains("still running after 2 s"), "{log}");
        assert!(
            dir.join("hung.log.dmesg").exists(),
            "the kernel's whole log beside it"
        );
        assert!(
            log.lines()
                .any(|line| line.starts_with("---") && line.contains(" sleep ")),
            "{log}"
        );
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn every_vm_test_exists() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/tests");
        for test in VM_TESTS {
            assert!(
                dir.join(format!("{}.rs", test.binary)).exists(),
                "{}",
                test.binary
            );
        }
        assert_eq!(file_name("net (fexit forced)"), "net-fexit-forced");
        assert!(chosen(&["5.4".into()]).is_err());
        assert_eq!(chosen_tests(&[]).unwrap().len(), VM_TESTS.len());
        assert_eq!(chosen_tests(&["waits".into()]).unwrap()[0].binary, "waits");
        assert!(chosen_tests(&["wait".into()]).is_err());
        let (old, new) = (&MATRIX[0], &MATRIX[1]);
        assert!(old.matches("linux-image-6.1.0-57-cloud-amd64-unsigned"));
        assert!(!old.matches("linux-image-6.12.117+deb12-cloud-amd64-unsigned"));
        assert!(new.matches("linux-image-6.12.117+deb12-cloud-amd64-unsigned"));
        assert_eq!(
            new.pattern(),
            r"^linux-image-6\.12\.[0-9]+\+deb12-cloud-amd64-unsigned$"
        );
        assert_eq!(chosen(&[]).unwrap().len(), MATRIX.len());
    }
}
