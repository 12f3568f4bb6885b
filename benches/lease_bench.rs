//! Lease-manager scale (DESIGN §5): acquire, client renewal, an idle monitor
//! tick and release of 10^3, 10^5 and 10^6 leases, and what a lease costs in
//! memory. Each size runs in a child process of its own so that memory freed
//! by a smaller run does not hide the cost of a larger one.
//!
//! `cargo bench --bench lease_bench` (a plain `main`, no harness).
//! `-- --sizes 1000,1000000` picks the sizes; `-- --tsv` prints one
//! tab-separated line per size (leases, acquire/s, renew/s, idle tick ns,
//! release/s, bytes/lease) for `benches/run.sh`.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasefs::clock::SystemClock;
use leasefs::lease::{
    Acquire, AcquireOpts, EpochSource, Holder, LeaseConfig, LeaseManager, RenewalMode,
};

const SIZES: [u64; 3] = [1_000, 100_000, 1_000_000];
const TICKS: usize = 2_001;

struct Counter(u64);

impl EpochSource for Counter {
    fn next(&mut self, _file: u64) -> Result<u64, String> {
        self.0 += 1;
        Ok(self.0)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let tsv = args.iter().any(|a| a == "--tsv");
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let n = args[i + 1].parse().expect("--child N");
        run(n, tsv);
        return;
    }
    let sizes: Vec<u64> = match args.iter().position(|a| a == "--sizes") {
        Some(i) => args[i + 1]
            .split(',')
            .map(|s| s.parse().expect("--sizes N,N,..."))
            .collect(),
        None => SIZES.to_vec(),
    };
    if !tsv {
        println!(
            "{:>9} {:>14} {:>14} {:>14} {:>14} {:>13}",
            "leases", "acquire/s", "renew/s", "idle tick", "release/s", "bytes/lease"
        );
    }
    let exe = std::env::current_exe().expect("own executable");
    for n in sizes {
        let mut cmd = Command::new(&exe);
        cmd.args(["--child", &n.to_string()]);
        if tsv {
            cmd.arg("--tsv");
        }
        let status = cmd.status().expect("run child");
        assert!(status.success(), "run with {n} leases failed");
    }
}

fn run(n: u64, tsv: bool) {
    let host: Arc<str> = "bench-host".into();
    let mgr = LeaseManager::new(
        LeaseConfig::default(),
        Arc::new(SystemClock::new()),
        Box::new(Counter(0)),
        host.clone(),
    );

    let rss_before = rss_bytes();
    let t = Instant::now();
    for i in 0..n {
        let holder = Holder {
            host: host.clone(),
            pid: 4242,
            comm: "bench-writer".to_owned(),
            handle: i,
            opened_wall_ms: 1_700_000_000_000,
        };
        let res = mgr.acquire(i, holder, AcquireOpts::default(), Box::new(|_| {}));
        assert!(matches!(res, Ok(Acquire::Granted(_))));
    }
    let acquire = t.elapsed();
    let rss_daemon = rss_bytes();

    for i in 0..n {
        mgr.set_mode(i, i, RenewalMode::Client).unwrap();
    }
    let rss_client = rss_bytes();
    let t = Instant::now();
    for i in 0..n {
        mgr.renew(i, i).unwrap();
    }
    let renew = t.elapsed();

    let examined = mgr.tick_examined();
    let mut ticks: Vec<Duration> = (0..TICKS)
        .map(|_| {
            let t = Instant::now();
            let tickets = mgr.tick();
            let took = t.elapsed();
            assert!(tickets.is_empty());
            took
        })
        .collect();
    ticks.sort_unstable();
    assert_eq!(
        mgr.tick_examined(),
        examined,
        "an idle tick examined leases"
    );

    let t = Instant::now();
    for i in 0..n {
        assert!(mgr.release(i, i));
    }
    let release = t.elapsed();
    assert!(mgr.is_empty());

    let per_lease = rss_daemon.max(rss_client).saturating_sub(rss_before) / n;
    if tsv {
        println!(
            "{n}\t{}\t{}\t{}\t{}\t{per_lease}",
            rate(n, acquire),
            rate(n, renew),
            ticks[TICKS / 2].as_nanos(),
            rate(n, release),
        );
        return;
    }
    println!(
        "{:>9} {:>14} {:>14} {:>11} ns {:>14} {:>13}",
        n,
        rate(n, acquire),
        rate(n, renew),
        ticks[TICKS / 2].as_nanos(),
        rate(n, release),
        per_lease,
    );
}

fn rate(n: u64, took: Duration) -> String {
    format!("{:.0}", n as f64 / took.as_secs_f64())
}

/// Resident set size from `/proc/self/statm` (second field, in pages).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .expect("statm resident field");
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}
