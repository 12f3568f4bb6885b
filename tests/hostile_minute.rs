//! A minute of every attack at once (docs/SEMANTICS.md, "Threat model"):
//! `nobody` runs them all against a root mount while a legitimate user
//! (root, in a 0700 directory) appends a line and fsyncs it, again and
//! again. Checked: root's lookups from the CPU the attack crowds are
//! answered within 100 ms, the daemon grows by less than 64 MB, every
//! line of the writer is there and nobody read it or saw its name; the
//! writer's fsync p99, quiet and under attack, is printed.
//!
//! `LEASEFS_HOSTILE_SECS` sets the attack's length (default 60; test.sh
//! runs 20). The fsync bound is asserted only with `LEASEFS_HOSTILE_STRICT`
//! set: on two cores the attackers' own CPU use decides it (see the test).
//! `LEASEFS_HOSTILE_SKIP=pile,truncate` leaves those attacks out.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::*;

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// The attackers: killed (by pid, they are this test's children) and
/// reaped when dropped, whatever happened.
#[derive(Default)]
struct Attack(Vec<(&'static str, Child)>);

impl Attack {
    /// `cmd` as `nobody`, in `cwd`, its output kept; not started when
    /// `LEASEFS_HOSTILE_SKIP` (comma-separated) names it, which is how one
    /// finds what each attack costs the writer.
    fn start(&mut self, what: &'static str, cwd: &Path, cmd: &[&str]) {
        let skip = std::env::var("LEASEFS_HOSTILE_SKIP").unwrap_or_default();
        if skip.split(',').any(|s| s == what) {
            return;
        }
        let child = Command::new("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
            .args(cmd)
            .current_dir(cwd)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start an attacker");
        self.0.push((what, child));
    }

    /// A shell loop as `nobody` for `secs` seconds.
    fn sh(&mut self, what: &'static str, cwd: &Path, secs: u64, body: &str) {
        let script = format!(
            "end=$(( $(date +%s) + {secs} )); while [ $(date +%s) -lt $end ]; do {body}; sleep 0.02; done"
        );
        self.start(what, cwd, &["sh", "-c", &script]);
    }

    /// Waits for every attacker; what each printed.
    fn finish(mut self) -> Vec<(&'static str, String)> {
        self.0
            .drain(..)
            .map(|(what, c)| {
                let o = c.wait_with_output().expect("an attacker");
                (what, String::from_utf8_lossy(&o.stdout).trim().to_string())
            })
            .collect()
    }
}

impl Drop for Attack {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `p99_us` of a `testkit fsyncer` report, and its line count.
fn fsyncs(report: &str) -> (u64, u64) {
    let field = |name: &str| -> u64 {
        report
            .split_whitespace()
            .skip_while(|w| *w != name)
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("p99_us"), field("lines"))
}

fn fsyncer(m: &Mount, name: &str, secs: u64) -> String {
    let o = Command::new(testkit())
        .args(["fsyncer", p(&m.path(name)), &secs.to_string()])
        .output()
        .expect("fsyncer");
    assert!(
        o.status.success(),
        "fsyncer: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Every line `lines` of the fsyncer in `path`, in order, once.
fn check_lines(m: &Mount, name: &str, lines: u64) {
    let text = std::fs::read_to_string(m.path(name)).expect("the writer's file");
    let got: Vec<&str> = text.lines().collect();
    assert_eq!(got.len() as u64, lines, "{name}: lines lost or added");
    for (i, l) in got.iter().enumerate() {
        assert!(
            l.starts_with(&format!("line {i:08} ")),
            "{name}: line {i} is {l:?}"
        );
    }
}

#[test]
fn a_minute_of_every_attack_at_once_costs_a_legitimate_writer_little() {
    let secs: u64 = std::env::var("LEASEFS_HOSTILE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let m = Mount::with_o("lease_wait=30");
    m.open_to_all();
    m.sh_ok(
        "mkdir -m 700 legit && mkdir pub && chown nobody:nogroup pub \
         && touch pub/held pub/mine pub/grow && chown nobody:nogroup pub/*",
    );
    let daemon = m.pid.expect("daemon pid");
    let (quiet_p99, quiet_lines) = fsyncs(&fsyncer(&m, "legit/quiet", 10));
    assert!(quiet_lines > 0);
    let rss0 = rss_kib(daemon);

    let kit = testkit();
    let kit = p(&kit);
    let leasefs = bin();
    let leasefs = p(&leasefs);
    let mnt = p(&m.mnt);
    let pubdir = m.path("pub");
    let s = secs.to_string();
    let mut holder = Agent::spawn_as_nobody(&pubdir);
    holder.ok("open held w");
    let mut attack = Attack::default();
    // Opens that wait for a lease, piled on CPU 0 (item 4).
    attack.start("pile", &pubdir, &[kit, "pile", "held", "1100", "0", &s]);
    // CREATE of names that exist, looking for another's file (item 1).
    attack.start("create-race", &pubdir, &[kit, "create-race", "race", &s]);
    // Refused writes (past the end), each a log line (item 3).
    attack.sh(
        "refused writes",
        &pubdir,
        secs,
        "printf x | dd of=mine bs=1 seek=100000 conv=notrunc 2>/dev/null",
    );
    // Deep checks (refused), shallow ones, and the lists (items 5, 6).
    attack.sh(
        "fsck and leases",
        &pubdir,
        secs,
        &format!(
            "{leasefs} fsck {mnt} >/dev/null 2>&1; {leasefs} fsck {mnt} --shallow 2>/dev/null \
             | grep -c legit; {leasefs} leases {mnt} 2>/dev/null | grep -c legit; sleep 0.2"
        ),
    );
    // Growth: 32 MiB holes, then more than the datanodes hold (item 5).
    attack.sh(
        "truncate",
        &pubdir,
        secs,
        "truncate -s 32M grow; truncate -s 0 grow; truncate -s 1E grow 2>/dev/null",
    );
    // Reading the legitimate user's file, and symlinks in datanodes (item 2).
    let dn = m.datanodes[0].join("rbw-evil");
    attack.sh(
        "trespass",
        &pubdir,
        secs,
        &format!(
            "cat {legit}/busy 2>/dev/null | head -c 40; ln -s /etc {dn} 2>/dev/null \
             && echo planted; sleep 0.1",
            legit = p(&m.path("legit")),
            dn = p(&dn)
        ),
    );
    let probe = Command::new(kit)
        .args(["probe", mnt, &(secs * 1000 / 40).to_string(), "0"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("probe");
    let busy = fsyncer(&m, "legit/busy", secs);
    let probed = probe.wait_with_output().expect("probe");
    let reports = attack.finish();
    holder.ok("close");
    let rss1 = rss_kib(daemon);

    let (busy_p99, busy_lines) = fsyncs(&busy);
    let probed = String::from_utf8_lossy(&probed.stdout).trim().to_string();
    let slowest: u64 = probed
        .strip_prefix("slowest_us ")
        .and_then(|v| v.parse().ok())
        .unwrap_or(u64::MAX);
    eprintln!(
        "quiet fsync p99 {quiet_p99} µs, under attack {busy_p99} µs ({busy}); \
         root's slowest lookup {slowest} µs; daemon RSS {rss0} -> {rss1} KiB"
    );
    for (what, out) in &reports {
        eprintln!("{what}: {}", out.lines().last().unwrap_or(""));
    }
    let said = |what: &str| -> String {
        reports
            .iter()
            .filter(|(w, _)| *w == what)
            .map(|(_, o)| o.clone())
            .collect()
    };
    assert!(
        !said("create-race").contains("breach"),
        "{}",
        said("create-race")
    );
    let trespass = said("trespass");
    assert!(
        !trespass.contains("line") && !trespass.contains("planted"),
        "nobody read the writer's file or planted a link: {trespass}"
    );
    assert!(
        said("fsck and leases").lines().all(|l| l.trim() == "0"),
        "the writer's path was shown to nobody"
    );
    check_lines(&m, "legit/quiet", quiet_lines);
    check_lines(&m, "legit/busy", busy_lines);
    // On two cores the attackers' own processes (forks, loops) take CPU
    // from the writer whatever the daemon does: the bound (2x) is
    // checked only when asked for, on a machine with cores to spare.
    if std::env::var_os("LEASEFS_HOSTILE_STRICT").is_some() {
        assert!(
            busy_p99 < 2 * quiet_p99.max(1),
            "fsync p99 {busy_p99} µs under attack, {quiet_p99} µs quiet"
        );
    }
    assert!(slowest < 100_000, "root's lookup waited {slowest} µs");
    let grown = rss1.saturating_sub(rss0);
    assert!(grown < 64 << 10, "the daemon grew by {grown} KiB");
}
