//! Pictures of a recording: `workerprobe plot` (SVG), `trace` (Chrome / Perfetto trace-event
//! JSON) and `report` (one self-contained HTML page).
//!
//! Data flows one way: the recording's reader → [`series::build`], a pure model of series
//! per worker on the node's clock → one sink per format ([`svg`], [`trace`], [`html`]).
//! Nothing here reads files or the kernel; `app::{plot, trace, report}` do the I/O.

pub mod html;
pub mod series;
pub mod svg;
pub mod trace;

/// Bytes for a person, in IEC units (powers of 1024) as every text of workerprobe writes them,
/// so a log axis on powers of two reads 1 MiB, 4 MiB, 16 MiB: `512 B`, `0.5 B`, `1.5 KiB`,
/// `25.0 MiB`, `1 GiB`.
pub fn format_bytes(bytes: f64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    if !bytes.is_finite() {
        return "-".into();
    }
    let mut value = bytes;
    let mut unit = 0;
    while value.abs() >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value == value.round() {
        format!("{value:.0} {}", UNITS[unit])
    } else if value.abs() < 10.0 {
        // Small values keep two digits (axis steps of 0.2 B/s stay apart).
        let text = format!("{value:.2}");
        format!(
            "{} {}",
            text.trim_end_matches('0').trim_end_matches('.'),
            UNITS[unit]
        )
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Seconds for a label: at most 3 decimals, trailing zeros dropped (`1.5`, `0.2`, `12`).
pub fn format_seconds(seconds: f64) -> String {
    let text = format!("{seconds:.3}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    if text == "-0" {
        "0".into()
    } else {
        text.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_and_seconds_read_well() {
        assert_eq!(format_bytes(0.0), "0 B");
        assert_eq!(format_bytes(512.0), "512 B");
        assert_eq!(format_bytes(0.4), "0.4 B");
        assert_eq!(format_bytes(1536.0), "1.5 KiB");
        assert_eq!(format_bytes(1048576.0), "1 MiB");
        assert_eq!(format_bytes(25.04 * 1048576.0), "25.0 MiB");
        assert_eq!(format_bytes(3.16 * 1048576.0), "3.16 MiB");
        assert_eq!(format_bytes(4096.0), "4 KiB");
        assert_eq!(format_bytes(16.0 * 1048576.0), "16 MiB");
        assert_eq!(format_bytes(4000.0), "3.91 KiB");
        assert_eq!(format_bytes(f64::NAN), "-");
        assert_eq!(format_seconds(1.5), "1.5");
        assert_eq!(format_seconds(12.0), "12");
        assert_eq!(format_seconds(0.2004), "0.2");
        assert_eq!(format_seconds(-0.0001), "0");
    }
}
