//! Facts about the node, from sysinfo: shown beside every worker's numbers.

use sysinfo::{CpuRefreshKind, MemoryRefreshKind, RefreshKind, System};

/// What a reader needs to put a worker's numbers in context.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeFacts {
    /// The node's name: `--node-name`, else the host name (empty in recordings made before
    /// it existed).
    #[serde(default)]
    pub name: String,
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
    /// How far the wall clock may be off, as the kernel sees it when the facts were read;
    /// `None` where the kernel would not say (and in recordings made before it was kept).
    #[serde(default)]
    pub clock: Option<crate::clock::ClockQuality>,
}

impl NodeFacts {
    /// Reads the facts of this node.
    pub fn read() -> Self {
        let system = System::new_with_specifics(
            RefreshKind::nothing()
                .with_cpu(CpuRefreshKind::nothing())
                .with_memory(MemoryRefreshKind::nothing().with_ram()),
        );
        let hostname = System::host_name().unwrap_or_default();
        Self {
            name: hostname.clone(),
            hostname,
            kernel: System::kernel_version().unwrap_or_default(),
            cpus: system.cpus().len(),
            cpu_model: system
                .cpus()
                .first()
                .map(|cpu| cpu.brand().trim().to_string())
                .unwrap_or_default(),
            memory_bytes: system.total_memory(),
            boot_time_epoch_secs: System::boot_time(),
            clock: crate::clock::ClockQuality::read(),
        }
    }

    /// What to call the node: its name, or its host name where no name was recorded.
    pub fn display_name(&self) -> &str {
        if self.name.is_empty() {
            &self.hostname
        } else {
            &self.name
        }
    }

    /// The clock's quality in words, e.g. `synchronised, within 12.0 ms (estimated 0.5 ms)`.
    pub fn clock_text(&self) -> String {
        match self.clock {
            None => "not measured".to_owned(),
            Some(clock) if !clock.synchronized => format!(
                "not synchronised (may be off by up to {:.1} ms)",
                clock.max_error_seconds * 1e3
            ),
            Some(clock) => format!(
                "synchronised, within {:.1} ms (estimated {:.1} ms)",
                clock.max_error_seconds * 1e3,
                clock.estimated_error_seconds * 1e3
            ),
        }
    }

    /// The same facts under the name the user gave the node, if any.
    pub fn named(mut self, node_name: Option<&str>) -> Self {
        if let Some(name) = node_name {
            self.name = name.to_owned();
        }
        self
    }
}
