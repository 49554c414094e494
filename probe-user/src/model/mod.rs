//! The model: pure functions from raw cumulative samples to what each worker did over an
//! interval. No kernel, no I/O, no async: every type here can be built in a unit test.

mod sample;
mod stats;

pub use sample::{CpuStatUsec, Drops, Sample, WorkerCounters};
pub use stats::{Delays, FamilyDelta, Interval, WorkerStats, diff};
