//! `workerprobe check`: what this host offers the agent, verified by loading and attaching.

use std::{collections::BTreeMap, io::Write as _};

use anyhow::Context as _;
use serde::Serialize;

use crate::{
    cgroup::{self, CgroupLayout},
    cli::CheckArgs,
    loader::{
        self, LoadOptions, ProgramGroup, features,
        plan::{ExtraPlan, GroupPlan},
    },
};

/// The report `check` prints.
#[derive(Debug, Serialize)]
pub struct CheckReport {
    /// `uname -r`.
    pub kernel: String,
    /// The cgroup2 hierarchy.
    pub cgroup2: Cgroup2Report,
    /// How workers' memory is read.
    pub memory: &'static str,
    /// Per program group: the variant attached, or why none could be.
    pub groups: BTreeMap<&'static str, GroupReport>,
}

/// Where cgroup2 is and what its root offers.
#[derive(Debug, Serialize)]
pub struct Cgroup2Report {
    /// Mount point.
    pub mount: String,
    /// unified (pure cgroup2) or hybrid.
    pub layout: CgroupLayout,
    /// Controllers cgroup2 has (the root's `cgroup.controllers`).
    pub controllers: Vec<String>,
    /// Controllers the root hands to its children (`cgroup.subtree_control`).
    pub subtree_control: Vec<String>,
}

/// How one group runs here.
#[derive(Debug, Serialize)]
pub struct GroupReport {
    /// The variant attached; null when none could be.
    pub variant: Option<&'static str>,
    /// Why not, when not.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<String>,
    /// Add-ons of the variant that run, by what they count.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub also_counted: Vec<&'static str>,
    /// Add-ons that could not run: what goes uncounted, and what it would need.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub not_counted: Vec<NotCounted>,
}

/// What a group does not count here, and why.
#[derive(Debug, Serialize)]
pub struct NotCounted {
    /// What goes uncounted.
    pub what: &'static str,
    /// What counting it needs (the end of a sentence).
    pub needs: String,
}

/// `workerprobe check`: exit code 0 when every group asked for runs, 1 otherwise.
pub fn check(args: &CheckArgs) -> anyhow::Result<u8> {
    let mount = cgroup::find_cgroup2_mount()?;
    let groups: Vec<ProgramGroup> = args.programs.iter().map(|&choice| choice.into()).collect();
    let probe = loader::load_and_attach(&LoadOptions {
        groups,
        ..LoadOptions::default()
    })?;
    let report = CheckReport {
        kernel: features::kernel_release(),
        cgroup2: Cgroup2Report {
            mount: mount.display().to_string(),
            layout: cgroup::cgroup_layout(),
            controllers: cgroup::read_controllers(&mount.join("cgroup.controllers")),
            subtree_control: cgroup::read_controllers(&mount.join("cgroup.subtree_control")),
        },
        memory: match (probe.plan().memory_walk(), probe.plan().rss_walk()) {
            (Some(_), _) => "iter/cgroup over every cgroup's memory counters, one walk a sample",
            (None, rss_walk) if cgroup::cgroup2_has_controller("memory") => match rss_walk {
                Some(_) => {
                    "each worker's memory.current and memory.peak, else its processes' RSS by iter/task over every process, one walk a sample"
                }
                None => "each worker's memory.current and memory.peak, else its processes' RSS",
            },
            (None, Some(_)) => {
                "each worker's v1 memory cgroup where it holds only the worker, else its processes' RSS by iter/task over every process, one walk a sample"
            }
            (None, None) => {
                "each worker's v1 memory cgroup where it holds only the worker, else its processes' RSS"
            }
        },
        groups: probe
            .plan()
            .groups
            .iter()
            .zip(probe.plan().summary())
            .map(|((group, plan), (_, variant))| {
                let missing = match plan {
                    GroupPlan::Missing(reasons) => reasons.clone(),
                    _ => Vec::new(),
                };
                let extras = || {
                    probe
                        .plan()
                        .extras
                        .iter()
                        .filter(move |(g, _, _)| g == group)
                };
                let also_counted = extras()
                    .filter(|(_, _, plan)| *plan == ExtraPlan::Runs)
                    .map(|(_, extra, _)| extra.counts)
                    .collect();
                let not_counted = extras()
                    .filter_map(|(_, extra, plan)| match plan {
                        ExtraPlan::Missing(needs) => Some(NotCounted {
                            what: extra.counts,
                            needs: needs.clone(),
                        }),
                        ExtraPlan::Runs => None,
                    })
                    .collect();
                (
                    group.name(),
                    GroupReport {
                        variant,
                        missing,
                        also_counted,
                        not_counted,
                    },
                )
            })
            .collect(),
    };
    let text = if args.json {
        serde_json::to_string_pretty(&report).context("encoding the report")? + "\n"
    } else {
        render(&report)
    };
    let _ = std::io::stdout().write_all(text.as_bytes());
    let all_run = report.groups.values().all(|group| group.variant.is_some());
    if !all_run {
        for note in probe.notes() {
            crate::say!("workerprobe: {note}");
        }
    }
    Ok(if all_run { 0 } else { 1 })
}

/// The report as text, one line per fact.
fn render(report: &CheckReport) -> String {
    let mut out = format!("kernel      {}\n", report.kernel);
    let cgroup2 = &report.cgroup2;
    out += &format!(
        "cgroup2     {} ({}; controllers {}; given to children: {})\n",
        cgroup2.mount,
        match cgroup2.layout {
            CgroupLayout::Unified => "pure cgroup2",
            CgroupLayout::Hybrid => "hybrid, v1 controllers beside it",
        },
        list_or_none(&cgroup2.controllers),
        list_or_none(&cgroup2.subtree_control),
    );
    out += &format!("memory      {}\n", report.memory);
    for (name, group) in &report.groups {
        match group.variant {
            Some(variant) => {
                out += &format!("{name:<11} {variant}");
                for what in &group.also_counted {
                    out += &format!("; also {what}");
                }
                for missing in &group.not_counted {
                    out += &format!("; not counted: {} (needs {})", missing.what, missing.needs);
                }
                out += "\n";
            }
            None => {
                out += &format!(
                    "{name:<11} not measured: needs {}\n",
                    group.missing.join(" or ")
                )
            }
        }
    }
    out
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items.join(" ")
    }
}
