//! A report shown to a user who may not see every path in it (an online
//! fsck asked by anyone but root): entries naming files under directories
//! the user cannot list are left out and only counted, so that the
//! status, the exit code and the totals stay those of the whole
//! filesystem while no name leaks (docs/SEMANTICS.md, "The control
//! socket").

use serde::{Deserialize, Serialize};

use super::{ProblemKind, Report};

/// What was left out of a report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hidden {
    pub open_for_write: u64,
    pub problems: u64,
    /// Of the problems left out, the faults not repaired: they still make
    /// the status `CORRUPT` and the exit code 1.
    pub faults: u64,
    /// Of the problems left out, those repaired.
    pub repaired: u64,
}

impl Hidden {
    pub fn is_empty(&self) -> bool {
        *self == Hidden::default()
    }
}

impl ProblemKind {
    /// Whether the problem's `path` is a file of the namespace (not a
    /// replica file on a datanode, which names no file of any user).
    pub fn names_a_file(self) -> bool {
        !matches!(
            self,
            ProblemKind::OrphanReplica | ProblemKind::ExcessReplica
        )
    }
}

impl Report {
    /// Leaves out the files left open and the problems of files whose
    /// path `shows` refuses, counting them in [`Report::hidden`].
    pub fn hide(&mut self, shows: &mut dyn FnMut(&str) -> bool) {
        let before = self.open_for_write.len();
        self.open_for_write.retain(|f| shows(&f.path));
        self.hidden.open_for_write += (before - self.open_for_write.len()) as u64;
        let mut kept = Vec::with_capacity(self.problems.len());
        for p in std::mem::take(&mut self.problems) {
            if !p.kind.names_a_file() || shows(&p.path) {
                kept.push(p);
                continue;
            }
            self.hidden.problems += 1;
            if p.repaired {
                self.hidden.repaired += 1;
            } else if p.kind.is_fault() {
                self.hidden.faults += 1;
            }
        }
        self.problems = kept;
    }

    /// The summary's line about what was left out, if anything was.
    pub(super) fn hidden_line(&self) -> Option<String> {
        let h = &self.hidden;
        (!h.is_empty()).then(|| {
            format!(
                "\n Not shown: {} open files and {} problems ({} repaired) of files under directories you cannot list",
                h.open_for_write, h.problems, h.repaired
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsck::{OpenFile, Problem};

    fn problem(kind: ProblemKind, path: &str, repaired: bool) -> Problem {
        Problem {
            kind,
            path: path.into(),
            block: Some(1),
            datanode: Some(crate::meta::DnId(0)),
            detail: String::new(),
            repaired,
        }
    }

    #[test]
    fn hidden_entries_are_counted_and_still_decide_the_status() {
        let mut r = Report {
            open_for_write: vec![
                OpenFile {
                    path: "/secret/a".into(),
                    holder: "h:1".into(),
                    comm: "c".into(),
                    epoch: 1,
                    live: true,
                },
                OpenFile {
                    path: "/pub/b".into(),
                    holder: "h:2".into(),
                    comm: "c".into(),
                    epoch: 1,
                    live: true,
                },
            ],
            problems: vec![
                problem(ProblemKind::MissingReplica, "/secret/x", false),
                problem(ProblemKind::CorruptReplica, "/secret/y", true),
                problem(ProblemKind::OrphanReplica, "/dn/finalized/blk_1", false),
                problem(ProblemKind::BadLength, "/pub/z", true),
            ],
            ..Report::default()
        };
        let all = r.summary();
        r.hide(&mut |p: &str| !p.starts_with("/secret/"));
        assert_eq!(r.open_for_write.len(), 1);
        assert_eq!(r.problems.len(), 2, "{:?}", r.problems);
        assert_eq!(
            r.hidden,
            Hidden {
                open_for_write: 1,
                problems: 2,
                faults: 1,
                repaired: 1,
            }
        );
        assert_eq!(r.exit_code(), 1, "a hidden fault still counts");
        let shown = r.summary();
        assert!(!shown.contains("secret"), "{shown}");
        // The status and totals are the whole filesystem's.
        assert_eq!(
            shown.lines().take(8).collect::<Vec<_>>(),
            all.lines().take(8).collect::<Vec<_>>()
        );
        assert!(shown.contains("Not shown: 1 open files and 2 problems (1 repaired)"));
        // Nothing hidden: the JSON has no `hidden` at all (root's output
        // is as before).
        let v = serde_json::to_value(Report::default()).expect("JSON");
        assert!(v.get("hidden").is_none(), "{v}");
    }
}
