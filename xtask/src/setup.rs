//! `cargo xtask setup`: make a fresh Debian machine able to build and test workerprobe.
//!
//! Every step checks first and only acts when something is missing, so running it again
//! takes a few seconds. The other tasks run it before doing anything.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::cmd;

/// Debian packages the build and the integration tests need.
const APT_PACKAGES: &[&str] = &[
    // bpf-linker links against LLVM 22 (the LLVM nightly rustc uses) and its compressors.
    "llvm-22-dev",
    "zlib1g-dev",
    "libzstd-dev",
    // Tools the integration tests drive or compare against.
    "bpftool",
    "iperf3",
    "linux-perf",
    "stress-ng",
    // Peers `cargo xtask bench` compares against (bpftrace; psutil for /usr/bin/python3).
    "bpftrace",
    "python3-psutil",
    // Real components the tests drive: Prometheus (serve), tmux (the top terminal UI).
    "prometheus",
    "tmux",
    // Headless Chromium renders the HTML report in its test.
    "chromium",
    // A real container runtime for the container-name tests: podman with runc (crun refuses
    // hybrid cgroup hosts), and busybox-static, the whole of the test's image.
    "podman",
    "runc",
    "busybox-static",
    // The virtual environment of the frameworks the process-worker tests drive.
    "python3-venv",
];

/// Python frameworks the process-worker tests drive, from PyPI, at the versions tested.
const PYTHON_FRAMEWORKS: &[&str] = &["lithops==3.8.0", "distributed==2026.8.0"];

/// Where llvm-22-dev puts `llvm-config`, which bpf-linker's build looks up in PATH.
const LLVM_BIN: &str = "/usr/lib/llvm-22/bin";

/// The `cargo install` arguments for bpf-linker.
///
/// Its LLVM major must match nightly's (22), or the bitcode rustc emits cannot be read.
const BPF_LINKER_INSTALL: &[&str] = &[
    "install",
    "bpf-linker",
    "--no-default-features",
    "--features",
    "llvm-22",
];

/// Runs every setup step, skipping those already done.
pub fn setup() -> Result<()> {
    rust_src()?;
    let missing = missing_packages();
    let linker_missing = find_bpf_linker().is_none();
    if !missing.is_empty()
        && let Err(reason) = check_can_use_apt()
    {
        print_manual_steps(&missing, linker_missing);
        return Err(reason);
    }
    step("Debian packages", missing.is_empty(), || {
        install_packages(&missing)
    })?;
    step("bpf-linker (LLVM 22)", !linker_missing, install_bpf_linker)?;
    python_frameworks()?;
    Ok(())
}

/// The virtual environment at target/py/venv with [`PYTHON_FRAMEWORKS`], made with Debian's
/// Python.
fn python_frameworks() -> Result<()> {
    let venv = cmd::target_dir()?.join("py").join("venv");
    let python = venv.join("bin").join("python");
    let check = "import importlib.metadata as m; assert m.version('lithops') == '3.8.0'; assert m.version('distributed') == '2026.8.0'";
    let installed = cmd::probe(Command::new(&python).args(["-c", check])).is_some();
    step("Python frameworks (PyPI)", installed, || {
        cmd::run(
            Command::new("/usr/bin/python3")
                .args(["-m", "venv"])
                .arg(&venv),
        )?;
        cmd::run(
            Command::new(venv.join("bin").join("pip"))
                .args(["install", "--quiet"])
                .args(PYTHON_FRAMEWORKS),
        )
    })
}

/// Prints the step, runs `install` unless `done`, and reports the outcome.
fn step(name: &str, done: bool, install: impl FnOnce() -> Result<()>) -> Result<()> {
    if done {
        println!("setup: {name} … already done");
        return Ok(());
    }
    // A line of its own: the installer's output follows it.
    println!("setup: {name} …");
    install().with_context(|| format!("setup step `{name}` failed"))?;
    println!("setup: {name} … ok");
    Ok(())
}

/// Nightly's rust-src, which `-Z build-std=core` needs to build the eBPF programs.
fn rust_src() -> Result<()> {
    if cmd::find_in_path("rustup").is_none() {
        bail!(
            "rustup is not installed: install Rust with rustup (https://rustup.rs), then run `cargo xtask setup` again"
        );
    }
    let installed = cmd::probe(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]));
    let done = installed
        .as_deref()
        .is_some_and(|list| list.lines().any(|l| l.trim() == "rust-src"));
    step("rust-src for the nightly toolchain", done, || {
        let mut add = Command::new("rustup");
        if installed.is_some() {
            add.args(["component", "add", "rust-src", "--toolchain", "nightly"]);
        } else {
            // The listing fails when nightly itself is missing; `component add` would too.
            add.args([
                "toolchain",
                "install",
                "nightly",
                "--profile",
                "minimal",
                "--component",
                "rust-src",
            ]);
        }
        cmd::run(&mut add)
    })
}

/// The packages of `APT_PACKAGES` that dpkg does not report as installed.
fn missing_packages() -> Vec<&'static str> {
    APT_PACKAGES
        .iter()
        .copied()
        .filter(|package| !is_installed(package))
        .collect()
}

/// Whether dpkg reports `package` as installed (false when dpkg-query is missing).
fn is_installed(package: &str) -> bool {
    cmd::probe(Command::new("dpkg-query").args(["-W", "-f=${Status}", package]))
        .is_some_and(|status| status.contains("install ok installed"))
}

/// Fails with one sentence saying why apt-get cannot be used here.
fn check_can_use_apt() -> Result<()> {
    if cmd::find_in_path("apt-get").is_none() {
        bail!(
            "apt-get was not found: setup supports Debian only, so install the packages above with your package manager"
        );
    }
    if !cmd::is_root() {
        bail!(
            "installing Debian packages needs root: run the commands above, or run `sudo -E cargo xtask setup`"
        );
    }
    Ok(())
}

/// Tells a user who cannot install packages from here what to run by hand.
fn print_manual_steps(missing: &[&str], linker_missing: bool) {
    eprintln!(
        "setup: these Debian packages are missing: {}",
        missing.join(" ")
    );
    eprintln!("setup: run these commands by hand, then run `cargo xtask setup` again:");
    eprintln!("    sudo apt-get update");
    eprintln!(
        "    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends {}",
        missing.join(" ")
    );
    if linker_missing {
        eprintln!(
            "    PATH={LLVM_BIN}:$PATH cargo {}",
            BPF_LINKER_INSTALL.join(" ")
        );
    }
}

/// `apt-get update` once, then installs `packages`.
fn install_packages(packages: &[&str]) -> Result<()> {
    cmd::run(Command::new("apt-get").arg("update"))?;
    cmd::run(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y", "--no-install-recommends"])
            .args(packages),
    )
}

/// A `bpf-linker` that answers `--version`, from PATH or cargo's bin directories.
fn find_bpf_linker() -> Option<PathBuf> {
    // Cargo's bin directories may be missing from PATH, e.g. under sudo's secure_path.
    let installed = cmd::cargo_bin_dirs()
        .into_iter()
        .map(|dir| dir.join("bpf-linker"));
    cmd::find_in_path("bpf-linker")
        .into_iter()
        .chain(installed)
        .find(|linker| cmd::probe(Command::new(linker).arg("--version")).is_some())
}

/// Builds and installs bpf-linker against the system's LLVM 22.
fn install_bpf_linker() -> Result<()> {
    let path = cmd::path_with(&[PathBuf::from(LLVM_BIN)])?;
    cmd::run(cmd::cargo()?.args(BPF_LINKER_INSTALL).env("PATH", path))?;
    if find_bpf_linker().is_none() {
        bail!("bpf-linker was installed but `bpf-linker --version` still fails");
    }
    Ok(())
}

/// Debian packages the VM matrix needs besides qemu: udev (without it virtme-ng loses the
/// guest's output), a static busybox and kmod for its initramfs, e2fsprogs for the scratch
/// disk, python3-venv for virtme-ng, and the libraries virtiofsd links.
const VM_APT_PACKAGES: &[&str] = &[
    "udev",
    "busybox-static",
    "kmod",
    "e2fsprogs",
    "python3-venv",
    "libseccomp-dev",
    "libcap-ng-dev",
];

/// virtme-ng, from PyPI (the version this matrix was made with).
const VIRTME_NG: &str = "virtme-ng==1.42";

/// virtiofsd, from crates.io: the -cloud kernels share the root over virtiofs only.
const VIRTIOFSD_VERSION: &str = "1.14.0";

/// The apt sources the VM matrix reads: bookworm for qemu's libraries, bookworm-backports for
/// a qemu matching the machine's qemu-utils 10.0 (bookworm's 7.2 conflicts with it), and
/// bookworm-security for the kernels. A private list: nothing is added to /etc/apt.
const VM_APT_SOURCES: &str = "\
deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-updates main
deb http://deb.debian.org/debian bookworm-backports main
deb http://deb.debian.org/debian-security bookworm-security main
";

/// Makes this machine able to run the VM matrix and returns the kernels of `specs`, each
/// downloaded (newest of its series in the archive) and unpacked once, then cached.
pub fn setup_vm(specs: &[&'static crate::vm::KernelSpec]) -> Result<Vec<crate::vm::Kernel>> {
    let vm = crate::vm::vm_dir()?;
    std::fs::create_dir_all(&vm)?;
    let apt = PrivateApt::new(&vm.join("apt"))?;
    let missing: Vec<&str> = VM_APT_PACKAGES
        .iter()
        .copied()
        .filter(|package| !is_installed(package))
        .collect();
    let qemu_missing = cmd::find_in_path("qemu-system-x86_64").is_none();
    if (!missing.is_empty() || qemu_missing)
        && let Err(reason) = check_can_use_apt()
    {
        eprintln!(
            "setup: the VM matrix needs these Debian packages: {} qemu-system-x86 (bookworm-backports)",
            missing.join(" ")
        );
        return Err(reason);
    }
    step("Debian packages for the VMs", missing.is_empty(), || {
        install_packages(&missing)
    })?;
    step(
        "qemu-system-x86 (bookworm-backports)",
        !qemu_missing,
        || {
            apt.update()?;
            cmd::run(
                apt.command("apt-get")
                    .env("DEBIAN_FRONTEND", "noninteractive")
                    .args([
                        "install",
                        "-y",
                        "--no-install-recommends",
                        "-t",
                        "bookworm-backports",
                        "qemu-system-x86",
                    ]),
            )
        },
    )?;
    let venv = vm.join("venv");
    let vng = venv.join("bin").join("vng");
    let vng_works = cmd::probe(Command::new(&vng).arg("--version")).is_some();
    step("virtme-ng (PyPI)", vng_works, || {
        cmd::run(Command::new("python3").args(["-m", "venv"]).arg(&venv))?;
        cmd::run(Command::new(venv.join("bin").join("pip")).args(["install", "--quiet", VIRTME_NG]))
    })?;
    let virtiofsd = cmd::find_in_path("virtiofsd").is_some()
        || cmd::cargo_bin_dirs()
            .iter()
            .any(|dir| dir.join("virtiofsd").is_file());
    step("virtiofsd (crates.io)", virtiofsd, || {
        cmd::run(cmd::cargo()?.args([
            "install",
            "--locked",
            "virtiofsd",
            "--version",
            VIRTIOFSD_VERSION,
        ]))
    })?;
    let kernels_dir = vm.join("kernels");
    std::fs::create_dir_all(&kernels_dir)?;
    let mut updated = false;
    specs
        .iter()
        .map(|spec| kernel(spec, &kernels_dir, &apt, &mut updated))
        .collect()
}

/// The newest package of `spec`'s series, downloaded and unpacked under `dir` unless it is
/// there already; offline, the newest one cached.
fn kernel(
    spec: &'static crate::vm::KernelSpec,
    dir: &std::path::Path,
    apt: &PrivateApt,
    updated: &mut bool,
) -> Result<crate::vm::Kernel> {
    if !*updated {
        // Once per run: the archive moves on (security updates).
        *updated = apt.update().is_ok();
    }
    let listed =
        cmd::probe(
            apt.command("apt-cache")
                .args(["search", "--names-only", &spec.pattern()]),
        )
        .unwrap_or_default();
    let mut packages: Vec<String> = listed
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect();
    let cached = || -> Vec<String> {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.path().join("boot").is_dir())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|name| spec.matches(name))
                    .collect()
            })
            .unwrap_or_default()
    };
    if packages.is_empty() {
        packages = cached();
    }
    packages.sort_by_key(|name| natural_key(name));
    let package = packages
        .last()
        .with_context(|| {
            format!(
                "no Debian package matches {} and none is cached: check the network or apt",
                spec.pattern()
            )
        })?
        .clone();
    let unpacked = dir.join(&package);
    step(
        &format!("kernel {package}"),
        unpacked.join("boot").is_dir(),
        || {
            let download = dir.join("download");
            std::fs::create_dir_all(&download)?;
            cmd::run(
                apt.command("apt-get")
                    .args(["download", &package])
                    .current_dir(&download),
            )?;
            let deb = std::fs::read_dir(&download)?
                .flatten()
                .map(|e| e.path())
                .find(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{package}_")))
                })
                .context("apt-get download left no .deb")?;
            cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
            std::fs::remove_file(&deb)?;
            Ok(())
        },
    )?;
    let vmlinuz = std::fs::read_dir(unpacked.join("boot"))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .with_context(|| format!("{package} holds no vmlinuz"))?;
    let release = vmlinuz
        .file_name()
        .map(|n| {
            n.to_string_lossy()
                .trim_start_matches("vmlinuz-")
                .to_owned()
        })
        .unwrap_or_default();
    Ok(crate::vm::Kernel {
        spec,
        vmlinuz,
        release,
    })
}

/// Orders package names by their numbers (6.1.0-9 before 6.1.0-10).
fn natural_key(name: &str) -> Vec<(u64, String)> {
    let mut key = Vec::new();
    let mut digits = String::new();
    let mut text = String::new();
    for c in name.chars() {
        if c.is_ascii_digit() {
            if !text.is_empty() {
                key.push((0, std::mem::take(&mut text)));
            }
            digits.push(c);
        } else {
            if !digits.is_empty() {
                key.push((digits.parse().unwrap_or(0), String::new()));
                digits.clear();
            }
            text.push(c);
        }
    }
    if !digits.is_empty() {
        key.push((digits.parse().unwrap_or(0), String::new()));
    }
    if !text.is_empty() {
        key.push((0, text));
    }
    key
}

/// apt with a source list and package lists of its own (under target/vm/apt).
struct PrivateApt {
    options: Vec<String>,
}

impl PrivateApt {
    fn new(dir: &std::path::Path) -> Result<Self> {
        let lists = dir.join("lists");
        std::fs::create_dir_all(lists.join("partial"))?;
        let parts = dir.join("sources.list.d");
        std::fs::create_dir_all(&parts)?;
        let sources = dir.join("sources.list");
        std::fs::write(&sources, VM_APT_SOURCES)?;
        Ok(Self {
            options: vec![
                format!("Dir::Etc::SourceList={}", sources.display()),
                format!("Dir::Etc::SourceParts={}", parts.display()),
                format!("Dir::State::Lists={}", lists.display()),
                // Downloads land in directories the _apt user cannot write: no sandbox.
                "APT::Sandbox::User=root".into(),
            ],
        })
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        for option in &self.options {
            command.arg("-o").arg(option);
        }
        command
    }

    fn update(&self) -> Result<()> {
        cmd::run(self.command("apt-get").arg("update"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newest_kernel_sorts_last() {
        let mut names = [
            "linux-image-6.1.0-57-cloud-amd64-unsigned",
            "linux-image-6.1.0-9-cloud-amd64-unsigned",
            "linux-image-6.1.0-100-cloud-amd64-unsigned",
        ];
        names.sort_by_key(|name| natural_key(name));
        assert_eq!(names[2], "linux-image-6.1.0-100-cloud-amd64-unsigned");
        assert_eq!(names[0], "linux-image-6.1.0-9-cloud-amd64-unsigned");
    }
}
