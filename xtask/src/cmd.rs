//! Helpers for running child commands and inspecting the environment.

use std::env;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

/// The workspace root: the parent of this crate's directory.
pub fn workspace_root() -> Result<&'static Path> {
    let manifest_dir = env!("CARGO_MANIFEST_DIR");
    Path::new(manifest_dir)
        .parent()
        .with_context(|| format!("xtask's directory {manifest_dir} has no parent"))
}

/// The directory cargo writes build output to.
pub fn target_dir() -> Result<PathBuf> {
    match env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => Ok(workspace_root()?.join("target")),
    }
}

/// A `cargo` command run from the workspace root.
///
/// Uses `$CARGO` (the cargo that started xtask) so the toolchain stays the same.
pub fn cargo() -> Result<Command> {
    let program = env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"));
    let mut cmd = Command::new(program);
    cmd.current_dir(workspace_root()?);
    Ok(cmd)
}

/// Renders a command the way a user would type it, for messages.
pub fn describe(cmd: &Command) -> String {
    let mut words = vec![display_program(cmd.get_program())];
    words.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    words.join(" ")
}

/// Shows `cargo` rather than the full toolchain path that `$CARGO` holds.
fn display_program(program: &OsStr) -> String {
    let path = Path::new(program);
    match path.file_name() {
        Some(name) if name == "cargo" => "cargo".to_owned(),
        _ => program.to_string_lossy().into_owned(),
    }
}

/// Runs a command with inherited stdio and fails unless it exits successfully.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{}`", describe(cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", describe(cmd));
    }
    Ok(())
}

/// Runs a command silently and returns its stdout if it exits successfully.
///
/// Used for checks, where a missing program or a failure just means "not there yet".
pub fn probe(cmd: &mut Command) -> Option<String> {
    let output = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Whether the process runs with effective uid 0.
pub fn is_root() -> bool {
    effective_uid() == Some(0)
}

/// Reads the effective uid without libc: from /proc, or from `id -u` as a fallback.
fn effective_uid() -> Option<u32> {
    let from_proc = fs::read_to_string("/proc/self/status").ok().and_then(|s| {
        // "Uid:\treal\teffective\tsaved\tfs"
        let line = s.lines().find(|l| l.starts_with("Uid:"))?;
        line.split_whitespace().nth(2)?.parse().ok()
    });
    from_proc.or_else(|| probe(Command::new("id").arg("-u"))?.trim().parse().ok())
}

/// Finds an executable by name in `$PATH`.
pub fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = env::var_os("PATH")?;
    env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Where `cargo install` puts binaries: `$CARGO_HOME/bin` and `~/.cargo/bin`.
pub fn cargo_bin_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(home) = env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(home).join("bin"));
    }
    if let Some(home) = env::var_os("HOME") {
        let dir = PathBuf::from(home).join(".cargo").join("bin");
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
}

/// `$PATH` with `dirs` in front, leaving out those already on it.
pub fn path_with(dirs: &[PathBuf]) -> Result<OsString> {
    let current: Vec<PathBuf> = env::var_os("PATH")
        .map(|p| env::split_paths(&p).collect())
        .unwrap_or_default();
    let missing = dirs.iter().filter(|d| !current.contains(d)).cloned();
    env::join_paths(missing.chain(current.iter().cloned()))
        .context("could not build a PATH (a directory name contains ':')")
}
