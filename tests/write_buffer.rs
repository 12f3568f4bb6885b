//! The mount's write buffer (`write_buffer=`, docs/SEMANTICS.md
//! "Writing"): many concurrent writers behind a slow replica stay within
//! the documented memory bound, and writers that find the buffer spent
//! wait for it; none fails, and every byte arrives.

mod common;
use common::*;

use std::time::Duration;

/// The daemon's `VmRSS` or `VmHWM` (peak) in KiB.
fn mem_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_hundred_writers_behind_a_slow_replica_stay_within_the_write_buffer_and_none_fails() {
    const WRITERS: usize = 100;
    const MIB: usize = 2;
    // The one datanode is a slow disk (tools/powercut `slow`): each write
    // is answered 10 ms late, 20 ms per packet (data and checksums).
    let disk = powercut::Disk::new();
    disk.slow("dn1", 10);
    let m = Mount::with_datanode_paths(
        Opts {
            datanodes: 1,
            replication: Some(1),
            o: vec!["write_buffer=4M".into()],
            args: Vec::new(),
        },
        vec![disk.path("dn1")],
    );
    let pid = m.pid.expect("daemon pid");
    let base = mem_kib(pid, "VmRSS:");
    // `WRITERS` threads of one process (tools/testkit/src/load.rs), each
    // appending `MIB` MiB in 64 KiB writes to a file of its own; it says
    // `ok` or the first error.
    let o = testkit_run(&m.mnt, "writers", &[&WRITERS.to_string(), &MIB.to_string()]);
    let said = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        said.trim(),
        "ok",
        "a writer failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let peak = mem_kib(pid, "VmHWM:");
    for i in 0..WRITERS {
        let len = std::fs::metadata(m.path(&format!("w{i:03}")))
            .expect("stat")
            .len();
        assert_eq!(len, (MIB << 20) as u64, "w{i:03}");
    }
    let sample = m.read(&format!("w{:03}", WRITERS - 1));
    assert!(sample.chunks(256).all(|c| c.iter().copied().eq(0..=255u8)));
    let wb: serde_json::Value = serde_json::from_str(
        m.xattr("", "user.leasefs.write_buffer")
            .expect("write_buffer xattr")
            .trim(),
    )
    .expect("write_buffer JSON");
    assert_eq!(wb["bytes"], 4 << 20, "{wb}");
    assert!(wb["peak"].as_u64().is_some_and(|p| p <= 4 << 20), "{wb}");
    assert!(
        wb["waits"].as_u64().is_some_and(|w| w > 0),
        "nobody waited: {wb}"
    );
    assert_eq!(wb["used"], 0, "units leaked: {wb}");
    // The documented bound: the buffer, plus per stream one packet being
    // filled, one in flight and one request's remainder (64 KiB writes
    // here), plus the threads serving them. Without the buffer, each
    // stream holds up to its whole 2 MiB here (200 MiB).
    let bound_kib = 4 * 1024 + WRITERS as u64 * 3 * 64 + 48 * 1024;
    eprintln!(
        "daemon RSS base {base} KiB, peak {peak} KiB (+{} KiB), bound +{bound_kib} KiB; {wb}",
        peak.saturating_sub(base)
    );
    assert!(
        peak.saturating_sub(base) <= bound_kib,
        "daemon RSS grew by {} KiB (base {base} KiB, peak {peak} KiB), bound {bound_kib} KiB",
        peak.saturating_sub(base)
    );
    assert!(wait_until(Duration::from_secs(5), || m.lease_state("w000") == "free"));
}
