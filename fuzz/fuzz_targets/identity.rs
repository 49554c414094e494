//! The cgroup-path-to-name resolver on arbitrary paths: it must never panic, always give a
//! name, and call a path the root only when it has no component.

#![no_main]

use libfuzzer_sys::fuzz_target;
use workerprobe::model::identity::{WorkerKind, identify};

fuzz_target!(|data: &[u8]| {
    let path = String::from_utf8_lossy(data);
    let identity = identify(&path);
    assert!(!identity.name.is_empty(), "{path:?} got an empty name");
    let has_component = path.split('/').any(|c| !c.is_empty());
    assert_eq!(
        identity.kind == WorkerKind::Root,
        !has_component,
        "{path:?} is {:?}",
        identity.kind
    );
    if identity.kind == WorkerKind::Root {
        assert_eq!(identity.name, "/");
    }
    // Trailing and doubled slashes change nothing.
    assert_eq!(
        identify(&format!("{path}/")),
        identity,
        "{path:?} with a trailing /"
    );
    // JSON round trip: the identity is written in every snapshot and recording.
    let json = serde_json::to_string(&identity).expect("serializes");
    let back: workerprobe::model::identity::Identity =
        serde_json::from_str(&json).expect("deserializes");
    assert_eq!(back, identity);
});
