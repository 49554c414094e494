//! `workerprobe plot`: one SVG drawn with plotters from a [`Picture`].
//!
//! Top to bottom: a title with the node's facts; a Gantt of every worker's life (a row per
//! worker ordered by start, its bar shaded by the average cores it used); then, for the
//! busiest workers only (so 50 workers stay readable), one series per worker in each of:
//! CPU cores used (total, or one panel per CPU), where its thread time went (small stacked
//! charts: on CPU / run-queue / blocked on I/O / sleep), send rate, receive rate and memory.
//!
//! Every worker's drawing in a panel is wrapped in
//! `<g class="series" data-panel="PANEL" data-worker="PATH"><title>LABEL</title>…</g>`
//! (`class="gantt-row"` in the Gantt), so a reader or a test can count series per worker
//! and a browser shows the label on hover. Plotters cannot group elements, so a marker text
//! is drawn before and after each series and [`Markers::apply`] swaps them for the `<g>` tags.

use plotters::{
    coord::{
        Shift,
        ranged1d::{DefaultFormatting, KeyPointHint},
        types::RangedCoordf64,
    },
    prelude::*,
};

use super::{
    format_bytes, format_seconds,
    series::{Picture, TickPoint, WorkerSeries, memory_lines, steps},
};

/// How much to draw.
#[derive(Clone, Copy, Debug)]
pub struct SvgOptions {
    /// How many workers (the busiest) get series in the per-worker panels.
    pub busiest: usize,
    /// One CPU panel per CPU instead of one of total cores.
    pub per_cpu: bool,
}

/// The default of `--busiest`: beyond a dozen lines a panel cannot be read.
pub const DEFAULT_BUSIEST: u16 = 12;

const WIDTH: u32 = 1400;
const LEGEND_WIDTH: u32 = 300;
const TITLE_HEIGHT: u32 = 64;
const GANTT_ROW_HEIGHT: u32 = 18;
const GANTT_EXTRA_HEIGHT: u32 = 100;
const CAPTION_HEIGHT: u32 = 34;
const PANEL_HEIGHT: u32 = 280;
const LEGEND_ROW_HEIGHT: u32 = 18;
const CELL_HEIGHT: u32 = 200;
const CELL_COLUMNS: usize = 3;
const BREAKDOWN_LEGEND_HEIGHT: u32 = 40;
/// Longest label shown; longer ones keep their tail (a path's informative end).
const LABEL_CHARS: usize = 40;
const FONT: &str = "sans-serif";

/// Marks a marker text: a private-use character no worker name starts with.
const MARK: &str = "\u{E000}wp-mark:";

/// Line colors (Tableau 10 and two more), by rank among the busiest workers.
const PALETTE: [RGBColor; 12] = [
    RGBColor(0x4e, 0x79, 0xa7),
    RGBColor(0xf2, 0x8e, 0x2b),
    RGBColor(0xe1, 0x57, 0x59),
    RGBColor(0x76, 0xb7, 0xb2),
    RGBColor(0x59, 0xa1, 0x4f),
    RGBColor(0xed, 0xc9, 0x48),
    RGBColor(0xb0, 0x7a, 0xa1),
    RGBColor(0xff, 0x9d, 0xa7),
    RGBColor(0x9c, 0x75, 0x5f),
    RGBColor(0x79, 0x70, 0x6e),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0x39, 0x3b, 0x79),
];

/// The time breakdown's layers: name and color, bottom to top.
const BREAKDOWN: [(&str, RGBColor); 10] = [
    ("on CPU", RGBColor(0x59, 0xa1, 0x4f)),
    ("run-queue", RGBColor(0xe1, 0x57, 0x59)),
    ("network", RGBColor(0x4e, 0x79, 0xa7)),
    ("disk", RGBColor(0xf2, 0x8e, 0x2b)),
    ("lock", RGBColor(0xb0, 0x7a, 0xa1)),
    ("timer", RGBColor(0x76, 0xb7, 0xb2)),
    ("child", RGBColor(0xed, 0xc9, 0x48)),
    ("pipe", RGBColor(0xff, 0x9d, 0xa7)),
    ("poll", RGBColor(0x9c, 0x75, 0x5f)),
    ("other", RGBColor(0xba, 0xb0, 0xac)),
];

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;
type Drawn = anyhow::Result<()>;
/// A worker's line in a panel, as pieces of (seconds, value) points.
type LinesOf<'a> = dyn Fn(&WorkerSeries) -> Vec<Vec<(f64, f64)>> + 'a;

/// Draws `picture` as one SVG document.
pub fn render(picture: &Picture, options: &SvgOptions) -> anyhow::Result<String> {
    let shown = picture.busiest(options.busiest.max(1));
    let rows = picture.workers.len() as u32;
    let gantt_height = GANTT_EXTRA_HEIGHT + GANTT_ROW_HEIGHT * rows.max(3);
    let panel_height = PANEL_HEIGHT.max(60 + LEGEND_ROW_HEIGHT * shown.len() as u32);
    let cpu_panels = if options.per_cpu {
        picture.cpu_count()
    } else {
        1
    };
    let cell_rows = shown.len().div_ceil(CELL_COLUMNS) as u32;
    let height = TITLE_HEIGHT
        + gantt_height
        + CAPTION_HEIGHT
        + panel_height * (cpu_panels as u32 + 3)
        + BREAKDOWN_LEGEND_HEIGHT
        + CELL_HEIGHT * cell_rows;
    let mut markers = Markers::default();
    let mut text = String::new();
    {
        let root = SVGBackend::with_string(&mut text, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let (title, rest) = root.split_vertically(TITLE_HEIGHT);
        draw_title(&title, picture)?;
        let (gantt, rest) = rest.split_vertically(gantt_height);
        draw_gantt(&gantt, picture, &mut markers)?;
        let (caption, mut rest) = rest.split_vertically(CAPTION_HEIGHT);
        let note = if shown.len() < picture.workers.len() {
            format!(
                "Below: the {} busiest of {} workers by CPU time, one series each (--busiest N to change); the Gantt above shows all {}.",
                shown.len(),
                picture.workers.len(),
                picture.workers.len()
            )
        } else {
            format!(
                "Below: every worker ({}), one series each, on the same time axis as the Gantt.",
                shown.len()
            )
        };
        caption.draw_text(&note, &text_style(14), (12, 10))?;
        let x_range = picture.from_seconds..picture.to_seconds;
        for cpu in 0..cpu_panels {
            let (panel, below) = rest.split_vertically(panel_height);
            rest = below;
            let (title, panel_id) = if options.per_cpu {
                (
                    format!("CPU {cpu}: share of it each worker kept busy (cores)"),
                    format!("cpu{cpu}"),
                )
            } else {
                (
                    "CPU cores used by each worker (1.0 = one core busy all the time)".into(),
                    "cpu".into(),
                )
            };
            let lines = |worker: &WorkerSeries| {
                steps(
                    &worker.points,
                    picture.unrecorded_of(worker),
                    |point: &TickPoint| {
                        if options.per_cpu {
                            point.cores_per_cpu.get(cpu).copied().unwrap_or(0.0)
                        } else {
                            point.cores
                        }
                    },
                )
            };
            draw_lines(
                &panel,
                &LinePanel {
                    id: &panel_id,
                    title: &title,
                    y_desc: "cores",
                    log: false,
                    format: &|value| format!("{value:.2}"),
                    measured: picture.measured.cpu,
                },
                x_range.clone(),
                &shown,
                &lines,
                &mut markers,
            )?;
        }
        let (breakdown, below) =
            rest.split_vertically(BREAKDOWN_LEGEND_HEIGHT + CELL_HEIGHT * cell_rows);
        rest = below;
        draw_breakdown(
            &breakdown,
            picture,
            x_range.clone(),
            &shown,
            picture.measured.delays,
            &mut markers,
        )?;
        let rate_format = |value: f64| format!("{}/s", format_bytes(value));
        let (send, below) = rest.split_vertically(panel_height);
        draw_lines(
            &send,
            &LinePanel {
                id: "send",
                title: "Send rate: socket payload sent (bytes/s)",
                y_desc: "bytes/s",
                log: false,
                format: &rate_format,
                measured: picture.measured.net,
            },
            x_range.clone(),
            &shown,
            &|worker| {
                if picture.measured.net {
                    steps(&worker.points, picture.unrecorded_of(worker), |point| {
                        point.send_bytes_per_second
                    })
                } else {
                    Vec::new()
                }
            },
            &mut markers,
        )?;
        let (receive, memory) = below.split_vertically(panel_height);
        draw_lines(
            &receive,
            &LinePanel {
                id: "receive",
                title: "Receive rate: socket payload received (bytes/s)",
                y_desc: "bytes/s",
                log: false,
                format: &rate_format,
                measured: picture.measured.net,
            },
            x_range.clone(),
            &shown,
            &|worker| {
                if picture.measured.net {
                    steps(&worker.points, picture.unrecorded_of(worker), |point| {
                        point.receive_bytes_per_second
                    })
                } else {
                    Vec::new()
                }
            },
            &mut markers,
        )?;
        draw_lines(
            &memory,
            &LinePanel {
                id: "memory",
                title: "Memory in use at each tick's end (bytes, log scale)",
                y_desc: "bytes",
                log: true,
                format: &format_bytes,
                measured: true,
            },
            x_range,
            &shown,
            &|worker| memory_lines(&worker.points, picture.unrecorded_of(worker)),
            &mut markers,
        )?;
        root.present()?;
    }
    Ok(markers.apply(&text))
}

fn text_style(size: u32) -> TextStyle<'static> {
    (FONT, size).into_font().color(&BLACK)
}

/// `text`, cut to [`LABEL_CHARS`] keeping its end.
fn short(text: &str) -> String {
    let count = text.chars().count();
    if count <= LABEL_CHARS {
        return text.to_string();
    }
    let tail: String = text.chars().skip(count - (LABEL_CHARS - 1)).collect();
    format!("…{tail}")
}

fn draw_title(area: &Area, picture: &Picture) -> Drawn {
    let node = &picture.node;
    let bold = (FONT, 20).into_font().style(FontStyle::Bold).color(&BLACK);
    let several = picture.nodes.len() > 1;
    let title = if several {
        format!(
            "workerprobe recording of {} nodes ({}): {} workers",
            picture.nodes.len(),
            picture.node_names(),
            picture.workers.len()
        )
    } else {
        format!(
            "workerprobe recording of {}: {} workers",
            node.display_name(),
            picture.workers.len()
        )
    };
    area.draw_text(&title, &bold, (12, 8))?;
    let window = format!(
        "showing {}s to {}s; ticks of {}s.",
        format_seconds(picture.from_seconds),
        format_seconds(picture.to_seconds),
        format_seconds(picture.interval_seconds),
    );
    let facts = if several {
        // Beside the axis: how far each node's times may be off against the others'.
        let caveats = picture.clock_caveats();
        let clocks = if caveats.is_empty() {
            "every node's clock within a tick".to_owned()
        } else {
            format!("times may be off by: {}", caveats.join("; "))
        };
        format!(
            "Time 0 = {} (start of the first tick, each node's clock mapped to its wall clock); {window} Clocks: {clocks}.",
            picture.origin_time,
        )
    } else {
        format!(
            "kernel {}, {} CPUs ({}), {} memory. Time 0 = {} (start of the first tick, node monotonic clock); {window}",
            node.kernel,
            node.cpus,
            node.cpu_model,
            format_bytes(node.memory_bytes as f64),
            picture.origin_time,
        )
    };
    let facts = match picture.unrecorded_text() {
        Some(gaps) => format!("{facts} Not recorded (no agent ran; lines break there): {gaps}."),
        None => facts,
    };
    area.draw_text(&facts, &text_style(13), (12, 38))?;
    Ok(())
}

/// The Gantt shade of a worker that kept `fraction` of the node's CPUs busy (0..=1).
fn shade(fraction: f64) -> RGBColor {
    let t = if fraction.is_finite() {
        fraction.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let mix = |light: u8, dark: u8| {
        (f64::from(light) + (f64::from(dark) - f64::from(light)) * t).round() as u8
    };
    RGBColor(mix(0xd6, 0x08), mix(0xe6, 0x30), mix(0xf4, 0x6b))
}

fn draw_gantt(area: &Area, picture: &Picture, markers: &mut Markers) -> Drawn {
    let workers = &picture.workers;
    let rows = workers.len();
    let cpus = picture.cpu_count() as f64;
    let label_chars = workers
        .iter()
        .map(|worker| short(&worker.label).chars().count())
        .max()
        .unwrap_or(1);
    let (chart_area, legend) = area.split_horizontally(WIDTH - LEGEND_WIDTH);
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(
            "Worker lives: start to end, shaded by the average CPU cores used",
            (FONT, 16),
        )
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size((label_chars as u32 * 7 + 16).clamp(40, 320))
        .build_cartesian_2d(
            picture.from_seconds..picture.to_seconds,
            -0.5..(rows as f64 - 0.5),
        )?;
    let label_of_row = |y: &f64| {
        let row = y.round();
        if (y - row).abs() > 0.01 || row < 0.0 || row as usize >= rows {
            return String::new();
        }
        short(&workers[rows - 1 - row as usize].label)
    };
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("time since the first tick (s)")
        .x_labels(12)
        .y_labels(rows)
        .y_label_formatter(&label_of_row)
        .light_line_style(RGBColor(0xf4, 0xf4, 0xf4))
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .draw()?;
    for (row, worker) in workers.iter().enumerate() {
        let y = (rows - 1 - row) as f64;
        let cores = worker.average_cores();
        let (start, end) = (
            worker.start_seconds,
            worker.end_seconds.max(worker.start_seconds),
        );
        let ended = if worker.exit.is_some() {
            "ended"
        } else {
            "still running at the end"
        };
        markers.begin(
            area,
            "gantt-row",
            "gantt",
            worker,
            format!(
                "{}: {}s to {}s, {cores:.2} cores on average, {ended}",
                worker.label,
                format_seconds(start),
                format_seconds(end)
            ),
        )?;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(start, y - 0.38), (end, y + 0.38)],
            shade(cores / cpus).filled(),
        )))?;
        if worker.exit.is_some() {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(end, y - 0.45), (end, y + 0.45)],
                BLACK.stroke_width(2),
            )))?;
        }
        markers.end(area)?;
    }
    // Legend: the shade scale, and what the black end mark means.
    let (x, y) = (20, 50);
    legend.draw_text("average CPU cores used", &text_style(13), (x, y - 20))?;
    let steps_count = 10;
    for step in 0..steps_count {
        let x0 = x + step * 24;
        legend.draw(&Rectangle::new(
            [(x0, y), (x0 + 24, y + 14)],
            shade(f64::from(step) / f64::from(steps_count - 1)).filled(),
        ))?;
    }
    legend.draw_text("0", &text_style(12), (x, y + 18))?;
    legend.draw_text(
        &format!("{cpus:.0} (every CPU)"),
        &text_style(12),
        (x + 24 * steps_count - 60, y + 18),
    )?;
    legend.draw(&PathElement::new(
        vec![(x, y + 50), (x, y + 66)],
        BLACK.stroke_width(2),
    ))?;
    legend.draw_text(
        "worker ended (exit line)",
        &text_style(12),
        (x + 10, y + 52),
    )?;
    legend.draw_text(
        "no mark: still running at the end",
        &text_style(12),
        (x + 10, y + 70),
    )?;
    Ok(())
}

/// What a panel says of a figure the recording did not measure.
const NOT_MEASURED: &str = "not measured in this recording (--programs, or this kernel)";

/// What a panel of lines shows.
struct LinePanel<'a> {
    /// Names the panel in `data-panel`.
    id: &'a str,
    title: &'a str,
    y_desc: &'a str,
    /// Draw log2 of the values (memory spans orders of magnitude across workers) on an axis
    /// from [`log2_axis`]: ticks on powers of two, one beside every worker's line.
    log: bool,
    /// Formats an axis value (the value itself, not its log).
    format: &'a dyn Fn(f64) -> String,
    /// Whether the recording measured it; if not the panel says so and draws nothing.
    measured: bool,
}

/// One panel: a line (or several pieces of one) per worker, and a legend beside it.
fn draw_lines(
    area: &Area,
    panel: &LinePanel,
    x_range: std::ops::Range<f64>,
    shown: &[&WorkerSeries],
    lines_of: &LinesOf<'_>,
    markers: &mut Markers,
) -> Drawn {
    let transform = |value: f64| {
        if panel.log {
            value.max(1.0).log2()
        } else {
            value
        }
    };
    let lines: Vec<Vec<Vec<(f64, f64)>>> = shown
        .iter()
        .map(|worker| {
            lines_of(worker)
                .into_iter()
                .map(|line| line.into_iter().map(|(x, y)| (x, transform(y))).collect())
                .collect()
        })
        .collect();
    let high = lines
        .iter()
        .flatten()
        .flatten()
        .map(|&(_, y)| y)
        .fold(f64::NEG_INFINITY, f64::max);
    let nothing = !high.is_finite() || (!panel.log && high <= 0.0);
    let title = if !panel.measured {
        format!("{}: {NOT_MEASURED}", panel.title)
    } else if nothing {
        format!("{}: none recorded", panel.title)
    } else {
        panel.title.to_string()
    };
    let (chart_area, legend) = area.split_horizontally(WIDTH - LEGEND_WIDTH);
    let y_axis = if panel.log {
        let spans: Vec<(f64, f64)> = lines
            .iter()
            .filter_map(|pieces| {
                let values = pieces.iter().flatten().map(|&(_, y)| y);
                let (low, peak) = values.fold(
                    (f64::INFINITY, f64::NEG_INFINITY),
                    |(lowest, highest), y| (lowest.min(y), highest.max(y)),
                );
                peak.is_finite().then_some((low, peak))
            })
            .collect();
        let plot_height_px = f64::from(
            chart_area
                .dim_in_pixel()
                .1
                .saturating_sub(CHART_CHROME_HEIGHT),
        );
        let axis = log2_axis(&spans, plot_height_px);
        YAxis {
            scale: axis.range.clone().into(),
            log2: Some(axis),
        }
    } else {
        let top = if high.is_finite() && high > 0.0 {
            high * 1.1
        } else {
            1.0
        };
        YAxis {
            scale: (0.0..top).into(),
            log2: None,
        }
    };
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(title, (FONT, 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(90)
        .build_cartesian_2d(x_range, y_axis)?;
    let label = |y: &f64| (panel.format)(if panel.log { 2f64.powf(*y) } else { *y });
    chart
        .configure_mesh()
        .x_desc("time since the first tick (s)")
        .y_desc(panel.y_desc)
        .x_labels(12)
        .y_labels(6)
        .y_label_formatter(&label)
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 13))
        .light_line_style(RGBColor(0xee, 0xee, 0xee))
        .draw()?;
    for (rank, (worker, pieces)) in shown.iter().zip(&lines).enumerate() {
        let color = PALETTE[rank % PALETTE.len()];
        markers.begin(area, "series", panel.id, worker, worker.label.clone())?;
        for piece in pieces {
            chart.draw_series(LineSeries::new(
                piece.iter().copied(),
                color.stroke_width(2),
            ))?;
        }
        markers.end(area)?;
        let y = 40 + LEGEND_ROW_HEIGHT as i32 * rank as i32;
        legend.draw(&PathElement::new(
            vec![(10, y), (34, y)],
            color.stroke_width(3),
        ))?;
        legend.draw_text(&short(&worker.label), &text_style(12), (40, y - 7))?;
    }
    Ok(())
}

/// How much shorter a line panel's plot is than its area: caption, margins and the time
/// axis's labels (measured on the SVG plotters draws; it only spaces the log axis's labels,
/// so a few pixels off do no harm).
const CHART_CHROME_HEIGHT: u32 = 83;
/// Axis labels closer than this would touch.
const AXIS_LABEL_GAP_PX: f64 = 16.0;
/// Light grid lines closer than this would grey the plot over.
const GRID_LINE_GAP_PX: f64 = 4.0;
/// A worker's low gets a tick of its own when it is more than this many doublings below its
/// peak.
const LOW_TICK_DOUBLINGS: f64 = 2.0;
/// At most this many evenly spaced ticks fill a log axis where no worker is.
const LOG_AXIS_EVEN_TICKS: f64 = 6.0;

/// A log2 axis: range, labelled ticks and light grid lines, all in log2 of the value.
#[derive(Debug, PartialEq)]
struct Log2Axis {
    range: std::ops::Range<f64>,
    ticks: Vec<f64>,
    doublings: Vec<f64>,
}

/// A line panel's y axis: plotters' linear scale, with a log panel's own ticks.
struct YAxis {
    scale: RangedCoordf64,
    /// A log panel's ticks and grid; plotters picks a linear panel's.
    log2: Option<Log2Axis>,
}

impl Ranged for YAxis {
    // Labels come from each panel's own formatter.
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.scale.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        match &self.log2 {
            None => self.scale.key_points(hint),
            Some(axis) if hint.weight().allow_light_points() => axis.doublings.clone(),
            Some(axis) => axis.ticks.clone(),
        }
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.scale.range()
    }
}

/// A log2 axis for workers whose lines span `spans` (low, peak; log2 of the values, busiest
/// worker first) on a plot `plot_height_px` tall, labelling every worker's range: each peak,
/// and each low more than [`LOW_TICK_DOUBLINGS`] below it, gets a tick on the power of two
/// nearest it (within √2), or on its other neighbour (within 2×) when a tick too close to
/// label beside it took the nearest. Evenly spaced whole doublings fill the rest. Powers of
/// two read as whole IEC units (1 MiB, 16 MiB, 4 GiB), and a nice step of doublings (1, 2, 5,
/// 10) keeps even ticks on them.
fn log2_axis(spans: &[(f64, f64)], plot_height_px: f64) -> Log2Axis {
    let (low, high) = spans.iter().fold(
        (f64::INFINITY, f64::NEG_INFINITY),
        |(lowest, highest), &(low, peak)| (lowest.min(low), highest.max(peak)),
    );
    if !low.is_finite() {
        return Log2Axis {
            range: 0.0..1.0,
            ticks: Vec::new(),
            doublings: Vec::new(),
        };
    }
    let wanted: Vec<f64> = spans
        .iter()
        .map(|&(_, peak)| peak)
        .chain(
            spans
                .iter()
                .filter(|(low, peak)| peak - low > LOW_TICK_DOUBLINGS)
                .map(|&(low, _)| low),
        )
        .collect();
    // A third of a doubling of room above and below (a doubling each way for one flat line),
    // and room for the power of two nearest every wanted value.
    let room = if high > low { 0.33 } else { 1.0 };
    let (mut start, mut end) = wanted
        .iter()
        .fold((low - room, high + room), |(start, end), value| {
            (start.min(value.round()), end.max(value.round()))
        });
    if end.floor() - start.ceil() < 1.0 {
        // One power of two alone gives no scale: reach the ones around the lines.
        (start, end) = (start.min(low.floor()), end.max(high.ceil()));
    }
    let doubling_px = plot_height_px / (end - start);
    let gap_doublings = (AXIS_LABEL_GAP_PX / doubling_px).ceil().max(1.0);
    let free = |ticks: &[f64], tick: f64| {
        (start..=end).contains(&tick)
            && ticks
                .iter()
                .all(|taken| (taken - tick).abs() >= gap_doublings)
    };
    let mut ticks: Vec<f64> = Vec::new();
    for value in wanted {
        let nearest = value.round();
        let other = if nearest <= value {
            nearest + 1.0
        } else {
            nearest - 1.0
        };
        if ticks.contains(&nearest) || ticks.contains(&other) {
            continue;
        }
        // When neither is free, a tick within `gap_doublings` already labels this value.
        if let Some(tick) = [nearest, other]
            .into_iter()
            .find(|&tick| free(&ticks, tick))
        {
            ticks.push(tick);
        }
    }
    let span = end - start;
    let even_step = [1.0, 2.0, 5.0, 10.0, 20.0]
        .into_iter()
        .find(|&step| step >= gap_doublings && span / step <= LOG_AXIS_EVEN_TICKS)
        .unwrap_or_else(|| (span / LOG_AXIS_EVEN_TICKS).ceil().max(gap_doublings));
    let mut tick = (start / even_step).ceil() * even_step;
    while tick <= end {
        if free(&ticks, tick) {
            ticks.push(tick);
        }
        tick += even_step;
    }
    ticks.sort_by(f64::total_cmp);
    let grid_step = (GRID_LINE_GAP_PX / doubling_px).ceil().max(1.0);
    let mut doublings = Vec::new();
    let mut doubling = (start / grid_step).ceil() * grid_step;
    while doubling <= end {
        doublings.push(doubling);
        doubling += grid_step;
    }
    Log2Axis {
        range: start..end,
        ticks,
        doublings,
    }
}

/// Small stacked charts, one per worker: the share of its thread time on CPU, waiting for
/// a CPU, blocked on I/O and asleep, tick by tick.
fn draw_breakdown(
    area: &Area,
    picture: &Picture,
    x_range: std::ops::Range<f64>,
    shown: &[&WorkerSeries],
    measured: bool,
    markers: &mut Markers,
) -> Drawn {
    let (legend, grid) = area.split_vertically(BREAKDOWN_LEGEND_HEIGHT);
    if !measured {
        legend.draw_text(
            &format!("Where each worker's thread time went: {NOT_MEASURED}"),
            &(FONT, 16).into_font().color(&BLACK),
            (12, 12),
        )?;
        return Ok(());
    }
    legend.draw_text(
        "Where each worker's thread time went (off CPU: what it waited on), % per tick:",
        &(FONT, 16).into_font().color(&BLACK),
        (12, 12),
    )?;
    let mut x = 640;
    for (name, color) in BREAKDOWN {
        legend.draw(&Rectangle::new([(x, 12), (x + 16, 28)], color.filled()))?;
        legend.draw_text(name, &text_style(13), (x + 22, 13))?;
        x += 30 + 8 * name.len() as i32;
    }
    let rows = shown.len().div_ceil(CELL_COLUMNS);
    let cells = grid.split_evenly((rows.max(1), CELL_COLUMNS));
    for (cell, worker) in cells.iter().zip(shown) {
        let mut chart = ChartBuilder::on(cell)
            .caption(short(&worker.label), (FONT, 13))
            .margin(8)
            .x_label_area_size(28)
            .y_label_area_size(44)
            .build_cartesian_2d(x_range.clone(), 0.0..100.0)?;
        chart
            .configure_mesh()
            .x_labels(6)
            .y_labels(5)
            .y_desc("%")
            .y_label_formatter(&|y| format!("{y:.0}%"))
            .label_style((FONT, 11))
            .light_line_style(RGBColor(0xf2, 0xf2, 0xf2))
            .draw()?;
        markers.begin(
            cell,
            "series",
            "time-breakdown",
            worker,
            worker.label.clone(),
        )?;
        // Each layer is drawn from 0 up to its cumulative top, top layer first, so the
        // next one down paints over its lower part: a stack without a stacked series type.
        let layer = |p: &TickPoint, index: usize| match index {
            0 => p.on_cpu_share,
            1 => p.runqueue_wait_share,
            reason => p.wait_shares[reason - 2],
        };
        for (index, (_, color)) in BREAKDOWN.iter().enumerate().rev() {
            let lines = steps(&worker.points, picture.unrecorded_of(worker), |point| {
                (0..=index).map(|i| layer(point, i)).sum::<f64>() * 100.0
            });
            for line in lines {
                chart.draw_series(AreaSeries::new(line, 0.0, color.filled()))?;
            }
        }
        markers.end(cell)?;
    }
    Ok(())
}

/// The groups to wrap around series, by the marker texts drawn before and after them.
#[derive(Default)]
struct Markers {
    /// Opening tag of each group, by index.
    groups: Vec<String>,
}

impl Markers {
    /// Starts the group of `worker`'s drawing in panel `panel`; `title` is its tooltip.
    fn begin(
        &mut self,
        area: &Area,
        class: &str,
        panel: &str,
        worker: &WorkerSeries,
        title: String,
    ) -> Drawn {
        let index = self.groups.len();
        self.groups.push(format!(
            r#"<g class="{class}" data-panel="{}" data-worker="{}"><title>{}</title>"#,
            escape_xml(panel),
            escape_xml(&worker.path),
            escape_xml(&title)
        ));
        area.draw_text(&format!("{MARK}begin:{index}"), &text_style(1), (0, 0))?;
        Ok(())
    }

    /// Ends the group begun last.
    fn end(&mut self, area: &Area) -> Drawn {
        area.draw_text(&format!("{MARK}end"), &text_style(1), (0, 0))?;
        Ok(())
    }

    /// `svg` with every marker `<text>` element replaced by its group tag.
    fn apply(&self, svg: &str) -> String {
        let mut out = String::with_capacity(svg.len() + self.groups.len() * 120);
        let mut rest = svg;
        while let Some(open) = rest.find("<text") {
            let Some(close) = rest[open..].find("</text>").map(|at| open + at) else {
                break;
            };
            let element_end = close + "</text>".len();
            let content_start = rest[open..close]
                .find('>')
                .map_or(close, |at| open + at + 1);
            let content = rest[content_start..close].trim();
            let replacement = content.strip_prefix(MARK).and_then(|mark| {
                if mark == "end" {
                    Some("</g>")
                } else {
                    let index: usize = mark.strip_prefix("begin:")?.parse().ok()?;
                    self.groups.get(index).map(String::as_str)
                }
            });
            match replacement {
                Some(tag) => {
                    out.push_str(rest[..open].trim_end_matches([' ', '\n']));
                    out.push('\n');
                    out.push_str(tag);
                }
                None => out.push_str(&rest[..element_end]),
            }
            rest = &rest[element_end..];
        }
        out.push_str(rest);
        out
    }
}

/// `text` safe in XML content and attribute values.
pub fn escape_xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Control characters are not allowed in XML 1.0 at all.
            c if c.is_control() && !matches!(c, '\n' | '\t') => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::picture::series::{build, tests as data};

    fn svg_of(busiest: usize, per_cpu: bool) -> String {
        let picture = build(&data::sample(), &data::everything(), "r").expect("builds");
        render(&picture, &SvgOptions { busiest, per_cpu }).expect("draws")
    }

    fn count(svg: &str, needle: &str) -> usize {
        svg.matches(needle).count()
    }

    #[test]
    fn every_worker_has_one_series_per_panel() {
        let svg = svg_of(usize::from(DEFAULT_BUSIEST), false);
        assert!(svg.starts_with("<svg"), "{}", &svg[..100]);
        assert!(!svg.contains(MARK), "a marker was left");
        assert_eq!(count(&svg, "<g "), count(&svg, "</g>"));
        for worker in ["/w1", "/w2", "/w3"] {
            let mark = format!(r#"data-worker="{worker}""#);
            assert_eq!(
                count(
                    &svg,
                    &format!(r#"class="gantt-row" data-panel="gantt" {mark}"#)
                ),
                1
            );
            for panel in ["cpu", "time-breakdown", "send", "receive", "memory"] {
                let series = format!(r#"class="series" data-panel="{panel}" {mark}"#);
                assert_eq!(count(&svg, &series), 1, "{worker} in {panel}");
            }
        }
        for text in [
            "cores",
            "bytes/s",
            "time since the first tick (s)",
            "w1",
            "network",
        ] {
            assert!(svg.contains(text), "{text}");
        }
    }

    #[test]
    fn busiest_limits_the_series_and_per_cpu_splits_cpu() {
        let svg = svg_of(1, true);
        assert_eq!(count(&svg, r#"class="gantt-row""#), 3);
        assert_eq!(count(&svg, r#"data-panel="send""#), 1);
        assert_eq!(count(&svg, r#"data-panel="cpu0""#), 1);
        assert_eq!(count(&svg, r#"data-panel="cpu1""#), 1);
        assert!(svg.contains("the 1 busiest of 3 workers"));
    }

    #[test]
    fn names_are_escaped_and_shortened() {
        assert_eq!(
            escape_xml("a<b>&\"c'\u{1}"),
            "a&lt;b&gt;&amp;&quot;c&apos;\u{FFFD}"
        );
        let long = "x".repeat(50) + "tail";
        let cut = short(&long);
        assert_eq!(cut.chars().count(), LABEL_CHARS);
        assert!(cut.starts_with('…') && cut.ends_with("tail"));
    }

    const MIB: f64 = 1024.0 * 1024.0;

    /// A recording's three workers over six ticks, the memory of worker `/w{n}` going
    /// round `readings[n - 1]` (bytes) tick by tick, and its rendered SVG.
    fn svg_with_memory(readings: [&[f64]; 3]) -> (Picture, String) {
        let mut lines = vec![data::header()];
        for tick in 1..=6 {
            for id in 1..=3 {
                lines.push(data::tick(tick, id, tick, 0.1 * id as f64, 0));
            }
        }
        let mut picture =
            build(&data::recording(&lines), &data::everything(), "r").expect("builds");
        for (worker, readings) in picture.workers.iter_mut().zip(readings) {
            for (point, &bytes) in worker.points.iter_mut().zip(readings.iter().cycle()) {
                point.memory_bytes = Some(bytes as u64);
            }
        }
        let svg = render(
            &picture,
            &SvgOptions {
                busiest: 3,
                per_cpu: false,
            },
        )
        .expect("draws");
        (picture, svg)
    }

    /// `16 MiB`, `3.5 GiB`, `512 B` as bytes; `None` for any other text.
    fn parse_iec_bytes(text: &str) -> Option<f64> {
        const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
        let (number, unit) = text.trim().split_once(' ')?;
        let power = UNITS.iter().position(|known| *known == unit)?;
        Some(number.parse::<f64>().ok()? * 1024f64.powi(power as i32))
    }

    /// The value of attribute `name` in the start tag `tag`.
    fn attribute<'s>(tag: &'s str, name: &str) -> Option<&'s str> {
        let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
        tag[start..].split('"').next()
    }

    /// Every text of `panel_svg` that names bytes, as (bytes, y in pixels).
    fn byte_labels(panel_svg: &str) -> Vec<(f64, f64)> {
        panel_svg
            .split("<text")
            .skip(1)
            .filter_map(|element| {
                let (tag, rest) = element.split_once('>')?;
                let content = rest.split("</text>").next()?;
                let y = attribute(tag, "y")?.parse().ok()?;
                Some((parse_iec_bytes(content)?, y))
            })
            .collect()
    }

    /// The lowest and highest y in pixels of `worker`'s line in `panel_svg`.
    fn line_extent_px(panel_svg: &str, worker: &str) -> (f64, f64) {
        let open = format!(r#"class="series" data-panel="memory" data-worker="{worker}""#);
        let group = panel_svg
            .split(&open)
            .nth(1)
            .and_then(|rest| rest.split("</g>").next())
            .unwrap_or_else(|| panic!("no memory series of {worker}"));
        let ys: Vec<f64> = group
            .split(" points=\"")
            .skip(1)
            .flat_map(|points| points.split('"').next().unwrap_or("").split_whitespace())
            .filter_map(|point| point.split_once(',')?.1.parse().ok())
            .collect();
        assert!(!ys.is_empty(), "{worker}'s memory line has no points");
        ys.iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(top, bottom), &y| {
                (top.min(y), bottom.max(y))
            })
    }

    #[test]
    fn memory_axis_labels_every_workers_range() {
        // 14 MiB (from 64 KiB), 300 MiB and 3 GiB: plotters' evenly spaced log ticks (1 MiB,
        // 32 MiB, 1 GiB) left all three without a label within 2× of their peaks.
        let small: &[f64] = &[0.0625 * MIB, 12.0 * MIB, 13.0 * MIB, 14.0 * MIB];
        let middle: &[f64] = &[280.0 * MIB, 290.0 * MIB, 300.0 * MIB];
        let large: &[f64] = &[2560.0 * MIB, 2900.0 * MIB, 3072.0 * MIB];
        let (picture, svg) = svg_with_memory([small, middle, large]);
        let panel = svg
            .split("Memory in use at each tick")
            .nth(1)
            .expect("a memory panel");
        let labels = byte_labels(panel);
        // The axis: pixels per doubling, from its outermost labels.
        assert!(labels.len() >= 2, "{labels:?}");
        let (first, last) = (labels[0], labels[labels.len() - 1]);
        let doubling_px = ((first.1 - last.1) / (last.0 / first.0).log2()).abs();
        assert!(doubling_px > 2.0, "{labels:?}");
        for worker in &picture.workers {
            let peak = worker
                .points
                .iter()
                .filter_map(|point| point.memory_bytes)
                .max()
                .expect("readings") as f64;
            let (top_px, bottom_px) = line_extent_px(panel, &worker.path);
            let labelled = labels.iter().any(|&(bytes, y)| {
                (peak / 2.0..=peak * 2.0).contains(&bytes)
                    && (top_px - doubling_px..=bottom_px + doubling_px).contains(&y)
            });
            assert!(
                labelled,
                "{} (peak {}, drawn at y {top_px}..{bottom_px}) has no label within 2× beside \
                 its line: {labels:?}",
                worker.path,
                format_bytes(peak)
            );
        }
    }

    #[test]
    fn log2_ticks_sit_beside_every_peak_and_far_low() {
        let log2 = |mib: f64| (mib * MIB).log2();
        // (low, peak): a worker from 64 KiB to 14 MiB, two close together, one of GiB.
        let spans = [
            (log2(3072.0), log2(3072.0)),
            (log2(0.0625), log2(14.0)),
            (log2(11.5), log2(11.5)),
            (log2(22.0), log2(22.0)),
            (log2(300.0), log2(300.0)),
        ];
        for plot_height_px in [80.0, 197.0, 600.0] {
            let axis = log2_axis(&spans, plot_height_px);
            let doubling_px = plot_height_px / (axis.range.end - axis.range.start);
            for pair in axis.ticks.windows(2) {
                assert!(
                    (pair[1] - pair[0]) * doubling_px >= AXIS_LABEL_GAP_PX,
                    "labels touch at {plot_height_px} px: {axis:?}"
                );
            }
            for tick in &axis.ticks {
                assert_eq!(tick.fract(), 0.0, "{tick} is not a power of two");
                assert!(
                    (axis.range.start..=axis.range.end).contains(tick),
                    "{axis:?}"
                );
            }
            // Every peak, and the far low, within a doubling (2×) of a tick, unless the
            // plot is too short for a label per doubling.
            let within = if doubling_px >= AXIS_LABEL_GAP_PX {
                1.0
            } else {
                (AXIS_LABEL_GAP_PX / doubling_px).ceil()
            };
            for value in spans.iter().map(|&(_, peak)| peak).chain([log2(0.0625)]) {
                assert!(
                    axis.ticks.iter().any(|tick| (tick - value).abs() <= within),
                    "{value} unlabelled at {plot_height_px} px: {axis:?}"
                );
            }
        }
        // Lines within one doubling still get a power of two on either side.
        let narrow = log2_axis(&[(log2(11.5), log2(11.5)), (log2(22.0), log2(22.0))], 197.0);
        assert_eq!(
            narrow.ticks,
            [log2(8.0), log2(16.0), log2(32.0)],
            "{narrow:?}"
        );
        // No worker: an empty axis, not a panic.
        assert!(log2_axis(&[], 197.0).ticks.is_empty());
    }

    #[test]
    fn shades_run_from_light_to_dark() {
        assert_eq!(shade(0.0), RGBColor(0xd6, 0xe6, 0xf4));
        assert_eq!(shade(1.0), RGBColor(0x08, 0x30, 0x6b));
        assert_eq!(shade(f64::NAN), shade(0.0));
        assert_eq!(shade(7.0), shade(1.0));
    }
}
