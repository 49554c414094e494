//! `workerprobe merge`: several nodes' recordings as one (see `recording::merge`).

use std::{
    fs::File,
    io::{BufReader, BufWriter, Write as _},
};

use anyhow::Context as _;

use crate::{
    cli::MergeArgs,
    error::UserError,
    recording::merge::{MergeInput, merge as merge_lines},
};

/// `workerprobe merge`: written beside `--out` and renamed over it when whole, so a failed
/// merge leaves no half file and never touches an input.
pub fn merge(args: &MergeArgs) -> anyhow::Result<()> {
    // A file is known by its device and inode, whatever path names it.
    let identity = |path: &std::path::Path| {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(path)
            .ok()
            .map(|metadata| (metadata.dev(), metadata.ino()))
    };
    let out_identity = identity(&args.out);
    let mut inputs = Vec::with_capacity(args.files.len());
    let mut seen = Vec::new();
    for path in &args.files {
        let handle = identity(path);
        if handle.is_some() && handle == out_identity {
            return Err(UserError::BadInput(format!(
                "--out {} is one of the recordings to merge: give another --out",
                args.out.display()
            ))
            .into());
        }
        if handle.is_some() && seen.contains(&handle) {
            return Err(UserError::BadInput(format!(
                "{} is given twice: give each recording once",
                path.display()
            ))
            .into());
        }
        seen.push(handle);
        let file = File::open(path)
            .with_context(|| format!("cannot open the recording {}", path.display()))?;
        inputs.push(MergeInput {
            name: path.display().to_string(),
            reader: BufReader::new(file),
        });
    }
    let mut partial = args.out.clone().into_os_string();
    partial.push(format!(".partial-{}", std::process::id()));
    let partial = std::path::PathBuf::from(partial);
    let written = (|| {
        let file = File::create(&partial)
            .with_context(|| format!("cannot write {}", partial.display()))?;
        let mut out = BufWriter::new(file);
        let summary = merge_lines(inputs, &mut out)?;
        out.flush().context("writing the merged recording")?;
        out.get_ref()
            .sync_all()
            .context("writing the merged recording")?;
        std::fs::rename(&partial, &args.out)
            .with_context(|| format!("cannot write {}", args.out.display()))?;
        anyhow::Ok(summary)
    })();
    let summary = match written {
        Ok(summary) => summary,
        Err(err) => {
            let _ = std::fs::remove_file(&partial);
            return Err(err);
        }
    };
    if summary.skipped_lines > 0 {
        crate::say!(
            "workerprobe: skipped {} corrupt line{} of the inputs",
            summary.skipped_lines,
            if summary.skipped_lines == 1 { "" } else { "s" }
        );
    }
    crate::say!(
        "workerprobe: merged {} recordings of {} node{} ({}) into {} ({} lines)",
        args.files.len(),
        summary.nodes.len(),
        if summary.nodes.len() == 1 { "" } else { "s" },
        summary.nodes.join(", "),
        args.out.display(),
        summary.lines
    );
    Ok(())
}
