//! Writing a recording: appending whole ticks to a file, syncing, and rotating by size.
//!
//! Durability: a tick's lines are encoded into one buffer and written with one `write_all`
//! on a file opened in append mode, so they reach the page cache together and a killed agent
//! loses at most the tick it was writing. The data is synced to disk (`fdatasync`) at most
//! once a second and when the recording ends, which bounds a power loss to about a second.
//! The kernel may stop a write of several pages at a page boundary when the process is
//! killed (SIGKILL), so the last line of a killed recording can in rare cases be cut short:
//! the reader skips such a line, and the next run appended to the file starts on a new line.

use std::{
    fs::{File, OpenOptions},
    io::{Read as _, Seek as _, SeekFrom, Write as _},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::Context as _;

use super::line::{HeaderLine, Line, Moment};
use crate::clock::Timestamp;

/// How often, at most, written data is synced to disk.
const SYNC_EVERY: Duration = Duration::from_secs(1);

/// Appends ticks to a recording file, rotating it when it grows past a size.
pub struct RecordingWriter {
    path: PathBuf,
    file: File,
    /// Bytes in the current file.
    size_bytes: u64,
    /// Rotate once the file holds at least this many bytes.
    rotate_bytes: Option<u64>,
    /// The header of the run, re-stamped for each new file.
    header: Option<HeaderLine>,
    /// The file's last byte is not a newline (a line cut short by a crash).
    needs_newline: bool,
    last_sync: Instant,
}

impl RecordingWriter {
    /// Opens `path` for appending (made if missing) without writing anything yet, so a path
    /// that cannot be written is found before the programs are loaded.
    pub fn open(path: &Path, rotate_bytes: Option<u64>) -> anyhow::Result<Self> {
        let file = open_append(path)?;
        let mut writer = Self {
            path: path.to_path_buf(),
            file,
            size_bytes: 0,
            rotate_bytes,
            header: None,
            needs_newline: false,
            last_sync: Instant::now(),
        };
        writer.size_bytes = writer
            .file
            .metadata()
            .with_context(|| format!("reading the size of {}", path.display()))?
            .len();
        writer.needs_newline = writer.size_bytes > 0 && !ends_with_newline(path)?;
        Ok(writer)
    }

    /// Starts the run: writes its header (after moving the file aside if it is already
    /// full).
    pub fn begin(&mut self, header: HeaderLine) -> anyhow::Result<()> {
        self.header = Some(header);
        if self.is_full() {
            self.shift_files()?;
        }
        self.write_header()
    }

    /// Appends one tick's lines (each ending with a newline) and flushes them. A file that
    /// is full is rotated first, so a tick is never split between files and no file is left
    /// with a header alone.
    pub fn write_tick(&mut self, lines: &[u8]) -> anyhow::Result<()> {
        if lines.is_empty() {
            return Ok(());
        }
        if self.is_full() {
            self.rotate()?;
        }
        self.append(lines)?;
        if self.last_sync.elapsed() >= SYNC_EVERY {
            self.sync()?;
        }
        Ok(())
    }

    /// Syncs what was written to disk; call when the recording ends.
    pub fn finish(&mut self) -> anyhow::Result<()> {
        self.sync()
    }

    /// The file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn is_full(&self) -> bool {
        self.rotate_bytes
            .is_some_and(|limit| self.size_bytes >= limit)
    }

    fn append(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        let mut buffer = Vec::with_capacity(bytes.len() + 1);
        if self.needs_newline {
            // End the cut-short line, so it stays one (skipped) line of its own.
            buffer.push(b'\n');
        }
        buffer.extend_from_slice(bytes);
        self.file
            .write_all(&buffer)
            .and_then(|()| self.file.flush())
            .with_context(|| format!("writing to {}", self.path.display()))?;
        self.needs_newline = false;
        self.size_bytes += buffer.len() as u64;
        Ok(())
    }

    fn sync(&mut self) -> anyhow::Result<()> {
        self.last_sync = Instant::now();
        self.file
            .sync_data()
            .with_context(|| format!("syncing {} to disk", self.path.display()))
    }

    fn write_header(&mut self) -> anyhow::Result<()> {
        let Some(header) = &self.header else {
            return Ok(());
        };
        let mut text = serde_json::to_string(&Line::Header(Box::new(header.clone())))
            .context("encoding the recording header")?;
        text.push('\n');
        self.append(text.as_bytes())
    }

    /// Moves the full file aside and starts a fresh one with a header for the next part.
    fn rotate(&mut self) -> anyhow::Result<()> {
        self.shift_files()?;
        if let Some(header) = &mut self.header {
            header.part += 1;
            header.started = Moment::from(Timestamp::now());
            // Each part's header tells the clock as it is then.
            header.node.clock = crate::clock::ClockQuality::read();
        }
        self.write_header()
    }

    /// FILE.n → FILE.n+1 for every n from the highest down, FILE → FILE.1, and opens a new,
    /// empty FILE. Nothing is deleted.
    fn shift_files(&mut self) -> anyhow::Result<()> {
        self.sync()?;
        let numbered = |n: u32| {
            let mut name = self.path.clone().into_os_string();
            name.push(format!(".{n}"));
            PathBuf::from(name)
        };
        let mut highest = 0;
        while numbered(highest + 1).exists() {
            highest += 1;
        }
        for n in (1..=highest).rev() {
            std::fs::rename(numbered(n), numbered(n + 1)).with_context(|| {
                format!(
                    "rotating {} to {}",
                    numbered(n).display(),
                    numbered(n + 1).display()
                )
            })?;
        }
        std::fs::rename(&self.path, numbered(1)).with_context(|| {
            format!(
                "rotating {} to {}",
                self.path.display(),
                numbered(1).display()
            )
        })?;
        self.file = open_append(&self.path)?;
        self.size_bytes = 0;
        self.needs_newline = false;
        Ok(())
    }
}

fn open_append(path: &Path) -> anyhow::Result<File> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .with_context(|| format!("cannot open {} to record to", path.display()))
}

/// Whether a non-empty file's last byte is a newline.
fn ends_with_newline(path: &Path) -> anyhow::Result<bool> {
    let mut file =
        File::open(path).with_context(|| format!("reading the end of {}", path.display()))?;
    let mut last = [0u8; 1];
    file.seek(SeekFrom::End(-1))
        .and_then(|_| file.read_exact(&mut last))
        .with_context(|| format!("reading the end of {}", path.display()))?;
    Ok(last[0] == b'\n')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::NodeFacts;

    fn header() -> HeaderLine {
        let now = Moment::from(Timestamp::now());
        HeaderLine {
            measured: Default::default(),
            schema_version: super::super::line::SCHEMA_VERSION,
            format: super::super::line::FORMAT.into(),
            agent_version: "test".into(),
            node: NodeFacts {
                name: "h".into(),
                clock: None,
                hostname: "h".into(),
                kernel: "k".into(),
                cpus: 2,
                cpu_model: "m".into(),
                memory_bytes: 1,
                boot_time_epoch_secs: 1,
            },
            started: now.clone(),
            run_started: now,
            part: 0,
            interval_seconds: 1.0,
            worker_patterns: Vec::new(),
            programs: vec!["cpu".into()],
        }
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wp-writer-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    fn lines_of(path: &Path) -> Vec<String> {
        std::fs::read_to_string(path)
            .expect("read")
            .lines()
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn rotation_keeps_ticks_whole_and_starts_each_file_with_a_header() {
        let dir = temp_dir("rotate");
        let path = dir.join("rec.jsonl");
        let tick = format!("{}\n{}\n", "x".repeat(150), "y".repeat(150));
        let header_bytes = serde_json::to_string(&Line::Header(Box::new(header())))
            .expect("json")
            .len() as u64
            + 1;
        // Full after two ticks, not after one, whatever the length of the header's times.
        let limit = header_bytes + 2 * tick.len() as u64 - 100;
        let mut writer = RecordingWriter::open(&path, Some(limit)).expect("open");
        writer.begin(header()).expect("begin");
        for _ in 0..6 {
            writer.write_tick(tick.as_bytes()).expect("write");
        }
        writer.finish().expect("finish");
        let mut parts = Vec::new();
        for candidate in [
            path.clone(),
            dir.join("rec.jsonl.1"),
            dir.join("rec.jsonl.2"),
        ] {
            assert!(candidate.exists(), "{} missing", candidate.display());
            parts.push(lines_of(&candidate));
        }
        assert!(!dir.join("rec.jsonl.3").exists());
        // Oldest first: .2 is part 0, .1 part 1, the file itself part 2.
        for (part, lines) in parts.iter().rev().enumerate() {
            let first: serde_json::Value = serde_json::from_str(&lines[0]).expect("header");
            assert_eq!(first["type"], "header");
            assert_eq!(first["part"], part as u64);
            // After the header, whole ticks only: x then y, in pairs.
            assert_eq!((lines.len() - 1) % 2, 0, "{lines:?}");
            for pair in lines[1..].chunks(2) {
                assert!(pair[0].starts_with('x') && pair[1].starts_with('y'));
            }
        }
        // Two ticks (four lines) in each file.
        for lines in &parts {
            assert_eq!(lines.len(), 5);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn appending_to_a_cut_short_file_starts_a_new_line() {
        let dir = temp_dir("append");
        let path = dir.join("rec.jsonl");
        std::fs::write(&path, "{\"type\":\"tick\",\"cut").expect("write");
        let mut writer = RecordingWriter::open(&path, None).expect("open");
        writer.begin(header()).expect("begin");
        writer.write_tick(b"{}\n").expect("tick");
        let lines = lines_of(&path);
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], "{\"type\":\"tick\",\"cut");
        assert!(lines[1].starts_with("{\"type\":\"header\""));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_full_file_is_rotated_before_the_new_run() {
        let dir = temp_dir("full");
        let path = dir.join("rec.jsonl");
        std::fs::write(&path, "old\n".repeat(100)).expect("write");
        let mut writer = RecordingWriter::open(&path, Some(100)).expect("open");
        writer.begin(header()).expect("begin");
        assert_eq!(lines_of(&dir.join("rec.jsonl.1")).len(), 100);
        assert_eq!(lines_of(&path).len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
