//! The interactive `top` screen: the view state ([`TopView`]), what a key does to it
//! ([`handle_key`]), how an [`Interval`] is drawn ([`render`]), and the terminal session
//! ([`Screen`]) that puts the terminal in raw mode on the alternate screen and always gives it
//! back.
//!
//! Data flows one way: the `top` loop samples, diffs and hands each [`Interval`] here; nothing
//! in this module reaches back into collection. `handle_key` and `render` are pure, so the
//! keys, the sort order, the filter and the screen text are unit-tested without a terminal.
//! When stdout is not a terminal, or with `--once`, `top` prints
//! [`table::render`](super::table::render) instead and never comes here.

use std::{
    io::Stdout,
    sync::atomic::{AtomicBool, Ordering},
    thread::JoinHandle,
    time::Duration,
};

use crossterm::{
    cursor,
    event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers},
    execute,
    terminal::{self, EnterAlternateScreen, LeaveAlternateScreen},
};
use probe_common::net::FAMILY_NAMES;
use ratatui::{
    Frame, Terminal,
    backend::CrosstermBackend,
    layout::{Constraint, Layout, Rect},
    style::{Style, Stylize as _},
    text::{Line, Span},
    widgets::{Block, Borders, Cell, Paragraph, Row, Table, TableState},
};
use tokio::sync::mpsc;

use super::table::{NOT_MEASURED, bytes, worker_label};
use crate::model::{Interval, Measured, WorkerStats};

/// What the worker table is ordered by: a model field, never a column position, so the
/// layout can change without changing what a key means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    /// On-CPU time in the interval, most first.
    Cpu,
    /// Bytes sent in the interval, most first.
    Sent,
    /// Bytes received in the interval, most first.
    Received,
    /// Time runnable but waiting for a CPU, most first.
    RunqueueWait,
    /// Time in uninterruptible (I/O) sleep, most first.
    BlockedIo,
    /// Time in interruptible sleep, most first.
    Sleep,
    /// Worker path, A to Z.
    Name,
}

impl SortKey {
    /// The title of the column this key orders, as shown in the table header.
    pub fn title(self) -> &'static str {
        match self {
            Self::Cpu => "CPU%",
            Self::Sent => "SEND/s",
            Self::Received => "RECV/s",
            Self::RunqueueWait => "RUNQ%",
            Self::BlockedIo => "IO%",
            Self::Sleep => "SLEEP%",
            Self::Name => "WORKER",
        }
    }

    /// The model figure a worker is ranked by (larger first); `None` for [`SortKey::Name`].
    fn figure(self, worker: &WorkerStats) -> Option<u64> {
        match self {
            Self::Cpu => Some(worker.cpu_ns()),
            Self::Sent => Some(worker.sent_bytes()),
            Self::Received => Some(worker.received_bytes()),
            Self::RunqueueWait => Some(worker.delays.runqueue_wait_ns),
            Self::BlockedIo => Some(worker.delays.blocked_io_ns),
            Self::Sleep => Some(worker.delays.sleep_ns),
            Self::Name => None,
        }
    }
}

/// The keys that choose a sort order, in the order the footer lists them.
const SORT_KEYS: [(char, SortKey); 7] = [
    ('c', SortKey::Cpu),
    ('w', SortKey::RunqueueWait),
    ('i', SortKey::BlockedIo),
    ('l', SortKey::Sleep),
    ('s', SortKey::Sent),
    ('r', SortKey::Received),
    ('n', SortKey::Name),
];

/// Rows moved by Page Up / Page Down.
const PAGE_ROWS: usize = 10;

/// Everything the user chose on the `top` screen. The data shown is not here: it is the
/// [`Interval`] handed to [`render`] next to it.
#[derive(Clone, Debug, PartialEq)]
pub struct TopView {
    /// What the table is ordered by.
    pub sort: SortKey,
    /// Index of the selected row among the rows shown (kept in range by [`TopView::sync`]).
    pub selected: usize,
    /// The cgroup id of the selected worker, so the selection follows the worker when the
    /// order changes; `None` after a move, until [`TopView::sync`] reads it from the row.
    pub selected_id: Option<u64>,
    /// Only workers whose label contains this text (any case) are shown; empty shows all.
    pub filter: String,
    /// Whether keys are being typed into the filter.
    pub editing_filter: bool,
    /// Whether the screen is frozen on the interval it shows (keys still work on it).
    pub paused: bool,
    /// At most this many rows (`--limit`).
    pub limit: usize,
    /// CPUs of the node, shown in the header.
    pub node_cpus: usize,
    /// Names endpoints in the detail panel (`--endpoint`).
    pub endpoint_namer: crate::model::endpoints::EndpointNamer,
}

/// What the loop should do after a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Keep going (the view may have changed: redraw).
    None,
    /// Leave `top`.
    Quit,
}

impl TopView {
    /// The view at start: busiest CPU first, first row selected, no filter, running.
    pub fn new(limit: usize, node_cpus: usize) -> Self {
        Self {
            sort: SortKey::Cpu,
            selected: 0,
            selected_id: None,
            filter: String::new(),
            editing_filter: false,
            paused: false,
            limit,
            node_cpus,
            endpoint_namer: crate::model::endpoints::EndpointNamer::default(),
        }
    }

    /// The rows of the table: active workers passing the filter, in sort order (ties by
    /// cgroup id, so rows do not swap places between refreshes), at most `limit`.
    pub fn rows<'a>(&self, interval: &'a Interval) -> Vec<&'a WorkerStats> {
        let needle = self.filter.to_lowercase();
        let mut rows: Vec<(String, &WorkerStats)> = interval
            .active_workers()
            .map(|worker| (worker_label(worker), worker))
            .filter(|(label, _)| needle.is_empty() || label.to_lowercase().contains(&needle))
            .collect();
        rows.sort_by(|(a_label, a), (b_label, b)| {
            let order = match (self.sort.figure(a), self.sort.figure(b)) {
                (Some(a), Some(b)) => b.cmp(&a),
                _ => a_label.cmp(b_label),
            };
            order.then(a.cgroup_id.cmp(&b.cgroup_id))
        });
        rows.into_iter()
            .map(|(_, worker)| worker)
            .take(self.limit)
            .collect()
    }

    /// Brings the selection in line with the rows of `interval`: onto the selected worker
    /// if it is still shown, else onto the nearest row. Call after each key and each new
    /// interval.
    pub fn sync(&mut self, interval: &Interval) {
        let rows = self.rows(interval);
        if let Some(row) = self
            .selected_id
            .and_then(|id| rows.iter().position(|worker| worker.cgroup_id == id))
        {
            self.selected = row;
            return;
        }
        self.selected = self.selected.min(rows.len().saturating_sub(1));
        self.selected_id = rows.get(self.selected).map(|worker| worker.cgroup_id);
    }

    /// Moves the selection to `row` (clamped later by [`TopView::sync`]).
    fn select_row(&mut self, row: usize) {
        self.selected = row;
        self.selected_id = None;
    }
}

/// Applies one key to the view. Pure: the loop redraws afterwards.
pub fn handle_key(view: &mut TopView, key: KeyEvent) -> Action {
    // Terminals send releases only when asked to; ignore them so no key acts twice.
    if key.kind == KeyEventKind::Release {
        return Action::None;
    }
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    // Raw mode turns Ctrl-C into a key instead of SIGINT: it must still quit, even mid-filter.
    if ctrl && key.code == KeyCode::Char('c') {
        return Action::Quit;
    }
    if view.editing_filter {
        match key.code {
            KeyCode::Enter => view.editing_filter = false,
            KeyCode::Esc => {
                view.editing_filter = false;
                view.filter.clear();
            }
            KeyCode::Backspace => {
                view.filter.pop();
            }
            KeyCode::Char(ch) if !ctrl => view.filter.push(ch),
            KeyCode::Up | KeyCode::Down => return move_selection(view, key.code),
            _ => {}
        }
        return Action::None;
    }
    match key.code {
        KeyCode::Char('q') => return Action::Quit,
        // Esc first drops an active filter, so it never quits by surprise while filtering.
        KeyCode::Esc if !view.filter.is_empty() => view.filter.clear(),
        KeyCode::Esc => return Action::Quit,
        KeyCode::Char('/') => view.editing_filter = true,
        KeyCode::Char('p') | KeyCode::Char(' ') => view.paused = !view.paused,
        KeyCode::Char(ch) if !ctrl => {
            if let Some(&(_, sort)) = SORT_KEYS.iter().find(|(key, _)| *key == ch) {
                view.sort = sort;
            } else if matches!(ch, 'k' | 'j' | 'g' | 'G') {
                return move_selection(view, key.code);
            }
        }
        code => return move_selection(view, code),
    }
    Action::None
}

/// The arrow, page and vi keys that move the selection.
fn move_selection(view: &mut TopView, code: KeyCode) -> Action {
    let row = view.selected;
    match code {
        KeyCode::Up | KeyCode::Char('k') => view.select_row(row.saturating_sub(1)),
        KeyCode::Down | KeyCode::Char('j') => view.select_row(row.saturating_add(1)),
        KeyCode::PageUp => view.select_row(row.saturating_sub(PAGE_ROWS)),
        KeyCode::PageDown => view.select_row(row.saturating_add(PAGE_ROWS)),
        KeyCode::Home | KeyCode::Char('g') => view.select_row(0),
        KeyCode::End | KeyCode::Char('G') => view.select_row(usize::MAX),
        _ => {}
    }
    Action::None
}

/// The key help shown at the bottom of the screen.
pub fn key_help(view: &TopView) -> String {
    if view.editing_filter {
        return format!(
            "filter: {}▏   Enter keep   Esc clear   Backspace delete",
            view.filter
        );
    }
    let sorts: Vec<String> = SORT_KEYS
        .iter()
        .map(|(key, sort)| format!("{key} {}", sort.title()))
        .collect();
    format!(
        "↑/↓ select   sort: {}   / filter   p {}   q quit",
        sorts.join("  "),
        if view.paused { "resume" } else { "pause" }
    )
}

/// Draws the whole screen: header, worker table, detail of the selected worker, key help.
/// Pure: it only writes into `frame`.
pub fn render(frame: &mut Frame, interval: &Interval, view: &TopView) {
    let rows = view.rows(interval);
    let selected = rows.get(view.selected).copied();
    let detail_height = detail_height(selected, frame.area().width);
    let [header, table, detail, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(4),
        Constraint::Length(detail_height),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    frame.render_widget(
        Paragraph::new(header_line(interval, view, rows.len())),
        header,
    );
    render_table(frame, table, &rows, view, interval.measured);
    render_detail(
        frame,
        detail,
        selected,
        interval.measured,
        &view.endpoint_namer,
    );
    frame.render_widget(
        Paragraph::new(Line::from(key_help(view)).reversed()),
        footer,
    );
}

/// Workers active, interval, drops, node CPUs, and what the view is doing.
fn header_line(interval: &Interval, view: &TopView, shown: usize) -> Line<'static> {
    let mut spans = vec![];
    // First, so a narrow terminal never cuts it off.
    if view.paused {
        spans.push(Span::styled("PAUSED", Style::new().reversed().bold()));
        spans.push(Span::raw("  "));
    }
    let mut parts = vec![];
    if interval.duration_ns() == 0 {
        parts.push("waiting for the first interval…".to_string());
    } else {
        let active = interval.active_workers().count();
        parts.push(format!("workers active: {active} (shown {shown})"));
        parts.push(format!(
            "interval: {:.2}s",
            interval.duration_ns() as f64 / 1e9
        ));
        let drops: u64 = interval.total_drops.iter().sum();
        parts.push(format!("drops since start: {drops}"));
    }
    parts.push(format!("node CPUs: {}", view.node_cpus));
    parts.push(format!("sort: {}", view.sort.title()));
    if !view.filter.is_empty() {
        parts.push(format!("filter: {}", view.filter));
    }
    spans.push(Span::raw(parts.join("  ")));
    Line::from(spans)
}

/// Column titles and widths of the worker table (the first, WORKER, takes what is left).
const COLUMNS: [(&str, u16); 14] = [
    ("WORKER", 0),
    ("NAME", super::table::NAME_WIDTH as u16),
    ("CORES", 6),
    ("CPU%", 6),
    ("RUNQ%", 6),
    ("IO%", 6),
    ("SLEEP%", 7),
    ("WAITING ON", 20),
    ("SEND/s", 11),
    ("RECV/s", 11),
    ("MEM", 9),
    ("CPU-TOTAL", 10),
    ("SENT", 9),
    ("RECV", 9),
];

/// Narrowest the WORKER column gets before other columns are dropped.
const MIN_WORKER_WIDTH: u16 = 24;

/// The order columns are dropped in as the terminal narrows (indexes into `COLUMNS`): the
/// totals (RECV, SENT, CPU-TOTAL), NAME (the path's tail names most workers too), WAITING ON,
/// the split of the time (SLEEP%, IO%, RUNQ%), MEM, RECV/s, CPU%, SEND/s. A number is never
/// cut: a column goes whole.
const DROP_ORDER: [usize; 12] = [13, 12, 11, 1, 7, 6, 5, 4, 10, 9, 3, 8];

/// The columns that fit `width` (WORKER, CORES and the sort column `keep` always), in
/// table order; NAME only when `names_tell_more` (some row's name is not its path's tail).
fn visible_columns(width: u16, keep: &str, names_tell_more: bool) -> Vec<usize> {
    let mut shown: Vec<usize> = (0..COLUMNS.len())
        .filter(|&column| names_tell_more || COLUMNS[column].0 != "NAME")
        .collect();
    // The highlight symbol takes a cell, and each column after the first a space.
    let needed = |shown: &[usize]| {
        1 + MIN_WORKER_WIDTH
            + shown
                .iter()
                .skip(1)
                .map(|&column| COLUMNS[column].1 + 1)
                .sum::<u16>()
    };
    for column in DROP_ORDER {
        if needed(&shown) <= width {
            break;
        }
        if COLUMNS[column].0 != keep {
            shown.retain(|&kept| kept != column);
        }
    }
    shown
}

/// The worker table with the selected row highlighted and the sort column marked.
fn render_table(
    frame: &mut Frame,
    area: Rect,
    rows: &[&WorkerStats],
    view: &TopView,
    measured: Measured,
) {
    let names_tell_more = rows.iter().any(|worker| {
        let name = super::table::worker_name(worker);
        let label = worker_label(worker);
        label.rsplit('/').next() != Some(name.as_str())
    });
    let shown = visible_columns(area.width, view.sort.title(), names_tell_more);
    // What WORKER gets: the width left after the other columns shown and their spaces.
    let worker_width = area.width.saturating_sub(
        1 + shown
            .iter()
            .skip(1)
            .map(|&column| COLUMNS[column].1 + 1)
            .sum::<u16>(),
    ) as usize;
    let header = Row::new(shown.iter().map(|&column| {
        let title = COLUMNS[column].0;
        let marked = if title == view.sort.title() {
            // Name sorts A to Z, every figure largest first.
            let arrow = if view.sort == SortKey::Name {
                "▲"
            } else {
                "▼"
            };
            format!("{title}{arrow}")
        } else {
            title.to_string()
        };
        aligned(marked, column)
    }))
    .bold()
    .underlined();
    let body = rows.iter().map(|worker| {
        let percent = |ns: u64| format!("{:.0}", worker.share_of_interval(ns) * 100.0);
        let delay = |ns: u64| {
            if measured.delays {
                percent(ns)
            } else {
                NOT_MEASURED.into()
            }
        };
        let net = |text: String| {
            if measured.net {
                text
            } else {
                NOT_MEASURED.into()
            }
        };
        let delays = &worker.delays;
        let cells = [
            super::table::shorten(&worker_label(worker), worker_width),
            super::table::shorten(&super::table::worker_name(worker), super::table::NAME_WIDTH),
            format!("{:.2}", worker.cpu_cores()),
            percent(worker.cpu_ns()),
            delay(delays.runqueue_wait_ns),
            delay(delays.blocked_io_ns),
            delay(delays.sleep_ns),
            if measured.waits {
                super::table::top_reasons(worker)
            } else {
                NOT_MEASURED.into()
            },
            net(format!(
                "{}/s",
                bytes(worker.sent_bytes_per_second() as u64)
            )),
            net(format!(
                "{}/s",
                bytes(worker.received_bytes_per_second() as u64)
            )),
            super::table::memory_cell(worker),
            format!("{:.2}s", worker.total_cpu_ns as f64 / 1e9),
            net(bytes(worker.total_sent_bytes)),
            net(bytes(worker.total_received_bytes)),
        ];
        let mut cells = cells.map(Some);
        Row::new(
            shown
                .iter()
                .map(|&column| aligned(cells[column].take().unwrap_or_default(), column)),
        )
    });
    let widths: Vec<Constraint> = shown
        .iter()
        .map(|&column| match COLUMNS[column].1 {
            0 => Constraint::Min(12),
            width => Constraint::Length(width),
        })
        .collect();
    let table = Table::new(body, widths)
        .header(header)
        .row_highlight_style(Style::new().reversed())
        .highlight_symbol("▶");
    let mut state =
        TableState::default().with_selected((!rows.is_empty()).then_some(view.selected));
    frame.render_stateful_widget(table, area, &mut state);
}

/// A table cell: the worker path on the left, numbers on the right so their digits line up.
fn aligned(text: String, column: usize) -> Cell<'static> {
    let line = Line::from(text);
    // WORKER and NAME are text, read from the left; the figures line up on the right.
    Cell::from(if column <= 1 {
        line
    } else {
        line.right_aligned()
    })
}

/// Width of one per-CPU cell in the detail panel: `cpu 12 ▕██████████▏ 1.00`.
const CPU_CELL_WIDTH: usize = 23;
/// Cells of the per-CPU bar (one cell is a tenth of a core).
const BAR_CELLS: usize = 10;
/// Width of the delays column of the detail panel.
const DELAYS_WIDTH: u16 = 43;
/// Width of the per-family bytes column of the detail panel.
const NET_WIDTH: u16 = 46;
/// Lines the delays and bytes columns need.
const FIXED_DETAIL_LINES: u16 = 9;

/// Height of the detail panel: enough for every CPU of the selected worker, borders included.
fn detail_height(selected: Option<&WorkerStats>, screen_width: u16) -> u16 {
    let cpus = selected.map_or(0, |worker| worker.cpu_ns_per_cpu.len());
    let cpu_width = screen_width.saturating_sub(DELAYS_WIDTH + NET_WIDTH + 2) as usize;
    let per_line = (cpu_width / CPU_CELL_WIDTH).max(1);
    let cpu_lines = 1 + cpus.div_ceil(per_line) as u16;
    cpu_lines.max(FIXED_DETAIL_LINES) + 2
}

/// The selected worker in detail: per-CPU cores beside their total, where its threads' time
/// went with run-queue wait quantiles, and bytes per socket family.
fn render_detail(
    frame: &mut Frame,
    area: Rect,
    selected: Option<&WorkerStats>,
    measured: Measured,
    namer: &crate::model::endpoints::EndpointNamer,
) {
    let Some(worker) = selected else {
        let block = Block::default().borders(Borders::ALL).title(" detail ");
        frame.render_widget(
            Paragraph::new("no worker selected (none active or none matches the filter)")
                .block(block),
            area,
        );
        return;
    };
    let block = Block::default()
        .borders(Borders::ALL)
        .title(format!(" {} ", worker_label(worker)));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [cpus, delays, net] = Layout::horizontal([
        Constraint::Min(CPU_CELL_WIDTH as u16),
        Constraint::Length(DELAYS_WIDTH),
        Constraint::Length(NET_WIDTH),
    ])
    .areas(inner);
    frame.render_widget(Paragraph::new(per_cpu_lines(worker, cpus.width)), cpus);
    let not_measured = |what: &str| vec![Line::from(format!("{what}: not measured"))];
    frame.render_widget(
        Paragraph::new(if measured.delays {
            delay_lines(worker)
        } else {
            not_measured("run queue, I/O and sleep")
        }),
        delays,
    );
    frame.render_widget(
        Paragraph::new(if measured.net {
            net_lines(worker, namer)
        } else {
            not_measured("socket bytes")
        }),
        net,
    );
}

/// Per-CPU cores as bars, several CPUs a line, under their total (a split like 0.50 0.50
/// means one core's work moved between CPUs: the total says how much work there was).
fn per_cpu_lines(worker: &WorkerStats, width: u16) -> Vec<Line<'static>> {
    let per_line = (width as usize / CPU_CELL_WIDTH).max(1);
    let mut lines = vec![Line::from(vec![
        Span::raw("per-CPU cores, total "),
        Span::raw(format!("{:.2}", worker.cpu_cores())).bold(),
    ])];
    let cells: Vec<String> = worker
        .cpu_cores_per_cpu()
        .iter()
        .enumerate()
        .map(|(cpu, &cores)| format!("cpu{cpu:<3} ▕{}▏{cores:>5.2}", bar(cores)))
        .collect();
    for chunk in cells.chunks(per_line) {
        lines.push(Line::from(chunk.join(" ")));
    }
    lines
}

/// A bar of [`BAR_CELLS`] cells for 0..=1 core, in eighths of a cell.
fn bar(cores: f64) -> String {
    const EIGHTHS: [char; 8] = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉'];
    let eighths = (cores.clamp(0.0, 1.0) * (BAR_CELLS * 8) as f64).round() as usize;
    let (full, part) = (eighths / 8, eighths % 8);
    let mut text = "█".repeat(full);
    if part > 0 {
        text.push(EIGHTHS[part]);
    }
    format!("{text:<BAR_CELLS$}")
}

/// Where the worker's thread time went, and how long its run-queue waits were.
fn delay_lines(worker: &WorkerStats) -> Vec<Line<'static>> {
    let delays = &worker.delays;
    let row = |name: &str, ns: u64| {
        Line::from(format!(
            "{name:<11}{:>6.0}% {:>9}",
            worker.share_of_interval(ns) * 100.0,
            duration(ns)
        ))
    };
    let quantile = |q: f64| {
        delays
            .runqueue_wait_quantile_ns(q)
            .map_or_else(|| "-".to_string(), |ns| format!("≤{}", duration(ns)))
    };
    vec![
        Line::from("thread time, % of interval").bold(),
        row("on CPU", worker.cpu_ns()),
        row("run queue", delays.runqueue_wait_ns),
        row("blocked IO", delays.blocked_io_ns),
        row("sleep", delays.sleep_ns),
        Line::from(format!(
            "runq p50 {} p90 {} p99 {}",
            quantile(0.5),
            quantile(0.9),
            quantile(0.99)
        )),
        Line::from(format!("waiting on {}", super::table::top_reasons(worker))),
    ]
}

/// Bytes and calls per socket family over the interval.
fn net_lines(
    worker: &WorkerStats,
    namer: &crate::model::endpoints::EndpointNamer,
) -> Vec<Line<'static>> {
    let mut lines = vec![
        Line::from(format!(
            "{:<6}{:>11}{:>11}{:>9}{:>9}",
            "family", "SEND/s", "RECV/s", "sends", "recvs"
        ))
        .bold(),
    ];
    let seconds = worker.interval_ns as f64 / 1e9;
    let rate = |count: u64| {
        let per_second = if seconds > 0.0 {
            count as f64 / seconds
        } else {
            0.0
        };
        format!("{}/s", bytes(per_second as u64))
    };
    for (name, family) in FAMILY_NAMES.iter().zip(&worker.net) {
        lines.push(Line::from(format!(
            "{name:<6}{:>11}{:>11}{:>9}{:>9}",
            rate(family.sent_bytes),
            rate(family.received_bytes),
            family.sent_calls,
            family.received_calls
        )));
    }
    lines.push(Line::from(format!(
        "switches: {} voluntary, {} involuntary",
        worker.voluntary_switches, worker.involuntary_switches
    )));
    // The busiest peers.
    for endpoint in crate::model::endpoints::by_label(namer, &worker.endpoints)
        .iter()
        .take(2)
    {
        lines.push(Line::from(format!(
            "{:<22} {:>9} {:>9} waited {}",
            endpoint.label,
            rate(endpoint.stats.sent_bytes),
            rate(endpoint.stats.received_bytes),
            duration(endpoint.stats.wait_ns)
        )));
    }
    lines
}

/// A duration in the largest unit that keeps it at least 1, to three significant digits:
/// `850ns`, `2.00µs`, `256µs`, `16.4ms`, `1.20s`.
fn duration(ns: u64) -> String {
    if ns < 1_000 {
        return format!("{ns}ns");
    }
    let (value, unit) = if ns < 1_000_000 {
        (ns as f64 / 1e3, "µs")
    } else if ns < 1_000_000_000 {
        (ns as f64 / 1e6, "ms")
    } else {
        (ns as f64 / 1e9, "s")
    };
    if value < 10.0 {
        format!("{value:.2}{unit}")
    } else if value < 100.0 {
        format!("{value:.1}{unit}")
    } else {
        format!("{value:.0}{unit}")
    }
}

/// Set while the terminal is in raw mode on the alternate screen, so the panic hook and
/// [`Screen`]'s drop restore it exactly once.
static TERMINAL_TAKEN: AtomicBool = AtomicBool::new(false);

/// How long the key thread waits for input before checking whether it should stop.
const KEY_POLL: Duration = Duration::from_millis(100);

/// The terminal while `top` runs: raw mode, alternate screen, hidden cursor, and a thread
/// reading terminal events into a channel. Dropping it (quit, error, unwinding) gives the
/// terminal back; a panic hook does the same before the panic message is printed.
pub struct Screen {
    terminal: Terminal<CrosstermBackend<Stdout>>,
    events: mpsc::Receiver<Event>,
    reader: Option<JoinHandle<()>>,
}

impl Screen {
    /// Takes over the terminal.
    pub fn start() -> anyhow::Result<Self> {
        install_panic_hook();
        terminal::enable_raw_mode()?;
        TERMINAL_TAKEN.store(true, Ordering::SeqCst);
        // From here on, an early return drops `screen`, which restores the terminal.
        let (sender, events) = mpsc::channel(64);
        let mut screen = Self {
            terminal: Terminal::new(CrosstermBackend::new(std::io::stdout()))?,
            events,
            reader: None,
        };
        execute!(
            screen.terminal.backend_mut(),
            EnterAlternateScreen,
            cursor::Hide
        )?;
        screen.terminal.clear()?;
        screen.reader = Some(
            std::thread::Builder::new()
                .name("top-keys".into())
                .spawn(move || read_events(&sender))?,
        );
        Ok(screen)
    }

    /// Draws `interval` as `view` says.
    pub fn draw(&mut self, interval: &Interval, view: &TopView) -> anyhow::Result<()> {
        self.terminal.draw(|frame| render(frame, interval, view))?;
        Ok(())
    }

    /// The next terminal event (key or resize); `None` once the terminal can no longer be
    /// read.
    pub async fn next_event(&mut self) -> Option<Event> {
        self.events.recv().await
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        // Closing the channel stops the key thread within one poll; wait for it so it does not
        // read keys meant for the shell.
        self.events.close();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        restore_terminal();
    }
}

/// The key thread: crossterm's reads block, so they run here and are handed to the loop.
fn read_events(sender: &mpsc::Sender<Event>) {
    while !sender.is_closed() {
        match event::poll(KEY_POLL) {
            Ok(false) => {}
            Ok(true) => match event::read() {
                Ok(event) => {
                    if sender.blocking_send(event).is_err() {
                        return;
                    }
                }
                Err(_) => return,
            },
            // The terminal is gone: dropping the sender tells the loop to stop.
            Err(_) => return,
        }
    }
}

/// Leaves the alternate screen, shows the cursor and ends raw mode, if `top` had taken them.
fn restore_terminal() {
    if TERMINAL_TAKEN.swap(false, Ordering::SeqCst) {
        let _ = execute!(std::io::stdout(), LeaveAlternateScreen, cursor::Show);
        let _ = terminal::disable_raw_mode();
    }
}

/// Restores the terminal before any panic message, so it is readable and the shell usable.
fn install_panic_hook() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_terminal();
            previous(info);
        }));
    });
}

#[cfg(test)]
mod tests {
    use probe_common::net::FAMILY_IPV4;
    use ratatui::{backend::TestBackend, buffer::Buffer};

    use super::*;
    use crate::clock::Timestamp;

    fn worker(id: u64, path: &str, cpu: [u64; 2], sent: u64, runq_ns: u64) -> WorkerStats {
        let mut worker = WorkerStats {
            cgroup_id: id,
            path: Some(path.into()),
            interval_ns: 1_000_000_000,
            cpu_ns_per_cpu: cpu.to_vec(),
            ..WorkerStats::default()
        };
        worker.net[FAMILY_IPV4].sent_bytes = sent;
        worker.net[FAMILY_IPV4].sent_calls = sent.div_ceil(1_000);
        worker.delays.runqueue_wait_ns = runq_ns;
        worker
    }

    fn interval() -> Interval {
        let mut busy = worker(3, "/busy", [900_000_000, 500_000_000], 0, 10_000_000);
        busy.delays.runqueue_wait_hist = vec![0; probe_common::cpu::RUNQ_BUCKETS];
        busy.delays.runqueue_wait_hist[2] = 9; // [2, 4) µs
        busy.delays.runqueue_wait_hist[10] = 1; // [512, 1024) µs
        Interval {
            measured: Default::default(),
            start: Some(Timestamp {
                monotonic_ns: 0,
                wall_unix_ns: 0,
            }),
            end: Some(Timestamp {
                monotonic_ns: 1_000_000_000,
                wall_unix_ns: 1_000_000_000,
            }),
            workers: vec![
                worker(2, "/sender", [100_000_000, 0], 5_000_000, 0),
                busy,
                worker(4, "/waiter", [1_000_000, 0], 0, 400_000_000),
                worker(5, "/idle", [0, 0], 0, 0),
            ],
            drops: vec![0, 0],
            total_drops: vec![0, 3],
        }
    }

    #[test]
    fn narrow_terminals_drop_whole_columns_and_shorten_paths_in_the_middle() {
        let mut interval = interval();
        let long = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b.slice/cri-containerd-4f3a9c1e.scope";
        let mut wide = worker(7, long, [900_000_000, 0], 18_245_222, 0);
        wide.memory = Some(crate::model::MemoryReading {
            current_bytes: 503 << 20,
            peak_bytes: 600 << 20,
            source: crate::model::MemorySource::Cgroup2,
        });
        interval.workers.push(wide);
        let mut view = TopView::new(10, 2);
        view.sync(&interval);
        let titles: Vec<&str> = COLUMNS.iter().map(|(title, _)| *title).collect();
        for width in [80, 100, 120, 160, 200] {
            let text = screen_text(&interval, &view, width, 30);
            let lines: Vec<&str> = text.lines().collect();
            let header = lines[1];
            // Every title shown is whole (WAITING ON is two words).
            let words = header.replace("WAITING ON", "WAITING_ON");
            for word in words.split_whitespace() {
                let word = word.trim_end_matches(['▼', '▲']).replace('_', " ");
                assert!(
                    titles.contains(&word.as_str()),
                    "{width}: cut title {word:?} in {header:?}"
                );
            }
            let row = lines
                .iter()
                .find(|line| line.contains("4f3a9c1e.scope"))
                .unwrap_or_else(|| panic!("{width}: the long path's end is not shown:\n{text}"));
            assert!(row.contains('…'), "{width}: {row:?}");
            assert!(
                row.trim_start_matches(['▶', ' ']).starts_with("/kube"),
                "{width}: {row:?}"
            );
            if header.contains("MEM") {
                assert!(row.contains(" 503MiB"), "{width}: memory cut in {row:?}");
            }
            if header.contains("SEND/s") {
                assert!(row.contains(" 17.4MiB/s"), "{width}: rate cut in {row:?}");
            }
            assert!(
                header.contains("CORES") && header.contains("CPU%▼"),
                "{width}: {header}"
            );
        }
        // At 200 columns everything fits.
        let text = screen_text(&interval, &view, 200, 30);
        let header = text.lines().nth(1).expect("header").to_string();
        for title in titles.iter().skip(1) {
            assert!(
                header.contains(title),
                "{title} missing at 200 columns: {header}"
            );
        }
    }

    fn press(view: &mut TopView, code: KeyCode) -> Action {
        handle_key(view, KeyEvent::new(code, KeyModifiers::NONE))
    }

    fn type_text(view: &mut TopView, text: &str) {
        for ch in text.chars() {
            press(view, KeyCode::Char(ch));
        }
    }

    fn paths(view: &TopView, interval: &Interval) -> Vec<String> {
        view.rows(interval)
            .iter()
            .map(|w| worker_label(w))
            .collect()
    }

    fn screen_text(interval: &Interval, view: &TopView, width: u16, height: u16) -> String {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).expect("test terminal");
        terminal
            .draw(|frame| render(frame, interval, view))
            .expect("draw");
        buffer_text(terminal.backend().buffer())
    }

    fn buffer_text(buffer: &Buffer) -> String {
        let width = buffer.area.width as usize;
        buffer
            .content
            .chunks(width)
            .map(|line| {
                let text: String = line.iter().map(|cell| cell.symbol()).collect();
                text.trim_end().to_string() + "\n"
            })
            .collect()
    }

    #[test]
    fn sorts_by_model_fields_and_hides_idle_workers() {
        let interval = interval();
        let mut view = TopView::new(10, 2);
        assert_eq!(paths(&view, &interval), ["/busy", "/sender", "/waiter"]);
        press(&mut view, KeyCode::Char('w'));
        assert_eq!(view.sort, SortKey::RunqueueWait);
        assert_eq!(paths(&view, &interval), ["/waiter", "/busy", "/sender"]);
        press(&mut view, KeyCode::Char('s'));
        assert_eq!(paths(&view, &interval)[0], "/sender");
        press(&mut view, KeyCode::Char('n'));
        assert_eq!(paths(&view, &interval), ["/busy", "/sender", "/waiter"]);
        for (key, sort) in SORT_KEYS {
            press(&mut view, KeyCode::Char(key));
            assert_eq!(view.sort, sort, "key {key}");
        }
        view.limit = 2;
        assert_eq!(view.rows(&interval).len(), 2);
    }

    #[test]
    fn filter_is_typed_kept_and_cleared() {
        let interval = interval();
        let mut view = TopView::new(10, 2);
        press(&mut view, KeyCode::Char('/'));
        assert!(view.editing_filter);
        // Sort and quit keys are text while typing a filter.
        type_text(&mut view, "SENq");
        press(&mut view, KeyCode::Backspace);
        assert_eq!(view.filter, "SEN");
        assert_eq!(view.sort, SortKey::Cpu);
        assert_eq!(paths(&view, &interval), ["/sender"]);
        assert_eq!(press(&mut view, KeyCode::Enter), Action::None);
        assert!(!view.editing_filter);
        assert_eq!(paths(&view, &interval), ["/sender"]);
        // Esc drops the filter before it quits.
        assert_eq!(press(&mut view, KeyCode::Esc), Action::None);
        assert_eq!(paths(&view, &interval).len(), 3);
        assert_eq!(press(&mut view, KeyCode::Esc), Action::Quit);
        press(&mut view, KeyCode::Char('/'));
        type_text(&mut view, "zzz");
        press(&mut view, KeyCode::Esc);
        assert!(!view.editing_filter && view.filter.is_empty());
    }

    #[test]
    fn quit_pause_and_ctrl_c() {
        let mut view = TopView::new(10, 2);
        assert_eq!(press(&mut view, KeyCode::Char('p')), Action::None);
        assert!(view.paused);
        press(&mut view, KeyCode::Char('p'));
        assert!(!view.paused);
        assert_eq!(press(&mut view, KeyCode::Char('q')), Action::Quit);
        press(&mut view, KeyCode::Char('/'));
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(handle_key(&mut view, ctrl_c), Action::Quit);
        let mut release = KeyEvent::new(KeyCode::Char('x'), KeyModifiers::NONE);
        release.kind = KeyEventKind::Release;
        handle_key(&mut view, release);
        assert_eq!(view.filter, "");
    }

    #[test]
    fn selection_moves_is_clamped_and_follows_the_worker() {
        let interval = interval();
        let mut view = TopView::new(10, 2);
        view.sync(&interval);
        assert_eq!((view.selected, view.selected_id), (0, Some(3)));
        press(&mut view, KeyCode::Down);
        press(&mut view, KeyCode::Down);
        press(&mut view, KeyCode::Down);
        view.sync(&interval);
        assert_eq!((view.selected, view.selected_id), (2, Some(4)));
        press(&mut view, KeyCode::Up);
        view.sync(&interval);
        assert_eq!(view.selected_id, Some(2));
        // Re-sorting keeps the same worker selected, wherever its row went.
        press(&mut view, KeyCode::Char('s'));
        view.sync(&interval);
        assert_eq!((view.selected, view.selected_id), (0, Some(2)));
        press(&mut view, KeyCode::End);
        view.sync(&interval);
        assert_eq!(view.selected, 2);
        press(&mut view, KeyCode::Home);
        view.sync(&interval);
        assert_eq!(view.selected, 0);
        // A filter that hides the selected worker moves the selection to what is left.
        view.filter = "wait".into();
        view.sync(&interval);
        assert_eq!((view.selected, view.selected_id), (0, Some(4)));
        view.filter = "nothing".into();
        view.sync(&interval);
        assert_eq!((view.selected, view.selected_id), (0, None));
    }

    #[test]
    fn a_name_column_appears_when_names_tell_more_than_paths() {
        let mut interval = interval();
        let text = screen_text(&interval, &TopView::new(10, 2), 200, 24);
        assert!(
            !text.lines().nth(1).unwrap_or("").contains("NAME"),
            "{text}"
        );
        let id = "4f3a9c1e7b2d5a8f0c6e3b9d1a7f4c2e8b5d0a3f6c9e2b7d4a1f8c5e0b3d6a9f";
        let path = format!("/libpod_parent/libpod-{id}");
        let named = crate::model::identity::identify(&path).named_by(
            &crate::model::identity::ContainerInfo {
                runtime: "podman".into(),
                id: id.into(),
                name: "wp-burn".into(),
                ..Default::default()
            },
        );
        interval.workers[0].path = Some(path);
        interval.workers[0].identity = Some(std::sync::Arc::new(named));
        let text = screen_text(&interval, &TopView::new(10, 2), 200, 24);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[1].contains("NAME"), "{text}");
        assert!(
            lines
                .iter()
                .any(|line| line.starts_with(" /libpod_parent/libp") && line.contains(" wp-burn ")),
            "{text}"
        );
    }

    #[test]
    fn screen_shows_header_table_detail_and_keys() {
        let interval = interval();
        let mut view = TopView::new(10, 2);
        press(&mut view, KeyCode::Char('w'));
        view.sync(&interval);
        press(&mut view, KeyCode::Down); // /busy, second by run-queue wait
        view.sync(&interval);
        let text = screen_text(&interval, &view, 140, 24);
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("workers active: 3 (shown 3)  interval: 1.00s  drops since start: 3  node CPUs: 2  sort: RUNQ%"),
            "{text}"
        );
        let header = lines[1];
        for title in [
            "WORKER",
            "CORES",
            "CPU%",
            "RUNQ%▼",
            "IO%",
            "SLEEP%",
            "SEND/s",
            "RECV/s",
            "MEM",
            "CPU-TOTAL",
            "SENT",
            "RECV",
        ] {
            assert!(header.contains(title), "{title} missing in {header:?}");
        }
        assert!(lines[2].contains("/waiter"), "{text}");
        assert!(lines[3].starts_with("▶/busy"), "{text}");
        assert!(
            lines[3].contains(" 1.40 ") && lines[3].contains(" 140 "),
            "{text}"
        );
        // The detail panel is the selected worker's, per-CPU cores beside their total.
        assert!(text.contains("┌ /busy ─"), "{text}");
        assert!(text.contains("per-CPU cores, total 1.40"), "{text}");
        assert!(text.contains("cpu0   ▕█████████ ▏ 0.90"), "{text}");
        assert!(text.contains("cpu1   ▕█████     ▏ 0.50"), "{text}");
        assert!(
            text.contains("runq p50 ≤4.00µs p90 ≤4.00µs p99 ≤1.02ms"),
            "{text}"
        );
        assert!(text.contains("run queue       1%    10.0ms"), "{text}");
        assert!(text.contains("ipv4"), "{text}");
        let footer = lines.last().expect("footer");
        assert!(
            footer.starts_with("↑/↓ select   sort: c CPU%  w RUNQ%  i IO%  l SLEEP%  s SEND/s  r RECV/s  n WORKER   / filter   p pause   q quit"),
            "{footer:?}"
        );
    }

    #[test]
    fn screen_shows_filter_pause_and_an_empty_selection() {
        let interval = interval();
        let mut view = TopView::new(10, 2);
        press(&mut view, KeyCode::Char('/'));
        type_text(&mut view, "nomatch");
        view.paused = true;
        view.sync(&interval);
        let text = screen_text(&interval, &view, 120, 20);
        let header = text.lines().next().unwrap();
        assert!(
            header.starts_with("PAUSED  workers active: 3 (shown 0)"),
            "{text}"
        );
        assert!(header.ends_with("sort: CPU%  filter: nomatch"), "{text}");
        assert!(text.contains("no worker selected"), "{text}");
        assert!(
            text.lines()
                .last()
                .unwrap()
                .starts_with("filter: nomatch▏   Enter keep"),
            "{text}"
        );
        let waiting = screen_text(&Interval::default(), &TopView::new(10, 4), 100, 12);
        assert!(
            waiting.starts_with("waiting for the first interval…  node CPUs: 4"),
            "{waiting}"
        );
    }

    #[test]
    fn bars_and_durations() {
        assert_eq!(bar(0.0), " ".repeat(BAR_CELLS));
        assert_eq!(bar(1.0), "█".repeat(BAR_CELLS));
        assert_eq!(bar(0.55), "█████▌    ");
        assert_eq!(duration(850), "850ns");
        assert_eq!(duration(2_000), "2.00µs");
        assert_eq!(duration(256_000), "256µs");
        assert_eq!(duration(16_384_000), "16.4ms");
        assert_eq!(duration(1_024_000), "1.02ms");
        assert_eq!(duration(1_200_000_000), "1.20s");
    }
}
