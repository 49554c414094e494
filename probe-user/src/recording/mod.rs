//! Recordings: the JSON Lines files `workerprobe record` writes and `workerprobe replay`
//! reads (their layout is described, field by field, in docs/recording.md).
//!
//! This module owns the format: the line types ([`line`]), appending, syncing and rotating
//! ([`writer`]), tolerant reading into ticks that rebuild the model's samples ([`reader`]),
//! and what `--at` means ([`at`]). It does no kernel work: every part is tested from text.

pub mod at;
pub mod line;
pub mod merge;
pub mod reader;
pub mod writer;

pub use line::{FORMAT, SCHEMA_VERSION};
pub use reader::{Recording, Segment, Tick, read_recording};
pub use writer::RecordingWriter;
