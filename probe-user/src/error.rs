//! Errors a user can cause or meet on their machine, each one clear sentence saying what to do.

use std::path::PathBuf;

/// A problem the user can fix; `main` prints it as one sentence and exits non-zero.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
    /// Loading eBPF programs needs privileges the process does not hold.
    #[error(
        "workerprobe needs root (or CAP_BPF and CAP_PERFMON) to load its eBPF programs: run it with sudo"
    )]
    NotPrivileged,
    /// The kernel exposes no BTF, which `tp_btf` programs need.
    #[error(
        "the kernel has no BTF at /sys/kernel/btf/vmlinux: use a kernel built with CONFIG_DEBUG_INFO_BTF=y (most distribution kernels since 5.4)"
    )]
    NoKernelBtf,
    /// None of the measurements asked for can run on this kernel.
    #[error("{}", nothing_to_measure(.0))]
    NothingToMeasure(Vec<String>),
    /// No cgroup2 hierarchy is mounted.
    #[error(
        "no cgroup2 file system is mounted: mount one (`mount -t cgroup2 none /sys/fs/cgroup/unified`) or boot with systemd.unified_cgroup_hierarchy=1"
    )]
    NoCgroup2,
    /// The cgroup2 hierarchy cannot be written to.
    #[error(
        "cannot make a cgroup under {0}: run as root on a host whose cgroup2 hierarchy is writable"
    )]
    NoWritableCgroup2(PathBuf),
    /// A value the user gave is not usable (beyond what the flag parsers check).
    #[error("{0}")]
    BadInput(String),
    /// A path given by the user is not a cgroup under the cgroup2 mount.
    #[error(
        "{0} is not a cgroup directory under the cgroup2 mount: give a path like /sys/fs/cgroup/myworker"
    )]
    NotACgroup(PathBuf),
}

impl UserError {
    /// Whether the user's input was at fault (exit code 2), not the machine (exit code 1).
    pub fn is_bad_input(&self) -> bool {
        matches!(self, Self::BadInput(_) | Self::NotACgroup(_))
    }
}

/// The sentence for [`UserError::NothingToMeasure`].
fn nothing_to_measure(notes: &[String]) -> String {
    let why = notes
        .iter()
        .map(|note| note.trim_end_matches("; the other measurements run"))
        .collect::<Vec<_>>()
        .join("; ");
    format!(
        "nothing asked for can be measured on this kernel ({why}): run a newer kernel (Linux 6.1 is the oldest tested), or ask for other --programs"
    )
}
