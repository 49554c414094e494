//! The recording reader on arbitrary bytes: header detection, every line type, corrupt and
//! overlong lines. It must return a recording or one sentence, never panic; and what it
//! returns must be usable by replay (every tick rebuilds its interval).

#![no_main]

use libfuzzer_sys::fuzz_target;
use workerprobe::recording::reader::parse_recording;

fuzz_target!(|data: &[u8]| {
    let Ok(recording) = parse_recording("fuzz.jsonl", data) else {
        return;
    };
    assert!(!recording.segments.is_empty(), "a recording has a header");
    for (_segment, tick) in recording.ticks() {
        assert!(!tick.workers.is_empty(), "a tick has a worker line");
        // What replay does with every tick: the two samples and their difference.
        let _ = tick.interval();
    }
});
