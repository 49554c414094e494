//! What the agent itself costs the node, as one scrape shows it.

/// Cost of one of the agent's eBPF programs, from the kernel's bpf_stats.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramCost {
    /// The program's name (e.g. `switch_full`).
    pub program: String,
    /// Times it ran.
    pub runs: u64,
    /// Nanoseconds it ran in total.
    pub run_time_ns: u64,
}

/// What the agent itself costs the node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AgentCost {
    /// CPU time of the agent process (user + system), seconds.
    pub cpu_seconds: f64,
    /// The agent's resident memory, bytes (`VmRSS`).
    pub resident_memory_bytes: Option<u64>,
    /// How long the last collection (maps, cpu.stat and memory reads) took, seconds.
    pub collection_duration_seconds: f64,
    /// `/proc/sys/kernel/bpf_stats_enabled`, when readable.
    pub bpf_stats_enabled: Option<bool>,
    /// Per-program cost; empty unless bpf_stats is enabled.
    pub programs: Vec<ProgramCost>,
}
