//! workerprobe's agent: loads the eBPF programs, reads their maps, and tells what each worker
//! (cgroup) did.
//!
//! Data flows one way: [`loader`] → [`collect`] → [`model`] → [`sink`]; [`app`] wires them per
//! command.

/// Writes a line to stderr, ignoring a closed or full stderr (`eprintln!` would panic, and
/// an agent must not die because nobody reads its messages).
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod app;
pub mod cgroup;
pub mod cli;
pub mod clock;
pub mod collect;
pub mod cpu_switch;
pub mod error;
pub mod loader;
pub mod model;
pub mod node;
pub mod privileges;
pub mod recording;
pub mod runtimes;
pub mod sink;

/// A map keyed by cgroup id, hashed by foldhash: the agent looks up every worker's id in a few
/// of these each sample, where SipHash was a twentieth of its CPU at a thousand workers (the
/// ids are the kernel's, not an attacker's choice).
pub type IdMap<V> = std::collections::HashMap<u64, V, foldhash::fast::RandomState>;
