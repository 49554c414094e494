//! `workerprobe plot`: a recording drawn as one SVG (see `sink::picture::svg`); also what
//! `plot`, `trace` and `report` share: reading the recording into a picture, and writing
//! the result.

use std::path::Path;

use anyhow::Context as _;

use crate::{
    cli::{PictureArgs, PlotArgs},
    model::selection::Selection,
    recording::read_recording,
    sink::picture::{
        series::{Choice, Picture, build},
        svg::{self, SvgOptions},
    },
};

/// `workerprobe plot`.
pub fn plot(args: &PlotArgs) -> anyhow::Result<()> {
    refuse_other_formats(&args.input.out)?;
    let picture = load(&args.input)?;
    let text = svg::render(
        &picture,
        &SvgOptions {
            busiest: usize::from(args.busiest),
            per_cpu: args.per_cpu,
        },
    )
    .context("drawing the plot")?;
    write_out(&args.input.out, text.as_bytes(), &picture, "plot")
}

/// The plot is SVG: a name that says another format (x.png, x.pdf) would hold SVG under a
/// false name, so it is refused before anything is read or written.
fn refuse_other_formats(out: &Path) -> anyhow::Result<()> {
    match out.extension().and_then(|extension| extension.to_str()) {
        Some(extension) if !extension.eq_ignore_ascii_case("svg") => {
            Err(crate::error::UserError::BadInput(format!(
                "--out {}: plot draws SVG, not .{extension}: give a file name ending in .svg",
                out.display()
            ))
            .into())
        }
        _ => Ok(()),
    }
}

/// Reads the recording and builds the picture of the workers and window asked for; every
/// problem (a missing, empty, foreign or newer file, a window outside it) is one sentence.
pub fn load(input: &PictureArgs) -> anyhow::Result<Picture> {
    let selection = Selection::new(&input.patterns)?;
    let recording = read_recording(&input.file)?;
    let name = input.file.display().to_string();
    crate::recording::reader::tell_skipped(&recording, &name.to_string());
    let choice = Choice {
        selection,
        from: input.from,
        to: input.to,
    };
    // Every problem left is with what the user asked for (workers, window): bad input.
    build(&recording, &choice, &name)
        .map_err(|message| crate::error::UserError::BadInput(message).into())
}

/// Writes `bytes` to `path` and says so on stderr.
pub fn write_out(path: &Path, bytes: &[u8], picture: &Picture, what: &str) -> anyhow::Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))?;
    crate::say!(
        "workerprobe: wrote the {what} of {} workers ({}s to {}s) to {}",
        picture.workers.len(),
        crate::sink::picture::format_seconds(picture.from_seconds),
        crate::sink::picture::format_seconds(picture.to_seconds),
        path.display()
    );
    Ok(())
}
