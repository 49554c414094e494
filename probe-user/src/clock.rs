//! Timestamps: the node's monotonic clock (the one `bpf_ktime_get_ns` reads) and wall time.

use std::time::{SystemTime, UNIX_EPOCH};

/// The kernel's own view of how good the wall clock is (`adjtimex`, as NTP and chrony keep
/// it): whether a time service has it synchronised, and its estimated and maximum error.
/// Timestamps of two nodes are comparable only to within their errors.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClockQuality {
    /// Synchronised: `STA_UNSYNC` is clear and adjtimex does not answer `TIME_ERROR`.
    pub synchronized: bool,
    /// `esterror`: the time service's estimate of the clock's error, seconds.
    pub estimated_error_seconds: f64,
    /// `maxerror`: the most the clock may be off, seconds (grows while unsynchronised).
    pub max_error_seconds: f64,
}

impl ClockQuality {
    /// The clock's quality now; `None` where adjtimex fails.
    pub fn read() -> Option<Self> {
        // SAFETY: a zeroed timex with modes 0 only reads; adjtimex writes into it.
        let mut timex: libc::timex = unsafe { std::mem::zeroed() };
        // SAFETY: `timex` is valid and writable.
        let state = unsafe { libc::adjtimex(&mut timex) };
        if state < 0 {
            return None;
        }
        Some(Self {
            synchronized: state != libc::TIME_ERROR && timex.status & libc::STA_UNSYNC == 0,
            estimated_error_seconds: timex.esterror as f64 / 1e6,
            max_error_seconds: timex.maxerror as f64 / 1e6,
        })
    }
}

/// A moment on both clocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Timestamp {
    /// CLOCK_MONOTONIC nanoseconds: one clock for every worker on the node.
    pub monotonic_ns: u64,
    /// Nanoseconds since the Unix epoch.
    pub wall_unix_ns: u64,
}

impl Timestamp {
    /// Now.
    pub fn now() -> Self {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Self {
            monotonic_ns: ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64,
            wall_unix_ns: wall.as_nanos() as u64,
        }
    }

    /// Wall time as RFC 3339 (UTC, nanoseconds).
    pub fn rfc3339(&self) -> String {
        rfc3339_from_unix_ns(self.wall_unix_ns)
    }
}

/// Formats Unix nanoseconds as RFC 3339 in UTC.
pub fn rfc3339_from_unix_ns(unix_ns: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(unix_ns))
        .ok()
        .and_then(|at| {
            at.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("@{unix_ns}ns"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339() {
        assert_eq!(
            rfc3339_from_unix_ns(1_500_000_000),
            "1970-01-01T00:00:01.5Z"
        );
    }
}
