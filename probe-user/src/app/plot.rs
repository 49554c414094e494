//! `workerprobe plot`: a recording drawn as one SVG (see `sink::picture::svg`); also what
//! `plot`, `trace` and `report` share: reading the recording into a picture, and writing
//! the result.

use std::path::Path;

use anyhow::Context as _;

use crate::{
    cli::{PictureArgs, PlotArgs},
    model::selection::Selection,
    recording::{
        at::{At, parse_at},
        read_recording,
    },
    sink::picture::{
        series::{Choice, Picture, build},
        svg::{self, SvgOptions},
    },
};

/// `workerprobe plot`.
pub fn plot(args: &PlotArgs) -> anyhow::Result<()> {
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

/// A `--from`/`--to` value: seconds from the start (`30s`, `2m`, `45`) or an RFC 3339 time,
/// as `replay --at` reads it; the error is one sentence (clap names the flag).
pub fn parse_time(text: &str) -> Result<At, String> {
    parse_at(text).map_err(|message| {
        message
            .strip_prefix("--at ")
            .map_or(message.clone(), str::to_string)
    })
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn times_read_as_replay_at_does_with_a_flagless_message() {
        assert_eq!(
            parse_time("2m"),
            Ok(At::FromStart(Duration::from_secs(120)))
        );
        let message = parse_time("soon").expect_err("not a time");
        assert!(message.starts_with("`soon` is not a time"), "{message}");
    }
}
