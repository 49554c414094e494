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
use probe_common::net::{FAMILY_COUNT, FAMILY_NAMES};
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
    // The detail's parts are arranged for the width inside its borders; its height follows.
    let detail_width = frame.area().width.saturating_sub(2);
    let detail = rows.get(view.selected).map(|worker| {
        Detail::new(
            worker,
            interval.measured,
            &view.endpoint_namer,
            detail_width,
        )
    });
    // With no worker selected, the panel keeps the height of the bytes part.
    let detail_height = 2 + detail.as_ref().map_or(NET_LINES, Detail::height);
    let [header, table, detail_area, footer] = Layout::vertical([
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
    render_detail(frame, detail_area, detail);
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
    if let Some(level) = interval.level {
        parts.push(format!("{level}: subtrees"));
    }
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
        // The root's tail is empty; its name is its path.
        label != name && label.rsplit('/').next() != Some(name.as_str())
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

/// Width of one per-CPU cell in the detail panel: `cpu12  ▕██████████▏ 1.00`.
const CPU_CELL_WIDTH: usize = 24;
/// Cells of the per-CPU bar (one cell is a tenth of a core).
const BAR_CELLS: usize = 10;
/// Narrowest the per-CPU part gets: its heading, `per-CPU cores, total 128.00`.
const CPU_PART_MIN_WIDTH: u16 = 27;
/// Width of the thread-time part: its widest line, `runq p50 ≤16.4ms p90 ≤16.4ms p99 ≤16.4ms`.
const DELAYS_WIDTH: u16 = 40;
/// Width of the bytes part: its widest line, an endpoint row (label, two rates, wait).
const NET_WIDTH: u16 = 48;
/// Blank columns between parts placed side by side, so no two ever touch.
const PART_GAP: u16 = 2;
/// Endpoints listed in the bytes part, busiest first.
const ENDPOINTS_SHOWN: usize = 2;
/// Widest endpoint label before it is shortened in the middle (any IPv4 `ip:port` is whole).
const ENDPOINT_LABEL_WIDTH: usize = 21;
/// Lines kept for the thread-time part when measured: heading, four rows, quantiles, waits,
/// memory. Kept whatever a worker shows, so the panel does not change height from one
/// selected worker to the next.
const DELAYS_LINES: u16 = 8;
/// Lines kept for the bytes part when measured: heading, a row per family, switches, and the
/// endpoints under their heading.
const NET_LINES: u16 = (FAMILY_COUNT + ENDPOINTS_SHOWN + 3) as u16;

/// How the detail panel's three parts (per-CPU cores, thread time, bytes) are placed. Parts
/// are never narrowed below their widest line: when they do not fit side by side they are
/// stacked, so no number is cut and no two columns touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arrangement {
    /// All three side by side (terminals 121 columns wide and wider).
    SideBySide,
    /// Per-CPU cores across the top, thread time and bytes side by side below (92 to 120
    /// columns).
    CpusAbove,
    /// One above the other (narrower, e.g. 80 columns).
    Stacked,
}

impl Arrangement {
    /// The arrangement for a panel `width` cells wide inside its borders.
    fn for_width(width: u16) -> Self {
        if width >= CPU_PART_MIN_WIDTH + PART_GAP + DELAYS_WIDTH + PART_GAP + NET_WIDTH {
            Self::SideBySide
        } else if width >= DELAYS_WIDTH + PART_GAP + NET_WIDTH {
            Self::CpusAbove
        } else {
            Self::Stacked
        }
    }
}

/// The selected worker's detail, its lines made for a panel of a given width: built before
/// the screen is divided, since the panel's height depends on them.
struct Detail {
    title: String,
    arrangement: Arrangement,
    cpus: Vec<Line<'static>>,
    delays: Vec<Line<'static>>,
    net: Vec<Line<'static>>,
    /// Lines the thread-time part takes: what it shows, at least what is kept for it.
    delays_height: u16,
    /// Lines the bytes part takes, likewise.
    net_height: u16,
}

impl Detail {
    /// The detail of `worker` for a panel `width` cells wide inside its borders.
    fn new(
        worker: &WorkerStats,
        measured: Measured,
        namer: &crate::model::endpoints::EndpointNamer,
        width: u16,
    ) -> Self {
        let arrangement = Arrangement::for_width(width);
        let cpu_width = match arrangement {
            Arrangement::SideBySide => width - (PART_GAP + DELAYS_WIDTH + PART_GAP + NET_WIDTH),
            Arrangement::CpusAbove | Arrangement::Stacked => width,
        };
        let not_measured = |what: &str| Line::from(format!("{what}: not measured"));
        let mut delays = if measured.delays {
            delay_lines(worker)
        } else {
            vec![not_measured("run queue, I/O and sleep")]
        };
        delays.push(memory_line(worker));
        let net = if measured.net {
            net_lines(worker, namer, measured.switches)
        } else {
            vec![not_measured("socket bytes")]
        };
        // What is not measured takes no room kept for it: measurement is fixed for the run,
        // so the height still holds from one worker to the next.
        let height = |lines: &[Line], kept: u16, is_measured: bool| {
            let shown = lines.len() as u16;
            if is_measured { shown.max(kept) } else { shown }
        };
        Self {
            delays_height: height(&delays, DELAYS_LINES, measured.delays),
            net_height: height(&net, NET_LINES, measured.net),
            // Less the spaces around the title.
            title: super::table::shorten(&worker_label(worker), width.saturating_sub(2).into()),
            arrangement,
            cpus: per_cpu_lines(worker, cpu_width),
            delays,
            net,
        }
    }

    /// Lines the panel takes inside its borders.
    fn height(&self) -> u16 {
        let cpus = self.cpus.len() as u16;
        let (delays, net) = (self.delays_height, self.net_height);
        match self.arrangement {
            Arrangement::SideBySide => cpus.max(delays).max(net),
            Arrangement::CpusAbove => cpus + delays.max(net),
            Arrangement::Stacked => cpus + delays + net,
        }
    }

    /// Where the per-CPU, thread-time and bytes parts go in `inner`.
    fn areas(&self, inner: Rect) -> [Rect; 3] {
        let cpus = self.cpus.len() as u16;
        match self.arrangement {
            Arrangement::SideBySide => Layout::horizontal([
                Constraint::Fill(1),
                Constraint::Length(DELAYS_WIDTH),
                Constraint::Length(NET_WIDTH),
            ])
            .spacing(PART_GAP)
            .areas(inner),
            Arrangement::CpusAbove => {
                let [top, bottom] =
                    Layout::vertical([Constraint::Length(cpus), Constraint::Fill(1)]).areas(inner);
                let [delays, net] =
                    Layout::horizontal([Constraint::Length(DELAYS_WIDTH), Constraint::Fill(1)])
                        .spacing(PART_GAP)
                        .areas(bottom);
                [top, delays, net]
            }
            Arrangement::Stacked => Layout::vertical([
                Constraint::Length(cpus),
                Constraint::Length(self.delays_height),
                Constraint::Fill(1),
            ])
            .areas(inner),
        }
    }
}

/// Draws the selected worker's detail, or says why there is none.
fn render_detail(frame: &mut Frame, area: Rect, detail: Option<Detail>) {
    let Some(detail) = detail else {
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
        .title(format!(" {} ", detail.title));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [cpus, delays, net] = detail.areas(inner);
    frame.render_widget(Paragraph::new(detail.cpus), cpus);
    frame.render_widget(Paragraph::new(detail.delays), delays);
    frame.render_widget(Paragraph::new(detail.net), net);
}

/// Per-CPU cores as bars, as many CPUs a line as fit `width` whole, under their total (a
/// split like 0.50 0.50 means one core's work moved between CPUs: the total says how much
/// work there was).
fn per_cpu_lines(worker: &WorkerStats, width: u16) -> Vec<Line<'static>> {
    // Cells are joined by one space.
    let per_line = ((width as usize + 1) / (CPU_CELL_WIDTH + 1)).max(1);
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

/// Bytes and calls per socket family over the interval, context switches, and the busiest
/// endpoints.
fn net_lines(
    worker: &WorkerStats,
    namer: &crate::model::endpoints::EndpointNamer,
    switches_measured: bool,
) -> Vec<Line<'static>> {
    // Cells joined by spaces never touch, however large a count grows.
    let mut lines = vec![
        Line::from(format!(
            "{:<6} {:>10} {:>10} {:>8} {:>8}",
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
            "{name:<6} {:>10} {:>10} {:>8} {:>8}",
            rate(family.sent_bytes),
            rate(family.received_bytes),
            family.sent_calls,
            family.received_calls
        )));
    }
    let voluntary = format!("switches: {} voluntary,", worker.voluntary_switches);
    let involuntary = format!("{} involuntary", worker.involuntary_switches);
    // On two lines when the counts are too long for one.
    if !switches_measured {
        lines.push(Line::from("switches: not measured"));
    } else if voluntary.len() + 1 + involuntary.len() <= NET_WIDTH as usize {
        lines.push(Line::from(format!("{voluntary} {involuntary}")));
    } else {
        lines.push(Line::from(voluntary));
        lines.push(Line::from(format!("{:>10}{involuntary}", "")));
    }
    // The busiest peers.
    let endpoints = crate::model::endpoints::by_label(namer, &worker.endpoints);
    if !endpoints.is_empty() {
        lines.push(
            Line::from(format!(
                "{:<ENDPOINT_LABEL_WIDTH$} {:>9} {:>9} {:>6}",
                "endpoint", "SEND/s", "RECV/s", "waited"
            ))
            .bold(),
        );
    }
    for endpoint in endpoints.iter().take(ENDPOINTS_SHOWN) {
        lines.push(Line::from(format!(
            "{:<ENDPOINT_LABEL_WIDTH$} {:>9} {:>9} {:>6}",
            super::table::shorten(&endpoint.label, ENDPOINT_LABEL_WIDTH),
            rate(endpoint.stats.sent_bytes),
            rate(endpoint.stats.received_bytes),
            duration(endpoint.stats.wait_ns)
        )));
    }
    lines
}

/// Memory in use at the end of the interval and the highest use its source knows of.
fn memory_line(worker: &WorkerStats) -> Line<'static> {
    let current = super::table::memory_cell(worker);
    Line::from(match worker.memory {
        Some(memory) => format!("memory {current}, peak {}", bytes(memory.peak_bytes)),
        None => format!("memory {current}"),
    })
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
        busy.delays.runqueue_wait_hist[2] = 9; // [2, 4) µs
        busy.delays.runqueue_wait_hist[10] = 1; // [512, 1024) µs
        Interval {
            measured: Default::default(),
            level: None,
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

    /// A busy worker with figures as large as real ones: six CPUs, every family, long
    /// switch counts, an IPv6 endpoint, hundreds of MiB.
    fn busy_worker() -> WorkerStats {
        let path = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a2b.slice/cri-containerd-4f3a9c1e.scope";
        let mut worker = WorkerStats {
            cgroup_id: 9,
            path: Some(path.into()),
            interval_ns: 1_000_000_000,
            cpu_ns_per_cpu: vec![
                980_000_000,
                730_000_000,
                500_000_000,
                260_000_000,
                40_000_000,
                10_000_000,
            ],
            voluntary_switches: 12_345_678,
            involuntary_switches: 9_876_543,
            memory: Some(crate::model::MemoryReading {
                current_bytes: 503 << 20,
                peak_bytes: 1_288_490_188,
                source: crate::model::MemorySource::Cgroup2,
            }),
            ..WorkerStats::default()
        };
        let delays = &mut worker.delays;
        delays.runqueue_wait_ns = 120_000_000;
        delays.blocked_io_ns = 46_000_000;
        delays.sleep_ns = 2_300_000_000;
        delays.runqueue_wait_hist[2] = 80; // [2, 4) µs
        delays.runqueue_wait_hist[10] = 15; // [512, 1024) µs
        delays.runqueue_wait_hist[14] = 5; // [8, 16) ms
        delays.wait_ns[0] = 1_900_000_000; // network
        delays.wait_ns[2] = 300_000_000; // lock
        // (sent, received, sends, receives) per family, in family order.
        let families = [
            (18_245_222, 1_572_864, 123_456, 98_765),
            (503 << 20, 9_999, 4_567_890, 12),
            (4_096, 4_096, 1, 1),
            (0, 0, 0, 0),
        ];
        for (family, (sent, received, sends, receives)) in worker.net.iter_mut().zip(families) {
            family.sent_bytes = sent;
            family.received_bytes = received;
            family.sent_calls = sends;
            family.received_calls = receives;
        }
        let endpoint =
            |addr: [u8; 16], family, sent_bytes, wait_ns| crate::model::endpoints::EndpointDelta {
                key: probe_common::net::EndpointKey {
                    cgroup_id: 9,
                    addr,
                    port: 5432,
                    family,
                    reserved: 0,
                },
                stats: probe_common::net::EndpointStats {
                    sent_bytes,
                    received_bytes: 1_572_864,
                    wait_ns,
                    ..Default::default()
                },
            };
        let mut v4 = [0; 16];
        v4[..4].copy_from_slice(&[10, 200, 30, 40]);
        let v6: std::net::Ipv6Addr = "2001:db8:85a3::8a2e:370:7334".parse().expect("an address");
        worker.endpoints = vec![
            endpoint(v4, probe_common::net::AF_INET, 18_245_222, 16_400_000),
            endpoint(v6.octets(), probe_common::net::AF_INET6, 503 << 20, 2_000),
        ];
        worker
    }

    /// Whether `token` stands whole on one of `lines`: after a space, a border or the line's
    /// start, and before a space, a comma, a border or the line's end, so it is neither cut
    /// nor run into a neighbour.
    fn stands_whole(lines: &[&str], token: &str) -> bool {
        lines.iter().any(|line| {
            line.match_indices(token).any(|(at, _)| {
                let before = line[..at].chars().next_back();
                let after = line[at + token.len()..].chars().next();
                matches!(before, None | Some(' ' | '│'))
                    && matches!(after, None | Some(' ' | ',' | '│'))
            })
        })
    }

    #[test]
    fn detail_panel_stacks_its_parts_rather_than_cut_a_number() {
        let interval = Interval {
            workers: vec![busy_worker()],
            ..interval()
        };
        let mut view = TopView::new(10, 6);
        view.sync(&interval);
        let v6_label = super::super::table::shorten(
            "[2001:db8:85a3::8a2e:370:7334]:5432",
            ENDPOINT_LABEL_WIDTH,
        );
        let tokens = [
            "per-CPU cores, total 2.52",
            "cpu0",
            "0.98",
            "cpu1",
            "0.73",
            "cpu2",
            "0.50",
            "cpu3",
            "0.26",
            "cpu4",
            "0.04",
            "cpu5",
            "0.01",
            "thread time, % of interval",
            "on CPU",
            "252%",
            "2.52s",
            "run queue",
            "12%",
            "120ms",
            "blocked IO",
            "5%",
            "46.0ms",
            "sleep",
            "230%",
            "2.30s",
            "runq p50 ≤4.00µs p90 ≤1.02ms p99 ≤16.4ms",
            "waiting on network 190% lock 30%",
            "memory 503MiB, peak 1.20GiB",
            "family",
            "SEND/s",
            "RECV/s",
            "sends",
            "recvs",
            "ipv4",
            "17.4MiB/s",
            "1.50MiB/s",
            "123456",
            "98765",
            "ipv6",
            "503MiB/s",
            "9.76KiB/s",
            "4567890",
            "unix",
            "4.00KiB/s",
            "other",
            "0B/s",
            "switches: 12345678 voluntary,",
            "9876543 involuntary",
            "endpoint",
            "waited",
            "10.200.30.40:5432",
            "16.4ms",
            &v6_label,
            "2.00µs",
        ];
        // The widths asked for, and each side of a change of arrangement, where parts fit
        // most tightly.
        for (width, arrangement) in [
            (80, Arrangement::Stacked),
            (91, Arrangement::Stacked),
            (92, Arrangement::CpusAbove),
            (100, Arrangement::CpusAbove),
            (110, Arrangement::CpusAbove),
            (120, Arrangement::CpusAbove),
            (121, Arrangement::SideBySide),
            (160, Arrangement::SideBySide),
            (200, Arrangement::SideBySide),
        ] {
            assert_eq!(Arrangement::for_width(width - 2), arrangement, "{width}");
            let text = screen_text(&interval, &view, width, 60);
            let detail: Vec<&str> = text
                .lines()
                .skip_while(|line| !line.starts_with('┌'))
                .take_while(|line| !line.starts_with('└'))
                .collect();
            assert!(
                detail[0].starts_with("┌ /kube") && detail[0].contains("4f3a9c1e.scope "),
                "{width}: title {:?}",
                detail[0]
            );
            for token in tokens {
                assert!(
                    stands_whole(&detail, token),
                    "{width}: {token:?} cut or touching in\n{}",
                    detail.join("\n")
                );
            }
            // The parts are placed as stated: side by side only where all fit.
            let line_with = |text: &str| {
                detail
                    .iter()
                    .find(|line| line.contains(text))
                    .unwrap_or_else(|| panic!("{width}: no {text:?}"))
            };
            let cpus = line_with("per-CPU cores");
            let delays = line_with("thread time");
            assert_eq!(
                cpus.contains("thread time") && delays.contains("family"),
                arrangement == Arrangement::SideBySide,
                "{width}:\n{}",
                detail.join("\n")
            );
            assert_eq!(
                delays.contains("family"),
                arrangement != Arrangement::Stacked,
                "{width}:\n{}",
                detail.join("\n")
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
        interval.workers[0].path = Some(path.into());
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
