//! `workerprobe trace`: a recording as Chrome / Perfetto trace-event JSON (see
//! `sink::picture::trace`).

use anyhow::Context as _;

use super::plot::{load, write_out};
use crate::{cli::TraceArgs, sink::picture::trace};

/// `workerprobe trace`.
pub fn trace(args: &TraceArgs) -> anyhow::Result<()> {
    let picture = load(&args.input)?;
    let text = serde_json::to_string(&trace::render(&picture)).context("encoding the trace")?;
    write_out(&args.input.out, text.as_bytes(), &picture, "trace")
}
