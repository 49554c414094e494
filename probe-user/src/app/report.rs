//! `workerprobe report`: a recording as one self-contained HTML page (see
//! `sink::picture::html`).

use anyhow::Context as _;

use super::plot::{load, write_out};
use crate::{
    cli::ReportArgs,
    sink::picture::{
        html,
        svg::{self, SvgOptions},
    },
};

/// `workerprobe report`.
pub fn report(args: &ReportArgs) -> anyhow::Result<()> {
    let picture = load(&args.input)?;
    let plot = svg::render(
        &picture,
        &SvgOptions {
            busiest: usize::from(args.busiest),
            per_cpu: false,
        },
    )
    .context("drawing the plots")?;
    let page = html::render(&picture, &plot);
    write_out(&args.input.out, page.as_bytes(), &picture, "report")
}
