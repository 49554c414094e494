//! workerprobe's agent: loads the eBPF programs, reads their maps, and tells what each worker
//! (cgroup) did.
//!
//! Data flows one way: [`loader`] → [`collect`] → [`model`] → [`sink`]; [`app`] wires them per
//! command.

pub mod app;
pub mod cgroup;
pub mod cli;
pub mod clock;
pub mod collect;
mod collect_batch;
pub mod error;
pub mod loader;
pub mod memory;
pub mod model;
pub mod node;
pub mod recording;
pub mod sink;
