//! Rebuild when bpf-linker changes (a new LLVM may emit different code).
fn main() {
    if let Ok(linker) = which::which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", linker.display());
    }
}
