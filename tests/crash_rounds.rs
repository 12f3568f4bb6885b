//! kill -9 of the daemon at random moments during writes with fsync
//! (docs/SEMANTICS.md "Writing" and "Durability": nobody is ever told a write
//! finished when it is not stable; files left under construction by a
//! dead daemon are recovered at the next mount).
//!
//! Each of 50 rounds starts 1-3 writer processes, each appending known
//! records to its own file in random pieces and fsyncing at random; after
//! every fsync that returned, the writer records the file's length in a
//! side file outside the mount. At a random moment the daemon gets
//! SIGKILL; the mount is remounted, and then every file must hold at least
//! its fsynced prefix, byte-exact, and nothing but the writer's bytes
//! after it, and `leasefs fsck MNT` must exit 0. Files grow across rounds
//! (writers append to what recovery kept, which reopens finalized last
//! blocks) and are retired at a few MiB so that each round stays quick.
//!
//! `LEASEFS_CRASH_SEED` replays a run; `LEASEFS_CRASH_ROUNDS` changes the
//! number of rounds.

mod common;
use common::faults::*;
use common::*;

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROUNDS: usize = 50;
const SLOTS: usize = 3;
/// Bytes of each file's known stream; a file is retired past `RETIRE`.
const STREAM_LEN: usize = 6 << 20;
const RETIRE: u64 = 2 << 20;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The known byte stream of file `name`: numbered records of varying length.
fn stream(name: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(STREAM_LEN + 200);
    let mut j = 0u64;
    while v.len() < STREAM_LEN {
        let fill = (j * 7919 % 61) as usize;
        let letters: String = (0..fill)
            .map(|k| (b'a' + ((j as usize + k) % 26) as u8) as char)
            .collect();
        v.extend_from_slice(format!("{name} rec {j:07} {letters}\n").as_bytes());
        j += 1;
    }
    v.truncate(STREAM_LEN);
    v
}

struct FileState {
    src: PathBuf,
    side: PathBuf,
    data: Vec<u8>,
}

struct Run {
    m: Mount,
    work: tempfile::TempDir,
    files: BTreeMap<String, FileState>,
    /// The file each slot writes now.
    slots: Vec<String>,
    generation: Vec<usize>,
}

impl Run {
    fn file(&mut self, name: &str) {
        if !self.files.contains_key(name) {
            let data = stream(name);
            let src = self.work.path().join(format!("{name}.stream"));
            std::fs::write(&src, &data).unwrap();
            let side = self.work.path().join(format!("{name}.synced"));
            self.files
                .insert(name.to_string(), FileState { src, side, data });
        }
    }

    /// Checks every byte `name` holds against its stream and the fsynced
    /// length; returns the file's length.
    fn verify(&self, name: &str, round: usize, seed: u64) -> u64 {
        let f = &self.files[name];
        let synced = synced_len(&f.side);
        let got = match std::fs::read(self.m.path(name)) {
            Ok(g) => g,
            Err(e) => panic!(
                "round {round} (seed {seed}): cannot read {name} ({synced} bytes fsynced): {e}\nlog:\n{}",
                tail(&self.m.log())
            ),
        };
        assert!(
            got.len() as u64 >= synced,
            "round {round} (seed {seed}): {name} holds {} bytes but {synced} were fsynced\nlog:\n{}",
            got.len(),
            tail(&self.m.log())
        );
        assert!(
            got.len() <= f.data.len(),
            "{name}: longer than anything written"
        );
        if let Some(i) = got.iter().zip(&f.data).position(|(a, b)| a != b) {
            panic!(
                "round {round} (seed {seed}): {name} ({} bytes, {synced} fsynced) differs from what was written at offset {i}\nlog:\n{}",
                got.len(),
                tail(&self.m.log())
            );
        }
        got.len() as u64
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

fn start_writer(
    m: &Mount,
    f: &FileState,
    name: &str,
    seed: u64,
) -> (Child, std::sync::mpsc::Receiver<String>) {
    // Appends the stream to the file (O_APPEND) from its length in random
    // pieces, fsyncing at random; after each fsync that returned, it
    // appends the length to the side file (tools/testkit/src/append.rs).
    let mut child = Command::new(testkit())
        .arg("append")
        .arg(&f.src)
        .arg(name)
        .arg("--side")
        .arg(&f.side)
        .args(["--random", &seed.to_string()])
        .current_dir(&m.mnt)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn testkit append");
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Kills (by pid) and reaps writers still running after `max`.
fn reap(children: &mut [Child], max: Duration) {
    let deadline = Instant::now() + max;
    for c in children.iter_mut() {
        let left = deadline.saturating_duration_since(Instant::now());
        if !wait_until(left, || matches!(c.try_wait(), Ok(Some(_)))) {
            kill(c.id(), libc::SIGKILL);
            let _ = c.wait();
        }
    }
}

fn assert_fsck_clean(m: &Mount, round: usize, seed: u64) {
    let f = m.fsck(&[]);
    assert_eq!(
        f.code,
        0,
        "round {round} (seed {seed}): fsck after recovery:\n{}{}\nlog:\n{}",
        f.stdout,
        f.stderr,
        tail(&m.log())
    );
}

#[test]
fn every_fsynced_prefix_survives_kill_9_of_the_daemon_in_50_rounds_and_fsck_is_clean() {
    let seed: u64 = std::env::var("LEASEFS_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    let rounds: usize = std::env::var("LEASEFS_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(ROUNDS);
    eprintln!("crash rounds: seed {seed} (LEASEFS_CRASH_SEED to replay), {rounds} rounds");
    let mut rng = Rng(seed);
    let m = Mount::with(Opts {
        datanodes: 4,
        replication: Some(3),
        // Small blocks: crashes also land around block boundaries
        // (finalize, opening the next block, reopening for append).
        o: vec!["block_size=256K".into()],
        args: Vec::new(),
    });
    let mut run = Run {
        m,
        work: tempfile::tempdir().unwrap(),
        files: BTreeMap::new(),
        slots: (0..SLOTS).map(|s| format!("s{s}g0")).collect(),
        generation: vec![0; SLOTS],
    };
    let t0 = Instant::now();
    let mut kills_during_writes = 0;
    for round in 1..=rounds {
        // 1-3 writers on distinct slots.
        let n = 1 + rng.below(SLOTS as u64) as usize;
        let mut slots: Vec<usize> = (0..SLOTS).collect();
        for i in (1..slots.len()).rev() {
            slots.swap(i, rng.below(i as u64 + 1) as usize);
        }
        slots.truncate(n);
        let mut children = Vec::new();
        let mut outs = Vec::new();
        for &s in &slots {
            let name = run.slots[s].clone();
            let wseed = rng.next() % 1_000_000_007;
            run.file(&name);
            let (c, rx) = start_writer(&run.m, &run.files[&name], &name, wseed);
            children.push(c);
            outs.push((name, rx));
        }
        for (name, rx) in &outs {
            let l = rx.recv_timeout(Duration::from_secs(20)).unwrap_or_default();
            assert!(
                l.starts_with("started"),
                "round {round}: writer of {name} did not start: `{l}`\n{}",
                tail(&run.m.log())
            );
        }
        // The kill at a random moment of the writes: a time, by design.
        let_time_pass(Duration::from_millis(20 + rng.below(680)));
        run.m.crash();
        reap(&mut children, Duration::from_secs(15));
        let mut still_writing = false;
        for (name, rx) in &outs {
            let r = rx.try_recv().unwrap_or_default();
            // `ok` would mean the kill came after the writer finished.
            still_writing |= r.starts_with("err");
            assert!(
                !r.is_empty(),
                "round {round}: writer of {name} reported nothing"
            );
        }
        kills_during_writes += still_writing as usize;

        run.m.mount();
        for &s in &slots {
            let name = run.slots[s].clone();
            let len = run.verify(&name, round, seed);
            if len >= RETIRE {
                run.generation[s] += 1;
                run.slots[s] = format!("s{s}g{}", run.generation[s]);
            }
        }
        assert_fsck_clean(&run.m, round, seed);
    }
    // Every file ever written, once more, after all the crashes.
    let names: Vec<String> = run.files.keys().cloned().collect();
    let mut total = 0;
    for name in &names {
        total += run.verify(name, rounds, seed);
    }
    assert_fsck_clean(&run.m, rounds, seed);
    eprintln!(
        "{rounds} rounds in {:?}: {} files, {total} bytes, {kills_during_writes} kills landed mid-write",
        t0.elapsed(),
        names.len()
    );
    assert!(
        kills_during_writes * 10 >= rounds * 9,
        "too few kills landed during writes"
    );
}
