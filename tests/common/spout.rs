//! A `leasefs spout` instance the tests drive, and the helpers of the
//! spout tests (test files, publishing, lock entries), shared by the
//! single-mount and the multi-daemon spout tests.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use super::*;

/// One `leasefs spout` process; its stdout and stderr go to files outside
/// the mount. Killed (only this pid) if the test fails before it exits.
pub struct Inst {
    pub id: String,
    pub child: Child,
    pub out: PathBuf,
    pub err: PathBuf,
    pub status: Option<ExitStatus>,
    /// Copies a throttled stdout pipe to `out`; ends at EOF.
    pub pump: Option<std::thread::JoinHandle<()>>,
}

impl Inst {
    pub fn spawn(m: &Mount, id: &str, args: &[&str]) -> Inst {
        Self::spawn_with(m, id, args, None)
    }

    /// As `spawn`, but its stdout is a pipe read at about `kib_per_sec`
    /// KiB/s: a slow consumer, so that the test can catch the instance in
    /// the middle of a file on any machine. What the spout wrote into the
    /// pipe before dying still reaches `out` (it was emitted).
    pub fn spawn_slow(m: &Mount, id: &str, args: &[&str], kib_per_sec: u64) -> Inst {
        Self::spawn_with(m, id, args, Some(kib_per_sec))
    }

    pub fn spawn_with(m: &Mount, id: &str, args: &[&str], slow: Option<u64>) -> Inst {
        use std::io::{Read, Write};
        let out = m.dir.path().join(format!("{id}.out"));
        let err = m.dir.path().join(format!("{id}.err"));
        let file = std::fs::File::create(&out).expect("create out");
        let stdout = match slow {
            Some(_) => Stdio::piped(),
            None => Stdio::from(file.try_clone().expect("dup out")),
        };
        let mut child = Command::new(bin())
            .arg("spout")
            .arg("in")
            .args(["--done", "done", "--id", id])
            .args(args)
            .current_dir(&m.mnt)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(std::fs::File::create(&err).expect("create err"))
            .spawn()
            .expect("spawn leasefs spout");
        let pump = slow.map(|kib| {
            let mut pipe = child.stdout.take().expect("stdout pipe");
            let mut file = file;
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 4096];
                loop {
                    match pipe.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => file.write_all(&buf[..n]).expect("write out"),
                    }
                    // The consumer's pace: a time, by design.
                    let_time_pass(Duration::from_micros(4_000_000 / kib.max(1)));
                }
            })
        });
        Inst {
            id: id.to_string(),
            child,
            out,
            err,
            status: None,
            pump,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn signal(&self, sig: i32) {
        kill(self.pid(), sig);
    }

    /// Waits for the exit, asserting it comes within `max`.
    pub fn wait(&mut self, max: Duration) -> ExitStatus {
        let mut st = None;
        let exited = wait_until(max, || {
            st = self.child.try_wait().expect("try_wait");
            st.is_some()
        });
        let Some(st) = st.filter(|_| exited) else {
            panic!(
                "spout {} did not exit within {max:?}; stderr:\n{}",
                self.id,
                self.stderr()
            );
        };
        self.status = Some(st);
        if let Some(p) = self.pump.take() {
            let _ = p.join();
        }
        st
    }

    pub fn wait_ok(&mut self, max: Duration) {
        let st = self.wait(max);
        assert!(
            st.success(),
            "spout {} exited with {st}; stderr:\n{}",
            self.id,
            self.stderr()
        );
    }

    /// The complete lines of its output.
    pub fn stdout_lines(&self) -> Vec<String> {
        self.stdout_split().0
    }

    /// (complete lines, a last line without its newline). Only an instance
    /// killed in the middle of a write to a pipe leaves the latter: a
    /// pipe write of more than PIPE_BUF bytes is not atomic.
    pub fn stdout_split(&self) -> (Vec<String>, Option<String>) {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        let (complete, torn) = match text.rfind('\n') {
            Some(i) => (&text[..i + 1], &text[i + 1..]),
            None => ("", text.as_str()),
        };
        let torn = (!torn.is_empty()).then(|| torn.to_string());
        (complete.lines().map(str::to_string).collect(), torn)
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// (file name, resume offset) of every takeover this instance logged.
    pub fn takeovers(&self) -> Vec<(String, u64)> {
        self.stderr()
            .lines()
            .filter_map(|l| {
                let rest = l.split("took over idle lock ").nth(1)?;
                let path = rest.split_whitespace().next()?;
                let name = Path::new(path).file_name()?.to_string_lossy().into_owned();
                let off = l.split("resuming at offset ").nth(1)?.trim().parse().ok()?;
                Some((name, off))
            })
            .collect()
    }

    /// The files this instance started consuming from their beginning.
    pub fn consumed(&self) -> Vec<String> {
        self.stderr()
            .lines()
            .filter_map(|l| l.split("consuming ").nth(1))
            .map(|n| n.trim().to_string())
            .collect()
    }
}

impl Drop for Inst {
    fn drop(&mut self) {
        if self.status.is_none() && matches!(self.child.try_wait(), Ok(None)) {
            kill(self.pid(), libc::SIGCONT);
            kill(self.pid(), libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// The lines of a test file: `NAME 0000000`, `NAME 0000001`, ... (fixed
/// width, so line `i` starts at byte `i * (NAME.len() + 9)`).
pub fn lines_of(name: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{name} {i:07}")).collect()
}

pub fn line_offset(line: &str) -> (String, u64) {
    let (name, i) = line.rsplit_once(' ').expect("test line");
    let i: u64 = i.parse().expect("line number");
    (name.to_string(), i * (name.len() as u64 + 9))
}

/// Publishes a file the first safe way: written under `stage/` on the
/// same mount, then renamed into `in/` (atomic, complete when visible).
pub fn publish(m: &Mount, name: &str, lines: &[String]) {
    let staged = m.path(&format!("stage/{name}"));
    std::fs::create_dir_all(m.path("stage")).expect("mkdir stage");
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(&staged, text).expect("write staged file");
    std::fs::rename(&staged, m.path(&format!("in/{name}"))).expect("rename into in/");
}

pub fn setup(m: &Mount) {
    for d in ["in", "done", "stage"] {
        std::fs::create_dir_all(m.path(d)).expect("mkdir");
    }
}

pub fn names_in(m: &Mount, rel: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(m.path(rel))
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The last `time,id,offset` entry of a lock file, with its byte offset:
/// entries are written as Storm writes them (a newline before each entry
/// but the first), offsets as `0` or `{char=C:line=L:byte=B:}`.
pub fn last_entry(m: &Mount, rel: &str) -> Option<(String, u64)> {
    let text = std::fs::read_to_string(m.path(rel)).ok()?;
    let line = text.lines().rev().find(|l| !l.is_empty())?;
    let mut f = line.splitn(3, ',');
    let _time = f.next()?;
    let id = f.next()?.to_string();
    Some((id, entry_bytes(f.next()?)?))
}

/// The byte offset of a lock entry's offset field.
pub fn entry_bytes(offset: &str) -> Option<u64> {
    if offset == "0" {
        return Some(0);
    }
    let body = offset.strip_prefix('{')?.strip_suffix('}')?;
    body.split(':')
        .find_map(|kv| kv.strip_prefix("byte="))?
        .parse()
        .ok()
}

/// What Apache Storm's `TextFileReader.Offset` makes of an entry's offset
/// field: `0`, or `(char, line)` from the first two `:`-separated parts of
/// `{char=C:line=L:...}` (the text after each `=`); `None` where Storm
/// throws.
pub fn storm_offset(offset: &str) -> Option<(u64, u64)> {
    if offset.eq_ignore_ascii_case("0") {
        return Some((0, 0));
    }
    let parts: Vec<&str> = offset.split(':').collect();
    let value = |p: &str| p.split('=').nth(1)?.parse::<u64>().ok();
    Some((value(parts.first()?)?, value(parts.get(1)?)?))
}

/// The last entry of a lock file as Storm reads it (its last line, split
/// in three at the first two commas): (id, offset field).
pub fn storm_last_entry(m: &Mount, rel: &str) -> Option<(String, String)> {
    let text = std::fs::read_to_string(m.path(rel)).ok()?;
    let last = text.lines().last()?;
    let mut f = last.splitn(3, ',');
    f.next()?.parse::<u64>().ok()?;
    Some((f.next()?.to_string(), f.next()?.to_string()))
}

/// Waits until `rel`'s lock shows a commit by `id` past offset 0.
pub fn wait_committed(m: &Mount, rel: &str, id: &str) -> u64 {
    let mut last = None;
    let ok = wait_until(Duration::from_secs(20), || {
        last = last_entry(m, rel);
        matches!(&last, Some((who, off)) if who == id && *off > 0)
    });
    assert!(ok, "{rel}: no commit by {id}: last entry {last:?}");
    last.map(|(_, o)| o).unwrap_or(0)
}

/// How many times each line was emitted.
pub fn counts<'a>(lines: impl IntoIterator<Item = &'a String>) -> HashMap<&'a str, usize> {
    let mut c = HashMap::new();
    for l in lines {
        *c.entry(l.as_str()).or_insert(0) += 1;
    }
    c
}

/// Every line of `files` was emitted at least once and no other line was;
/// returns how many times each one was.
pub fn every_line_at_least_once<'a>(
    emitted: &'a [String],
    files: &BTreeMap<String, Vec<String>>,
) -> HashMap<&'a str, usize> {
    let c = counts(emitted);
    for (name, lines) in files {
        for l in lines {
            assert!(
                c.contains_key(l.as_str()),
                "{name}: line `{l}` never emitted"
            );
        }
    }
    let known: usize = files.values().map(Vec::len).sum();
    assert_eq!(c.len(), known, "unknown lines emitted");
    c
}
