//! `replay --at`: what a user may write for a time in a recording, and which tick it picks.
//!
//! A time is either an offset from the start of the recording's first tick (`30s`, `2m`,
//! `1.5`, plain numbers being seconds) or an RFC 3339 wall time (`2026-11-29T17:12:04Z`,
//! `2026-11-29T18:12:04.5+01:00`). Both are resolved on the wall clock, which every tick
//! carries, so they agree across several runs appended to one file.

use std::time::{Duration, UNIX_EPOCH};

use super::reader::{Segment, Tick};
use crate::clock::rfc3339_from_unix_ns;

/// A time in a recording, as the user wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// This long after the start of the first tick.
    FromStart(Duration),
    /// This wall time, ns since the Unix epoch.
    Wall {
        /// ns since the Unix epoch.
        unix_ns: u64,
    },
}

/// A `--from`/`--to` value: seconds from the start (`30s`, `2m`, `45`) or an RFC 3339 time,
/// as `replay --at` reads it; the error is one sentence (clap names the flag).
pub fn parse_time(text: &str) -> Result<At, String> {
    parse_at(text).map_err(|message| {
        message
            .strip_prefix("--at ")
            .map_or(message.clone(), str::to_string)
    })
}

/// Parses an `--at` value; the error is one sentence naming the flag.
pub fn parse_at(text: &str) -> Result<At, String> {
    let text = text.trim();
    let wrong = || {
        format!(
            "--at `{text}` is not a time: give seconds from the start of the recording like 30s, 2m or 45, or an RFC 3339 time like 2026-11-29T17:12:04Z"
        )
    };
    if let Ok(seconds) = text.parse::<f64>() {
        if !seconds.is_finite() || seconds < 0.0 {
            return Err(wrong());
        }
        return Duration::try_from_secs_f64(seconds)
            .map(At::FromStart)
            .map_err(|_| wrong());
    }
    if looks_like_a_date(text) {
        return parse_rfc3339_ns(text)
            .map(|unix_ns| At::Wall { unix_ns })
            .ok_or_else(wrong);
    }
    humantime::parse_duration(text)
        .map(At::FromStart)
        .map_err(|_| wrong())
}

fn looks_like_a_date(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() >= 10 && bytes[..4].iter().all(u8::is_ascii_digit) && bytes[4] == b'-'
}

/// RFC 3339 to ns since the Unix epoch, with any UTC offset.
fn parse_rfc3339_ns(text: &str) -> Option<u64> {
    // humantime reads UTC only: take a numeric offset off and apply it ourselves.
    let (local, offset_seconds) = split_offset(text)?;
    let local = humantime::parse_rfc3339_weak(&format!("{local}Z")).ok()?;
    let local_ns = i128::try_from(local.duration_since(UNIX_EPOCH).ok()?.as_nanos()).ok()?;
    u64::try_from(local_ns - i128::from(offset_seconds) * 1_000_000_000).ok()
}

/// Splits `…Z` or `…±HH:MM` into the local part and the offset east of UTC, in seconds.
fn split_offset(text: &str) -> Option<(&str, i64)> {
    if let Some(local) = text.strip_suffix(['Z', 'z']) {
        return Some((local, 0));
    }
    let split = text.len().checked_sub(6)?;
    if !text.is_char_boundary(split) {
        return None;
    }
    let (local, offset) = text.split_at(split);
    if !offset.is_ascii() {
        return None;
    }
    let bytes = offset.as_bytes();
    let sign = match bytes[0] {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    if bytes[3] != b':' {
        return None;
    }
    let hours: i64 = offset[1..3].parse().ok()?;
    let minutes: i64 = offset[4..6].parse().ok()?;
    if hours > 23 || minutes > 59 || !offset[1..3].bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((local, sign * (hours * 3600 + minutes * 60)))
}

/// The tick shown for `at`: the first whose end is at or after it (the tick covering it, or
/// the next one when no worker was active then). A time outside the recording is refused
/// with one sentence giving the recording's range.
pub fn find_tick(ticks: &[(&Segment, &Tick)], at: At, text: &str) -> Result<usize, String> {
    let (Some((_, first)), Some((_, last))) = (ticks.first(), ticks.last()) else {
        return Err("the recording holds no ticks".into());
    };
    let origin_ns = first.start.wall_unix_ns;
    let end_ns = ticks
        .iter()
        .map(|(_, tick)| tick.end.wall_unix_ns)
        .max()
        .unwrap_or(last.end.wall_unix_ns);
    let target_ns = match at {
        At::FromStart(offset) => {
            origin_ns.saturating_add(u64::try_from(offset.as_nanos()).unwrap_or(u64::MAX))
        }
        At::Wall { unix_ns } => unix_ns,
    };
    if target_ns < origin_ns || target_ns > end_ns {
        return Err(format!(
            "--at {text} is outside the recording, which runs from {} to {} (0s to {:.1}s from its start)",
            rfc3339_from_unix_ns(origin_ns),
            rfc3339_from_unix_ns(end_ns),
            (end_ns - origin_ns) as f64 / 1e9
        ));
    }
    Ok(ticks
        .iter()
        .position(|(_, tick)| tick.end.wall_unix_ns >= target_ns)
        .unwrap_or(ticks.len() - 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::line::Moment;

    #[test]
    fn times_read_as_replay_at_does_with_a_flagless_message() {
        assert_eq!(
            parse_time("2m"),
            Ok(At::FromStart(Duration::from_secs(120)))
        );
        let message = parse_time("soon").expect_err("not a time");
        assert!(message.starts_with("`soon` is not a time"), "{message}");
    }

    #[test]
    fn offsets_and_times_parse() {
        assert_eq!(parse_at("30s"), Ok(At::FromStart(Duration::from_secs(30))));
        assert_eq!(parse_at("2m"), Ok(At::FromStart(Duration::from_secs(120))));
        assert_eq!(parse_at("30"), Ok(At::FromStart(Duration::from_secs(30))));
        assert_eq!(parse_at("0"), Ok(At::FromStart(Duration::ZERO)));
        assert_eq!(
            parse_at("1.5"),
            Ok(At::FromStart(Duration::from_millis(1500)))
        );
        assert_eq!(
            parse_at("1970-01-01T00:00:01Z"),
            Ok(At::Wall {
                unix_ns: 1_000_000_000
            })
        );
        assert_eq!(
            parse_at("1970-01-01T01:00:01.5+01:00"),
            Ok(At::Wall {
                unix_ns: 1_500_000_000
            })
        );
        assert_eq!(
            parse_at("1970-01-01T00:00:01-00:30"),
            Ok(At::Wall {
                unix_ns: 1_801_000_000_000
            })
        );
        for wrong in [
            "",
            "soon",
            "-5",
            "NaN",
            "inf",
            "2026-13-01T00:00:00Z",
            "2026-01-01",
            "2026-01-01T00:00:00+25:00",
            "2026-01-01T00:00:00+1é:00",
        ] {
            let message = parse_at(wrong).expect_err(wrong);
            assert!(message.starts_with("--at `"), "{message}");
        }
    }

    fn tick(start_s: u64, end_s: u64) -> Tick {
        let moment = |s: u64| Moment {
            monotonic_ns: s * 1_000_000_000,
            wall_unix_ns: s * 1_000_000_000,
            time: String::new(),
        };
        Tick {
            measured: Default::default(),
            number: end_s,
            start: moment(start_s),
            end: moment(end_s),
            workers: Vec::new(),
        }
    }

    #[test]
    fn the_covering_or_next_tick_is_found() {
        let segment = Segment {
            header: serde_json::from_str(concat!(
                r#"{"schema_version":1,"format":"workerprobe-recording","agent_version":"0","#,
                r#""node":{"hostname":"h","kernel":"k","cpus":1,"cpu_model":"m","memory_bytes":1,"boot_time_epoch_secs":0},"#,
                r#""started":{"monotonic_ns":0,"wall_unix_ns":0,"time":""},"#,
                r#""run_started":{"monotonic_ns":0,"wall_unix_ns":0,"time":""},"#,
                r#""part":0,"interval_seconds":1.0,"worker_patterns":[],"programs":[]}"#
            ))
            .expect("header"),
            ticks: Vec::new(),
            exits: Vec::new(),
            clocks: Vec::new(),
        };
        let ticks = [tick(100, 101), tick(101, 102), tick(105, 106)];
        let list: Vec<(&Segment, &Tick)> = ticks.iter().map(|t| (&segment, t)).collect();
        let find = |at: At| find_tick(&list, at, "x");
        assert_eq!(find(At::FromStart(Duration::ZERO)), Ok(0));
        assert_eq!(find(At::FromStart(Duration::from_millis(1500))), Ok(1));
        assert_eq!(find(At::FromStart(Duration::from_secs(3))), Ok(2));
        assert_eq!(
            find(At::Wall {
                unix_ns: 106_000_000_000
            }),
            Ok(2)
        );
        let outside = find(At::FromStart(Duration::from_secs(7))).expect_err("outside");
        assert!(
            outside.contains("outside the recording, which runs from"),
            "{outside}"
        );
        assert!(outside.contains("0s to 6.0s"), "{outside}");
        assert!(find(At::Wall { unix_ns: 5 }).is_err());
    }
}
