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
];

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
    Ok(())
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
