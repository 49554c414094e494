//! Facts about the node, from sysinfo: shown beside every worker's numbers.

use sysinfo::{CpuRefreshKind, MemoryRefreshKind, RefreshKind, System};

/// What a reader needs to put a worker's numbers in context.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeFacts {
    /// Host name.
    pub hostname: String,
    /// Kernel release (`uname -r`).
    pub kernel: String,
    /// Logical CPUs.
    pub cpus: usize,
    /// CPU model name.
    pub cpu_model: String,
    /// Physical memory.
    pub memory_bytes: u64,
    /// Boot time, seconds since the Unix epoch.
    pub boot_time_epoch_secs: u64,
}

impl NodeFacts {
    /// Reads the facts of this node.
    pub fn read() -> Self {
        let system = System::new_with_specifics(
            RefreshKind::nothing()
                .with_cpu(CpuRefreshKind::nothing())
                .with_memory(MemoryRefreshKind::nothing().with_ram()),
        );
        Self {
            hostname: System::host_name().unwrap_or_default(),
            kernel: System::kernel_version().unwrap_or_default(),
            cpus: system.cpus().len(),
            cpu_model: system
                .cpus()
                .first()
                .map(|cpu| cpu.brand().trim().to_string())
                .unwrap_or_default(),
            memory_bytes: system.total_memory(),
            boot_time_epoch_secs: System::boot_time(),
        }
    }
}
