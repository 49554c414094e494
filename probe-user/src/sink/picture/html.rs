//! `workerprobe report`: one self-contained HTML page: the node's facts, the plot's SVG
//! inline, a table of exit summaries and a table of every worker, both sortable by clicking
//! a header (a few lines of inline JavaScript). Nothing is fetched: no external URL at all,
//! so the page works offline and from a mail attachment.

use std::fmt::Write as _;

use super::{
    format_bytes, format_seconds,
    series::{ExitRow, NodeView, Picture},
    svg::escape_xml,
};

/// Sorts a table by the clicked column: by `data-v` (a number) when cells have one, else
/// by text; a second click reverses.
const SORT_SCRIPT: &str = r#"
document.querySelectorAll("table.sortable th").forEach(function (th) {
  th.addEventListener("click", function () {
    var body = th.closest("table").tBodies[0];
    var column = th.cellIndex;
    var up = th.getAttribute("data-order") !== "up";
    th.closest("tr").querySelectorAll("th").forEach(function (h) { h.removeAttribute("data-order"); });
    th.setAttribute("data-order", up ? "up" : "down");
    var key = function (row) {
      var cell = row.cells[column];
      var v = cell.getAttribute("data-v");
      return v === null ? cell.textContent : parseFloat(v);
    };
    Array.from(body.rows)
      .sort(function (a, b) {
        var x = key(a), y = key(b);
        var order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
        return up ? order : -order;
      })
      .forEach(function (row) { body.appendChild(row); });
  });
});
"#;

const STYLE: &str = r#"
body { font-family: sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 1.5em; }
dl.facts { display: grid; grid-template-columns: max-content auto; gap: 0.2em 1em; }
dl.facts dt { font-weight: bold; }
dl.facts dd { margin: 0; }
svg { max-width: 100%; height: auto; border: 1px solid #ddd; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #eef2f7; cursor: pointer; user-select: none; position: sticky; top: 0; }
th[data-order="up"]::after { content: " \25B2"; }
th[data-order="down"]::after { content: " \25BC"; }
tbody tr:nth-child(even) { background: #f8f8f8; }
p.note { color: #555; }
"#;

/// A table cell: text shown, and the number it sorts by (none: sort by the text).
struct Cell {
    text: String,
    sort_value: Option<f64>,
}

fn text(value: &str) -> Cell {
    Cell {
        text: value.to_string(),
        sort_value: None,
    }
}

fn seconds(value: Option<f64>) -> Cell {
    number(value, |v| format!("{v:.3}"))
}

fn bytes(value: Option<u64>) -> Cell {
    number(value.map(|v| v as f64), format_bytes)
}

fn number(value: Option<f64>, format: impl Fn(f64) -> String) -> Cell {
    match value {
        Some(v) if v.is_finite() => Cell {
            text: format(v),
            sort_value: Some(v),
        },
        // Missing sorts below every number.
        _ => Cell {
            text: "–".into(),
            sort_value: Some(-1.0),
        },
    }
}

/// The page: `svg` is the plot of `picture` (from `svg::render`).
pub fn render(picture: &Picture, svg: &str) -> String {
    let node = &picture.node;
    let mut page = String::new();
    let several = picture.nodes.len() > 1;
    let title = if several {
        format!("workerprobe report: {}", picture.node_names())
    } else {
        format!("workerprobe report: {}", node.display_name())
    };
    let _ = write!(
        page,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{}</h1>\n",
        escape_xml(&title),
        escape_xml(&title)
    );
    let mut facts: Vec<(String, String)> = Vec::new();
    if several {
        for view in &picture.nodes {
            let facts_of = &view.facts;
            facts.push((
                format!("node {}", view.name()),
                format!(
                    "host {}, kernel {}, {} CPUs ({}), {} memory; wall clock {}",
                    facts_of.hostname,
                    facts_of.kernel,
                    facts_of.cpus,
                    facts_of.cpu_model,
                    format_bytes(facts_of.memory_bytes as f64),
                    view.clock_text()
                ),
            ));
        }
        let caveats = picture.clock_caveats();
        facts.push((
            "clocks".into(),
            if caveats.is_empty() {
                "every node's clock was within a tick: the nodes' times compare to the tick".into()
            } else {
                format!(
                    "the nodes' times compare only as well as their clocks: {}",
                    caveats.join("; ")
                )
            },
        ));
    } else {
        facts.push(("node".into(), node.display_name().to_owned()));
        facts.push(("host".into(), node.hostname.clone()));
        let wall_clock = picture
            .nodes
            .first()
            .map_or_else(|| node.clock_text(), NodeView::clock_text);
        facts.push(("wall clock".into(), wall_clock));
        facts.push(("kernel".into(), node.kernel.clone()));
        facts.push(("CPUs".into(), format!("{} ({})", node.cpus, node.cpu_model)));
        facts.push(("memory".into(), format_bytes(node.memory_bytes as f64)));
    }
    let time_zero = if several {
        "start of the first tick; times are seconds from it, each node's monotonic clock mapped to its wall clock"
    } else {
        "start of the first tick; times are seconds from it on the node's monotonic clock"
    };
    facts.extend([
        (
            "time 0".into(),
            format!("{} ({time_zero})", picture.origin_time),
        ),
        (
            "shown".into(),
            format!(
                "{} s to {} s",
                format_seconds(picture.from_seconds),
                format_seconds(picture.to_seconds)
            ),
        ),
        (
            "tick".into(),
            format!("{} s", format_seconds(picture.interval_seconds)),
        ),
        (
            "not recorded".into(),
            picture.unrecorded_text().map_or_else(
                || "nothing: the agent ran throughout".to_owned(),
                |gaps| format!("{gaps} (no agent ran; the plots' lines break there)"),
            ),
        ),
        ("workers".into(), picture.workers.len().to_string()),
        (
            "recorded by".into(),
            format!("workerprobe {}", picture.agent_version),
        ),
    ]);
    page.push_str("<dl class=\"facts\">\n");
    for (name, value) in facts {
        let _ = writeln!(page, "<dt>{name}</dt><dd>{}</dd>", escape_xml(&value));
    }
    page.push_str("</dl>\n");
    if picture.skipped_lines > 0 {
        let _ = writeln!(
            page,
            "<p class=\"note\">{} damaged or unknown lines of the recording were skipped.</p>",
            picture.skipped_lines
        );
    }
    page.push_str("<h2>Plots</h2>\n");
    page.push_str(&inline_svg(svg));
    page.push('\n');

    page.push_str("<h2>Exit summaries</h2>\n");
    let exits = picture.exits();
    if exits.is_empty() {
        page.push_str("<p class=\"note\">No worker ended while it was recorded (or in the window shown).</p>\n");
    } else {
        page.push_str("<p class=\"note\">One row per worker that ended (its exit line); click a header to sort.</p>\n");
        let rows: Vec<Vec<Cell>> = exits.iter().map(|exit| exit_cells(exit, several)).collect();
        table(
            &mut page,
            "exits",
            &[
                "name",
                "path",
                "kind",
                "start s",
                "end s",
                "wall s",
                "CPU s",
                "user s",
                "system s",
                "cores",
                "run-queue s",
                "blocked I/O s",
                "sleep s",
                "waiting on",
                "sent",
                "received",
                "peak memory",
            ],
            &rows,
        );
        let endpoint_rows: Vec<Vec<Cell>> = exits
            .iter()
            .flat_map(|exit| {
                let endpoints = exit.summary.get("endpoints").and_then(|e| e.as_array());
                endpoints.into_iter().flatten().map(move |endpoint| {
                    vec![
                        text(&exit.name),
                        text(endpoint["endpoint"].as_str().unwrap_or("?")),
                        bytes(endpoint["sent_bytes"].as_u64()),
                        bytes(endpoint["received_bytes"].as_u64()),
                        seconds(endpoint["wait_seconds"].as_f64()),
                    ]
                })
            })
            .collect();
        if !endpoint_rows.is_empty() {
            page.push_str("<h2>Remote endpoints</h2>\n");
            page.push_str("<p class=\"note\">Per ended worker and remote endpoint (named by the recorder's <code>--endpoint</code> rules): payload bytes, and how long its sockets' calls slept.</p>\n");
            table(
                &mut page,
                "endpoints",
                &["worker", "endpoint", "sent", "received", "waited s"],
                &endpoint_rows,
            );
        }
    }

    page.push_str("<h2>Every worker in the window</h2>\n");
    page.push_str("<p class=\"note\">From the ticks (or the exit line of a worker too short to be in a tick).</p>\n");
    let rows: Vec<Vec<Cell>> = picture
        .workers
        .iter()
        .map(|worker| {
            vec![
                text(&worker.label),
                text(&worker.path),
                text(&worker.kind),
                seconds(Some(worker.start_seconds)),
                seconds(Some(worker.end_seconds)),
                seconds(Some(worker.cpu_seconds)),
                number(Some(worker.average_cores()), |v| format!("{v:.2}")),
                bytes(Some(worker.sent_bytes)),
                bytes(Some(worker.received_bytes)),
                bytes(worker.peak_memory_bytes),
                text(if worker.exit.is_some() { "yes" } else { "no" }),
            ]
        })
        .collect();
    table(
        &mut page,
        "workers",
        &[
            "name",
            "path",
            "kind",
            "start s",
            "end s",
            "CPU s",
            "avg cores",
            "sent",
            "received",
            "peak memory",
            "ended",
        ],
        &rows,
    );
    let _ = write!(page, "<script>{SORT_SCRIPT}</script>\n</body>\n</html>\n");
    page
}

/// An exit's row; with several nodes its name starts with its node's.
fn exit_cells(exit: &ExitRow, several_nodes: bool) -> Vec<Cell> {
    let name = if several_nodes {
        format!("{}: {}", exit.node, exit.name)
    } else {
        exit.name.clone()
    };
    vec![
        text(&name),
        text(&exit.path),
        text(&exit.kind),
        seconds(Some(exit.start_seconds)),
        seconds(Some(exit.end_seconds)),
        seconds(exit.wall_seconds),
        seconds(exit.cpu_seconds),
        seconds(exit.user_seconds),
        seconds(exit.system_seconds),
        number(exit.cores, |v| format!("{v:.2}")),
        seconds(exit.runqueue_wait_seconds),
        seconds(exit.blocked_io_seconds),
        seconds(exit.sleep_seconds),
        text(&top_waits(&exit.summary)),
        bytes(exit.sent_bytes),
        bytes(exit.received_bytes),
        bytes(exit.peak_memory_bytes),
    ]
}

/// The two longest wait reasons of an exit summary, e.g. `network 1.2s, disk 0.1s`.
fn top_waits(summary: &serde_json::Map<String, serde_json::Value>) -> String {
    let Some(waits) = summary
        .get("time")
        .and_then(|time| time.get("waits"))
        .and_then(|waits| waits.as_object())
    else {
        return "n/a".into();
    };
    let mut reasons: Vec<(&String, f64)> = waits
        .iter()
        .filter_map(|(name, wait)| Some((name, wait["seconds"].as_f64()?)))
        .collect();
    reasons.sort_by(|a, b| b.1.total_cmp(&a.1));
    reasons
        .iter()
        .take(2)
        .map(|(name, seconds)| format!("{name} {}s", format_seconds(*seconds)))
        .collect::<Vec<_>>()
        .join(", ")
}

fn table(page: &mut String, id: &str, headers: &[&str], rows: &[Vec<Cell>]) {
    let _ = write!(page, "<table class=\"sortable\" id=\"{id}\">\n<thead><tr>");
    for header in headers {
        let _ = write!(page, "<th>{}</th>", escape_xml(header));
    }
    page.push_str("</tr></thead>\n<tbody>\n");
    for row in rows {
        page.push_str("<tr>");
        for cell in row {
            match cell.sort_value {
                Some(value) => {
                    let _ = write!(
                        page,
                        "<td class=\"n\" data-v=\"{value}\">{}</td>",
                        escape_xml(&cell.text)
                    );
                }
                None => {
                    let _ = write!(page, "<td>{}</td>", escape_xml(&cell.text));
                }
            }
        }
        page.push_str("</tr>\n");
    }
    page.push_str("</tbody>\n</table>\n");
}

/// The SVG as HTML5 inline SVG: without its namespace URL (an HTML parser puts `<svg>` in it
/// anyway), so the page names no external address at all.
fn inline_svg(svg: &str) -> String {
    svg.replace(" xmlns=\"http://www.w3.org/2000/svg\"", "")
        .replace(" xmlns:xlink=\"http://www.w3.org/1999/xlink\"", "")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::picture::{
        series::{build, tests as data},
        svg::{self, SvgOptions},
    };

    #[test]
    fn the_page_is_whole_and_self_contained() {
        let picture = build(&data::sample(), &data::everything(), "r").expect("builds");
        let plot = svg::render(
            &picture,
            &SvgOptions {
                busiest: 12,
                per_cpu: false,
            },
        )
        .expect("draws");
        let page = render(&picture, &plot);
        assert!(page.starts_with("<!DOCTYPE html>"));
        assert!(page.trim_end().ends_with("</html>"));
        assert!(
            !page.contains("http://") && !page.contains("https://"),
            "an external URL"
        );
        assert!(page.contains("<svg"));
        assert!(page.contains(r#"<table class="sortable" id="exits">"#));
        // The exit row of w3: 7 bytes sent, 4096 bytes peak.
        assert!(
            page.contains(r#"<td class="n" data-v="4096">4 KiB</td>"#),
            "{page}"
        );
        assert_eq!(page.matches("<tr>").count(), 1 + 1 + 1 + 3);
    }
}
