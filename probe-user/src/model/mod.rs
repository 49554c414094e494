//! The model: pure functions from raw cumulative samples to what each worker did over an
//! interval. No kernel, no I/O, no async: every type here can be built in a unit test.

mod agent;
pub mod endpoints;
pub mod identity;
pub mod process;
pub mod registry;
mod sample;
pub mod selection;
pub mod series;
mod stats;
pub mod summary;
pub mod tree;

pub use agent::{AgentCost, ProgramCost};
pub use sample::{
    CpuStatUsec, Drops, ExitMemoryPeaks, LifecycleEvent, Measured, MemoryReading, MemorySource,
    Sample, WorkerCounters,
};
pub use stats::{
    Delays, FamilyDelta, FamilyTotals, Interval, WorkerStats, diff, diff_reusing,
    families_with_calls, split_user_system, totals,
};

/// Version of every JSON layout workerprobe writes (documents, exit records, recordings);
/// bumped when a field changes meaning or goes away (adding a field does not bump it).
/// 2: an exit record's `net.families` holds the four figures per family as an object, as
/// tick lines and `snapshot --json` do (it was `[sent_bytes, received_bytes]`), and
/// `lithops.worker_peak_memory` is `worker_peak_memory_end`, Lithops' own name.
/// 3: kind `podman`, and a container's `name` is the one its runtime gave it.
pub const SCHEMA_VERSION: u32 = 4;
