//! `leasefs stats MOUNTPOINT [--interval SECS] [--once] [--json]`: the
//! daemon's counters through its control socket, shown like `iostat`:
//! rates per second from consecutive snapshots, one table per interval
//! (redrawn in place on a terminal), or one JSON object of counters.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::json;

use super::client::{ask, find_mount};
use super::fail;
use crate::metrics::snapshot::{Rates, Snapshot, rates};

/// Ops shown by name on the `ops/s` line (the busiest); the rest are
/// summed in the total.
const TOP_OPS: usize = 8;

pub fn run(mountpoint: &Path, interval: f64, once: bool, as_json: bool) -> ExitCode {
    if !interval.is_finite() || interval <= 0.0 || interval > 86_400.0 {
        return fail(
            2,
            format!("--interval {interval}: must be between 0 and 86400 seconds"),
        );
    }
    let (mp, _) = match find_mount(mountpoint) {
        Ok(m) => m,
        Err(e) => return fail(2, e),
    };
    let fetch = || -> Result<Snapshot, String> {
        let v = ask(&mp, json!({"op": "stats"}))?;
        serde_json::from_value(v["stats"].clone())
            .map_err(|e| format!("bad statistics from the daemon: {e}"))
    };
    let mut prev = match fetch() {
        Ok(s) => s,
        Err(e) => return fail(2, e),
    };
    let mut out = std::io::stdout().lock();
    let tty = out.is_terminal();
    let title = mp.display().to_string();
    // A closed stdout (`| head`) ends the command quietly.
    let shown = if as_json {
        writeln!(out, "{}", json!(prev))
    } else if once {
        write!(out, "{}", render(&title, &prev, &rates(&prev, None), None))
    } else {
        Ok(())
    };
    if shown.is_err() || once {
        return ExitCode::SUCCESS;
    }
    let pause = Duration::from_secs_f64(interval);
    loop {
        std::thread::sleep(pause);
        let cur = match fetch() {
            Ok(s) => s,
            Err(e) => return fail(1, e),
        };
        let shown = if as_json {
            writeln!(out, "{}", json!(cur))
        } else {
            let table = render(&title, &cur, &rates(&cur, Some(&prev)), Some(interval));
            // On a terminal the table is redrawn in place; piped, each
            // interval's table follows the last, as iostat's do.
            let clear = if tty { "\x1b[H\x1b[2J" } else { "" };
            write!(out, "{clear}{table}{}", if tty { "" } else { "\n" })
        };
        if shown.and_then(|_| out.flush()).is_err() {
            return ExitCode::SUCCESS;
        }
        prev = cur;
    }
}

/// The table for snapshot `s` and its rates `r`; `interval` is `None` for
/// averages since the mount (`--once`).
pub fn render(mount: &str, s: &Snapshot, r: &Rates, interval: Option<f64>) -> String {
    let mut t = String::new();
    let over = match interval {
        Some(i) => format!("per second over {i} s"),
        None => "per second since the mount".into(),
    };
    t += &format!(
        "leasefs stats {mount}  up {}  ({over})\n",
        duration(s.uptime_seconds)
    );
    let mut ops = format!("{:<9}{}", "ops/s", num(r.ops_total));
    for (name, n) in r.ops.iter().take(TOP_OPS) {
        ops += &format!("  {name} {}", num(*n));
    }
    if r.ops.len() > TOP_OPS {
        ops += &format!("  (+{} more kinds)", r.ops.len() - TOP_OPS);
    }
    t += &ops;
    t += "\n";
    t += &format!(
        "{:<9}write {}/s  read {}/s\n",
        "data",
        bytes(r.written),
        bytes(r.read)
    );
    t += &format!(
        "{:<9}{}/s  p50 {}  p99 {}\n",
        "fsync",
        num(r.fsyncs),
        latency(r.fsync_p50),
        latency(r.fsync_p99)
    );
    t += &format!(
        "{:<9}held {}  waiting {}  recoveries {}/s ({} since mount)\n",
        "leases",
        s.leases_held,
        s.lease_waiters,
        num(r.recoveries),
        s.recoveries_total()
    );
    t += &format!(
        "{:<9}streams {}  packets in flight {}  acked {}/s  recoveries {}/s ({} since mount)\n",
        "pipeline",
        s.streams_open,
        s.packets_in_flight,
        num(r.packets_acked),
        num(r.pipeline_recoveries),
        s.pipeline_recoveries
    );
    t += &format!(
        "{:<4} {:<32} {:<15} {:>10} {:>10} {:>12} {:>12} {:>7}\n",
        "ID", "DATANODE", "STATE", "USED", "FREE", "WRITE/s", "READ/s", "ERRORS"
    );
    for (i, d) in s.datanodes.iter().enumerate() {
        let (w, rd, _) = r.datanodes.get(i).copied().unwrap_or_default();
        let opt = |v: Option<u64>| v.map_or("-".into(), |v| bytes(v as f64));
        t += &format!(
            "{:<4} {:<32} {:<15} {:>10} {:>10} {:>12} {:>12} {:>7}\n",
            d.id,
            d.path,
            d.state,
            opt(d.used_bytes),
            opt(d.free_bytes),
            bytes(w),
            bytes(rd),
            d.errors
        );
    }
    t
}

/// A count per second: whole above 10, one decimal below.
fn num(v: f64) -> String {
    if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Bytes in binary units.
pub fn bytes(v: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = v;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{v:.0}{}", UNITS[u])
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

fn latency(v: Option<f64>) -> String {
    match v {
        None => "-".into(),
        Some(s) if s < 1e-3 => format!("{:.0}µs", s * 1e6),
        Some(s) if s < 1.0 => format!("{:.1}ms", s * 1e3),
        Some(s) => format!("{s:.2}s"),
    }
}

fn duration(secs: f64) -> String {
    let s = secs as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::DatanodeStats;

    #[test]
    fn units_read_like_iostat() {
        assert_eq!(bytes(0.0), "0B");
        assert_eq!(bytes(1536.0), "1.5KiB");
        assert_eq!(bytes(80.0 * 1048576.0), "80.0MiB");
        assert_eq!(latency(Some(0.00021)), "210µs");
        assert_eq!(latency(Some(0.0021)), "2.1ms");
        assert_eq!(latency(None), "-");
        assert_eq!(num(2.25), "2.2");
        assert_eq!(num(1234.4), "1234");
        assert_eq!(duration(3725.0), "1h02m");
    }

    #[test]
    fn the_table_shows_rates_leases_and_each_datanode() {
        let mut a = Snapshot {
            uptime_seconds: 10.0,
            ..Snapshot::default()
        };
        a.datanodes.push(DatanodeStats {
            id: "0".into(),
            path: "/srv/dn1".into(),
            state: "live".into(),
            free_bytes: Some(1 << 30),
            ..DatanodeStats::default()
        });
        let mut b = a.clone();
        b.uptime_seconds = 12.0;
        b.ops.insert("write".into(), 200);
        b.bytes_written = 4 << 20;
        b.leases_held = 2;
        b.datanodes[0].bytes_written = 4 << 20;
        b.datanodes[0].errors = 1;
        let t = render("/mnt", &b, &rates(&b, Some(&a)), Some(2.0));
        assert!(t.contains("write 100"), "{t}");
        assert!(t.contains("write 2.0MiB/s"), "{t}");
        assert!(t.contains("held 2  waiting 0"), "{t}");
        let dn = t.lines().find(|l| l.contains("/srv/dn1")).unwrap();
        assert!(dn.contains("live") && dn.contains("1.0GiB") && dn.contains("2.0MiB"));
        assert!(dn.ends_with(" 1"), "{dn}");
    }
}
