//! What must be on the filesystem after a power cut, built from the
//! workloads' acknowledgement lines (see `work`), and the checks against
//! it. Only acknowledged steps bind: a step under way at the cut may show
//! its effect or not, but never a partial or foreign one.

use std::collections::BTreeMap;
use std::path::Path;

use super::content;
use super::work::version_name;

/// A file appended to (and maybe truncated): its bytes are known by offset.
#[derive(Debug, Default, Clone)]
pub struct Appended {
    /// The dir on the mount it lives in.
    pub dir: String,
    /// Length at the last fsync that returned.
    pub synced: u64,
    /// The length it must at least have: `synced`, lowered by a truncation
    /// begun after that fsync.
    pub min_len: u64,
}

#[derive(Debug, Default)]
struct Renamed {
    dir: String,
    /// The last version whose rename and directory fsync returned.
    acked: Option<(u64, u64)>,
    /// Versions fsynced and about to replace it: (version, length).
    attempted: Vec<(u64, u64)>,
}

#[derive(Debug, Default)]
pub struct Model {
    pub appended: BTreeMap<String, Appended>,
    renamed: BTreeMap<String, Renamed>,
    /// Created (fsynced, directory fsynced) and not being removed.
    live: BTreeMap<String, (String, u64)>,
    /// Removal begun, not acknowledged.
    maybe_gone: BTreeMap<String, (String, u64)>,
    /// Removal acknowledged.
    gone: BTreeMap<String, String>,
    small: BTreeMap<String, (String, u64)>,
    /// Spout source files whose publication was acknowledged: lines.
    pub published: BTreeMap<String, u64>,
    /// The highest lease epoch seen granted so far.
    pub max_epoch: u64,
    /// Epochs of election terms, in the order they began.
    pub terms: Vec<u64>,
    /// Next free version / file number of each renamed or numbered name.
    pub next: BTreeMap<String, u64>,
}

impl Model {
    /// Applies the lines of one acknowledgement file of a workload that
    /// ran in directory `dir`. Returns the problems the lines report (a
    /// step that failed) and the epochs granted.
    pub fn apply(&mut self, dir: &str, text: &str, is_term: bool) -> (Vec<String>, Vec<u64>) {
        let mut problems = Vec::new();
        let mut epochs = Vec::new();
        for line in text.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            let num = |i: usize| w.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            match w.first().copied() {
                Some("epoch") => {
                    epochs.push(num(1));
                    if is_term {
                        self.terms.push(num(1));
                    }
                }
                Some("synced") => {
                    let f = self.append_entry(dir, w[1]);
                    f.synced = num(2);
                    f.min_len = num(2);
                }
                Some("closed") => {
                    let f = self.append_entry(dir, w[1]);
                    f.synced = f.synced.max(num(2));
                    f.min_len = f.min_len.max(num(2));
                }
                Some("truncating") => {
                    let f = self.append_entry(dir, w[1]);
                    f.min_len = f.min_len.min(num(2));
                }
                Some("renaming") => {
                    let r = self.renamed.entry(w[1].to_string()).or_default();
                    r.dir = dir.to_string();
                    r.attempted.push((num(2), num(3)));
                    let n = self.next.entry(w[1].to_string()).or_insert(1);
                    *n = (*n).max(num(2) + 1);
                }
                Some("renamed") => {
                    let r = self.renamed.entry(w[1].to_string()).or_default();
                    r.acked = Some((num(2), num(3)));
                    let v = num(2);
                    r.attempted.retain(|a| a.0 > v);
                }
                Some("created") => {
                    self.live
                        .insert(w[1].to_string(), (dir.to_string(), num(2)));
                }
                Some("unlinking") => {
                    if let Some(e) = self.live.remove(w[1]) {
                        self.maybe_gone.insert(w[1].to_string(), e);
                    }
                }
                Some("unlinked") => {
                    self.maybe_gone.remove(w[1]);
                    self.gone.insert(w[1].to_string(), dir.to_string());
                }
                Some("small") => {
                    self.small
                        .insert(w[1].to_string(), (dir.to_string(), num(2)));
                }
                Some("published") => {
                    self.published.insert(w[1].to_string(), num(2));
                }
                Some("error") => problems.push(format!("workload step failed: {line}")),
                _ => {}
            }
        }
        (problems, epochs)
    }

    fn append_entry(&mut self, dir: &str, name: &str) -> &mut Appended {
        let f = self.appended.entry(name.to_string()).or_default();
        f.dir = dir.to_string();
        f
    }

    /// Checks the mount against everything acknowledged; returns problems.
    /// Afterwards the model follows what the mount holds where a cut left
    /// a choice (a rename or removal under way).
    pub fn check(&mut self, mnt: &Path) -> Vec<String> {
        let mut p = Vec::new();
        for (name, f) in &self.appended {
            let path = mnt.join(&f.dir).join(name);
            match std::fs::read(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && f.min_len == 0 => {}
                Err(e) => p.push(format!(
                    "{}/{name}: cannot read it ({} bytes fsynced): {e}",
                    f.dir, f.synced
                )),
                Ok(got) => {
                    if (got.len() as u64) < f.min_len {
                        p.push(format!(
                            "{}/{name}: {} bytes, but {} were fsynced",
                            f.dir,
                            got.len(),
                            f.min_len
                        ));
                    }
                    if let Some(k) = content::first_mismatch(name, &got) {
                        p.push(format!(
                            "{}/{name}: byte {k} of {} is not what was written ({} fsynced)",
                            f.dir,
                            got.len(),
                            f.synced
                        ));
                    }
                }
            }
        }
        for (name, r) in &mut self.renamed {
            let path = mnt.join(&r.dir).join(name);
            let got = match std::fs::read(&path) {
                Ok(g) => Some(g),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => {
                    p.push(format!("{}/{name}: cannot read it: {e}", r.dir));
                    continue;
                }
            };
            let candidates: Vec<(u64, u64)> = r.acked.iter().chain(&r.attempted).copied().collect();
            match got {
                None if r.acked.is_some() => p.push(format!(
                    "{}/{name}: missing, but version {:?} replaced it durably",
                    r.dir, r.acked
                )),
                None => r.attempted.clear(),
                Some(g) => {
                    let which = candidates.iter().find(|(v, len)| {
                        g.len() as u64 == *len
                            && content::first_mismatch(&version_name(name, *v), &g).is_none()
                    });
                    match which {
                        Some(&(v, len)) => {
                            r.acked = Some((v, len));
                            r.attempted.retain(|a| a.0 > v);
                        }
                        None => p.push(format!(
                            "{}/{name}: {} bytes that are no complete version of {candidates:?}",
                            r.dir,
                            g.len()
                        )),
                    }
                }
            }
        }
        let exact = |p: &mut Vec<String>, dir: &str, name: &str, len: u64| match std::fs::read(
            mnt.join(dir).join(name),
        ) {
            Ok(g) if g.len() as u64 == len && content::first_mismatch(name, &g).is_none() => {}
            Ok(g) => p.push(format!(
                "{dir}/{name}: {} bytes, expected {len} known bytes (first difference at {:?})",
                g.len(),
                content::first_mismatch(name, &g)
            )),
            Err(e) => p.push(format!("{dir}/{name}: fsynced ({len} bytes) but {e}")),
        };
        for (name, (dir, len)) in &self.live {
            exact(&mut p, dir, name, *len);
        }
        for (name, (dir, len)) in &self.small {
            exact(&mut p, dir, name, *len);
        }
        for (name, dir) in &self.gone {
            if mnt.join(dir).join(name).exists() {
                p.push(format!(
                    "{dir}/{name}: removed durably, but back after the cut"
                ));
            }
        }
        let maybe = std::mem::take(&mut self.maybe_gone);
        for (name, (dir, len)) in maybe {
            if mnt.join(&dir).join(&name).exists() {
                exact(&mut p, &dir, &name, len);
                self.live.insert(name, (dir, len));
            } else {
                self.gone.insert(name, dir);
            }
        }
        p
    }

    /// Forgets a file (retired: removed by the harness).
    pub fn forget(&mut self, name: &str) {
        self.appended.remove(name);
    }

    /// Keeps the sets of small, created and removed files from growing
    /// without end. Returns the small and created files no longer checked,
    /// as (directory, name), for the harness to remove: the filesystem
    /// stays bounded too (the powercut disk holds a descriptor per file the
    /// kernel knows). Each was checked after at least one cut.
    pub fn trim(&mut self, keep: usize) -> Vec<(String, String)> {
        let mut dropped = Vec::new();
        for set in [&mut self.small, &mut self.live] {
            while set.len() > keep {
                let Some((name, (dir, _))) = set.pop_first() else {
                    break;
                };
                dropped.push((dir, name));
            }
        }
        while self.gone.len() > keep {
            self.gone.pop_first();
        }
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A long run's created files (unlink workload) are bounded like its
    /// small files: the ones past `keep` leave the model and go to the
    /// harness for removal; removals still pending stay checked.
    #[test]
    fn trim_bounds_created_and_small_files() {
        let mut m = Model::default();
        let mut acks = String::new();
        for i in 0..8 {
            acks.push_str(&format!("created u1.{i} 10\nsmall s1.{i} 5\n"));
        }
        acks.push_str("unlinking u1.7\n");
        m.apply("u", &acks, false);
        let dropped = m.trim(3);
        assert_eq!(dropped.len(), 5 + 4);
        assert!(dropped.iter().any(|(d, n)| d == "u" && n == "u1.0"));
        assert!(dropped.iter().any(|(d, n)| d == "u" && n == "s1.0"));
        assert_eq!(m.live.len(), 3);
        assert_eq!(m.small.len(), 3);
        assert!(m.maybe_gone.contains_key("u1.7"));
        assert!(m.trim(3).is_empty());
    }
}
