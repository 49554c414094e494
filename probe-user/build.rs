//! Builds `probe-ebpf` for the BPF target with the nightly toolchain and bpf-linker, and puts
//! the object in OUT_DIR for `include_bytes_aligned!`. `cargo xtask setup` installs both.
use anyhow::{Context as _, anyhow};

fn main() -> anyhow::Result<()> {
    let cargo_metadata::Metadata { packages, .. } = cargo_metadata::MetadataCommand::new()
        .no_deps()
        .exec()
        .context("cargo metadata")?;
    let ebpf = packages
        .iter()
        .find(|package| package.name.as_str() == "probe-ebpf")
        .ok_or_else(|| anyhow!("probe-ebpf package not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("probe-ebpf manifest has no parent directory"))?;
    // The programs are built from probe-common too (map sizes, event layouts): a change
    // there must rebuild them, or the object and this crate would disagree.
    let common = packages
        .iter()
        .find(|package| package.name.as_str() == "probe-common")
        .and_then(|package| package.manifest_path.parent())
        .ok_or_else(|| anyhow!("probe-common package not found in the workspace"))?;
    println!("cargo:rerun-if-changed={common}/src");
    println!("cargo:rerun-if-changed={common}/Cargo.toml");
    if which_bpf_linker().is_none() {
        return Err(anyhow!(
            "bpf-linker is not installed: run `cargo xtask setup` (it installs bpf-linker and the nightly rust-src)"
        ));
    }
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "probe-ebpf",
            root_dir: root_dir.as_str(),
            ..Default::default()
        }],
        aya_build::Toolchain::Nightly,
    )
}

fn which_bpf_linker() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("bpf-linker"))
        .find(|candidate| candidate.is_file())
}
