//! Least privilege: after the programs are loaded and attached, the agent can drop to an
//! unprivileged user and every capability. It keeps working through the file descriptors it
//! already holds (maps, the ring buffer's mapping, the listening socket): Linux 6.5 and later
//! allow map reads on a held descriptor without CAP_BPF, and everything else it reads
//! (/proc/<tid>/schedstat and cgroup, cgroupfs stat files) is world-readable.

use std::ffi::CString;

use crate::error::UserError;

/// A user to become: its uid and primary gid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Account {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
}

/// Looks a user up by name (or a numeric uid).
pub fn lookup(name: &str) -> Result<Account, UserError> {
    let unknown = || {
        UserError::BadInput(format!(
            "there is no user `{name}` on this host: give --user an existing user name, e.g. nobody"
        ))
    };
    let c_name = CString::new(name).map_err(|_| unknown())?;
    // SAFETY: getpwnam reads a NUL-terminated name; the returned record is copied at once.
    let entry = unsafe { libc::getpwnam(c_name.as_ptr()) };
    if !entry.is_null() {
        // SAFETY: non-null passwd record from getpwnam.
        let entry = unsafe { &*entry };
        return Ok(Account {
            uid: entry.pw_uid,
            gid: entry.pw_gid,
        });
    }
    let uid: u32 = name.parse().map_err(|_| unknown())?;
    // SAFETY: as above, by uid.
    let entry = unsafe { libc::getpwuid(uid) };
    if entry.is_null() {
        return Err(unknown());
    }
    // SAFETY: non-null passwd record from getpwuid.
    let entry = unsafe { &*entry };
    Ok(Account {
        uid: entry.pw_uid,
        gid: entry.pw_gid,
    })
}

/// Becomes `account` with no supplementary groups and no capabilities, for good (no way
/// back, and no new privileges through exec). Fails if any step is refused.
pub fn drop_to(account: Account) -> anyhow::Result<()> {
    // SAFETY: plain system calls with valid arguments; their results are checked.
    unsafe {
        // Capabilities must not survive the uid change.
        if libc::prctl(libc::PR_SET_KEEPCAPS, 0, 0, 0, 0) != 0
            || libc::setgroups(0, std::ptr::null()) != 0
            || libc::setresgid(account.gid, account.gid, account.gid) != 0
            || libc::setresuid(account.uid, account.uid, account.uid) != 0
            || libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
        {
            return Err(
                anyhow::Error::new(std::io::Error::last_os_error()).context("dropping privileges")
            );
        }
    }
    if effective_capabilities() != Some(0) && account.uid != 0 {
        anyhow::bail!(
            "capabilities remained after dropping to uid {}",
            account.uid
        );
    }
    Ok(())
}

/// The `CapEff` mask of this process.
pub fn effective_capabilities() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    crate::loader::parse_cap_eff(&status)
}
