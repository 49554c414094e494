//! `workerprobe unpin DIR`: removes a pin set made with `--pin DIR`.

use crate::{cli::UnpinArgs, loader::pin};

/// Detaches the set's programs, frees its maps and removes DIR.
pub fn unpin(args: &UnpinArgs) -> anyhow::Result<()> {
    let removed = pin::unpin(&args.dir)?;
    crate::say!(
        "workerprobe: unpinned {} program links and {} maps; removed {}",
        removed.links,
        removed.maps,
        args.dir.display()
    );
    Ok(())
}
