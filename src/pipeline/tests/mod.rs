//! Output streams end to end, over datanodes that fail or hang on
//! request (`storage::faulty`): pipeline recovery, resending what was not
//! acknowledged, generation stamps recorded before any replica carries
//! them, backpressure from a replica that does not answer, and what the
//! stream reports to its file log.

use std::time::{Duration, Instant};

use super::budget::Budget;
use super::ctx::{Done, StreamCtx};
use super::datanodes::{Attached, Datanodes, Health};
use super::outcome::{FileLog, FileOutcome};
use super::reader::{self, BadReplicas};
use super::stream::OutputStream;
use crate::error::{FsError, FsResult};
use crate::meta::{
    AdminState, BlockRow, Change, DnId, Kind, Meta, MetaStore, NewNode, ROOT_INO, UnderConstruction,
};
use crate::storage::faulty::{Fault, Faulty, Op};
use crate::storage::{Datanode, ReplicaState, Storage, StorageError};
use crate::sync::{Arc, Mutex, lock};

const PACKET: usize = 4096;
const BLOCK: u64 = 64 << 10;
/// The host the rigs run on, for host-local copies.
const HERE: &str = "here";

/// One thing the stream reported, as the tests look at it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Opened {
        gs: u64,
        durable: bool,
    },
    Changed {
        gs: u64,
        replicas: Vec<DnId>,
        durable: bool,
    },
    Finished,
    Closed {
        size: u64,
    },
    Truncating,
    Shrunk {
        size: u64,
    },
    Grown {
        size: u64,
    },
    Length,
}

/// A file log that records outcomes the way the filesystem does (one
/// commit each), remembers them, and checks the ordering rule: a new
/// generation stamp is recorded, durably, before any replica carries it.
struct TestLog {
    meta: Arc<dyn Meta>,
    nodes: Vec<Arc<Faulty>>,
    uc: UnderConstruction,
    under_construction: Mutex<bool>,
    seen: Mutex<Vec<Seen>>,
    /// Stamps recorded so far, by block id.
    stamps: Mutex<Vec<(u64, u64)>>,
    /// Rules broken, in words.
    broken: Mutex<Vec<String>>,
    /// When set, a close's commit waits here twice: once to say it is
    /// about to commit, once for the test to let it.
    gate: Mutex<Option<Arc<std::sync::Barrier>>>,
}

impl TestLog {
    /// Checks that a row with a stamp not recorded before is recorded
    /// durably, while no replica carries it yet.
    fn check_new_stamps(&self, rows: &[&BlockRow], durable: bool) {
        let mut stamps = lock(&self.stamps);
        for row in rows {
            let known = stamps
                .iter()
                .any(|&(b, gs)| b == row.block_id && gs >= row.gs);
            if known {
                continue;
            }
            let first = !stamps.iter().any(|&(b, _)| b == row.block_id);
            stamps.push((row.block_id, row.gs));
            if first {
                continue;
            }
            if !durable {
                lock(&self.broken).push(format!("stamp {} recorded lazily", row.gs));
            }
            for n in &self.nodes {
                if let Some(r) = n.inner().find(row.block_id)
                    && r.gs >= row.gs
                {
                    lock(&self.broken).push(format!(
                        "datanode {} carries stamp {} before it was recorded",
                        n.id(),
                        r.gs
                    ));
                }
            }
        }
    }
}

impl FileLog for TestLog {
    fn record(&self, what: FileOutcome<'_>, durable: bool) -> FsResult<Vec<BlockRow>> {
        if matches!(what, FileOutcome::Closed { .. })
            && let Some(gate) = lock(&self.gate).clone()
        {
            gate.wait();
            gate.wait();
        }
        let ino = self.uc.ino;
        let mut building = lock(&self.under_construction);
        let put_uc = |uc: &mut bool, ch: &mut Vec<Change>| {
            if !*uc {
                ch.push(Change::PutUc(self.uc.clone()));
                *uc = true;
            }
        };
        let mut ch = Vec::new();
        let seen = match what {
            FileOutcome::Opened(row) => {
                self.check_new_stamps(&[row], durable);
                put_uc(&mut building, &mut ch);
                ch.push(Change::PutBlock(row.clone()));
                Seen::Opened {
                    gs: row.gs,
                    durable,
                }
            }
            FileOutcome::Changed(rows) => {
                self.check_new_stamps(&rows.iter().collect::<Vec<_>>(), durable);
                ch.extend(rows.iter().cloned().map(Change::PutBlock));
                Seen::Changed {
                    gs: rows[0].gs,
                    replicas: sorted(&rows[0].replicas),
                    durable,
                }
            }
            FileOutcome::Finished {
                row,
                size,
                mtime,
                journal,
            } => {
                put_uc(&mut building, &mut ch);
                ch.push(Change::PutBlock(row.clone()));
                ch.push(Change::SetSize {
                    ino,
                    size,
                    touch: mtime,
                });
                ch.extend(
                    journal.map(|data| Change::Journal(crate::meta::JournalRow::of(row, data))),
                );
                Seen::Finished
            }
            FileOutcome::Closed {
                last,
                size,
                mtime,
                journal,
            } => {
                ch.extend(last.cloned().map(Change::PutBlock));
                ch.push(Change::SetSize {
                    ino,
                    size,
                    touch: mtime,
                });
                ch.push(Change::DelUc(ino));
                ch.extend(
                    last.zip(journal)
                        .map(|(row, data)| Change::Journal(crate::meta::JournalRow::of(row, data))),
                );
                *building = false;
                Seen::Closed { size }
            }
            FileOutcome::Truncating => {
                put_uc(&mut building, &mut ch);
                Seen::Truncating
            }
            FileOutcome::Shrunk {
                size,
                mtime,
                drop_from,
                cut,
            } => {
                if let Some(cut) = cut {
                    self.check_new_stamps(&[cut], durable);
                }
                ch.push(Change::DropBlocksFrom {
                    ino,
                    from: drop_from,
                });
                ch.push(Change::SetSize {
                    ino,
                    size,
                    touch: Some(mtime),
                });
                ch.extend(cut.cloned().map(Change::PutBlock));
                Seen::Shrunk { size }
            }
            FileOutcome::Grown { open, size, mtime } => {
                ch.extend(open.cloned().map(Change::PutBlock));
                ch.push(Change::SetSize {
                    ino,
                    size,
                    touch: Some(mtime),
                });
                Seen::Grown { size }
            }
            FileOutcome::Length { size, mtime } => {
                ch.push(Change::SetSize {
                    ino,
                    size,
                    touch: mtime,
                });
                Seen::Length
            }
        };
        lock(&self.seen).push(seen);
        if ch.is_empty() {
            return Ok(Vec::new());
        }
        self.meta.commit(&ch, durable)
    }
}

/// A regular file of root's, in blocks of [`BLOCK`].
fn file_node() -> NewNode<'static> {
    NewNode {
        kind: Kind::File,
        mode: 0o644,
        uid: 0,
        gid: 0,
        rdev: 0,
        target: None,
        block_size: BLOCK,
        xattrs: Vec::new(),
    }
}

/// A file in a metadata store and datanodes that fail on request.
struct Rig {
    ctx: Arc<StreamCtx>,
    meta: Arc<dyn Meta>,
    /// The same store, for its fault injection.
    store: Arc<MetaStore>,
    nodes: Vec<Arc<Faulty>>,
    dns: Arc<Datanodes>,
    ino: u64,
    /// Dropped after everything that uses it, the directory last.
    _rt: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

impl Rig {
    /// `n` datanodes, `replication` replicas per block, streams of
    /// `max_in_flight` packets of 4 KiB in blocks of 64 KiB.
    fn new(n: u32, replication: usize, max_in_flight: usize) -> Rig {
        Rig::with(n, replication, max_in_flight, true)
    }

    fn with(n: u32, replication: usize, max_in_flight: usize, sync_by_fs: bool) -> Rig {
        let hosts = vec![None; n as usize];
        Rig::on_hosts(&hosts, replication, max_in_flight, sync_by_fs)
    }

    /// Datanodes recorded with `hosts` (`None`: shared; `Some(h)`: host
    /// `h`'s copies), seen from host [`HERE`] with `-o local_copy`.
    fn on_hosts(
        hosts: &[Option<&str>],
        replication: usize,
        max_in_flight: usize,
        sync_by_fs: bool,
    ) -> Rig {
        let n = hosts.len() as u32;
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        let store = Arc::new(MetaStore::open(&dir.path().join("meta.db"), 0, 0).unwrap());
        let meta: Arc<dyn Meta> = store.clone();
        let nodes: Vec<Arc<Faulty>> = (0..n)
            .map(|i| {
                let root = dir.path().join(format!("dn{i}"));
                Arc::new(Faulty::new(Datanode::open(DnId(i), &root, None).unwrap()))
            })
            .collect();
        let (attached, absent): (Vec<_>, Vec<_>) = nodes
            .iter()
            .zip(hosts)
            .map(|(f, h)| Attached {
                host: h.map(str::to_string),
                ..Attached::shared(f.clone() as Arc<dyn Storage>)
            })
            .partition(|a| a.host.as_deref().is_none_or(|h| h == HERE));
        // Another host's copies are recorded, never attached.
        let absent = absent
            .into_iter()
            .map(|a| super::datanodes::Absent {
                record: crate::meta::DatanodeRecord {
                    id: a.node.id(),
                    storage_id: None,
                    path: a.node.root().to_path_buf(),
                    state: AdminState::Normal,
                    host: a.host,
                },
                why: "elsewhere".into(),
            })
            .collect();
        let here = super::copies::HostCopies {
            host: Some(HERE.into()),
            local_copy: hosts.iter().any(Option::is_some),
        };
        let dns = Arc::new(Datanodes::new(attached, absent, replication).on_host(here));
        dns.heartbeat();
        let inode = meta.create(ROOT_INO, b"f", file_node()).unwrap();
        let ctx = Arc::new(StreamCtx {
            meta: meta.clone(),
            dns: dns.clone(),
            rt: rt.handle().clone(),
            packet_size: PACKET,
            max_in_flight,
            publish_lengths: false,
            sync_by_fs,
            bad: Arc::new(BadReplicas::default()),
            ledger: Default::default(),
            budget: Budget::new(1024, rt.handle().clone()),
            metrics: Arc::default(),
            journal: Default::default(),
            floor: Default::default(),
        });
        Rig {
            _dir: dir,
            _rt: rt,
            meta,
            store,
            nodes,
            dns,
            ctx,
            ino: inode.ino,
        }
    }

    /// What another daemon sharing the namespace and the datanodes has of
    /// its own: its streams' context (its own ledger, write buffer and
    /// statistics).
    fn other_daemon(&self) -> Arc<StreamCtx> {
        let c = &self.ctx;
        Arc::new(StreamCtx {
            meta: c.meta.clone(),
            dns: c.dns.clone(),
            rt: c.rt.clone(),
            packet_size: c.packet_size,
            max_in_flight: c.max_in_flight,
            publish_lengths: c.publish_lengths,
            sync_by_fs: c.sync_by_fs,
            bad: Arc::new(BadReplicas::default()),
            ledger: Default::default(),
            budget: Budget::new(1024, c.rt.clone()),
            metrics: Arc::default(),
            journal: Default::default(),
            floor: Default::default(),
        })
    }

    fn log(&self) -> Arc<TestLog> {
        Arc::new(TestLog {
            meta: self.meta.clone(),
            nodes: self.nodes.clone(),
            uc: UnderConstruction {
                ino: self.ino,
                holder: "test:1".into(),
                pid: 1,
                comm: "test".into(),
                epoch: 1,
                mount_id: "test".into(),
                since_ms: 0,
            },
            under_construction: Mutex::new(false),
            seen: Mutex::default(),
            stamps: Mutex::default(),
            broken: Mutex::default(),
            gate: Mutex::default(),
        })
    }

    /// A stream at the file's end, reporting to `log`.
    fn stream(&self, log: &Arc<TestLog>) -> Arc<OutputStream> {
        let size = self.meta.get(self.ino).unwrap().size;
        OutputStream::new(self.ctx.clone(), self.ino, size, BLOCK, log.clone(), 0)
    }

    fn blocks(&self) -> Vec<BlockRow> {
        self.meta.blocks(self.ino).unwrap()
    }

    /// The file's first `len` bytes, read back through the read path.
    fn read(&self, len: u64) -> Vec<u8> {
        let mut skipped = Vec::new();
        reader::read(
            &self.dns,
            &self.ctx.bad,
            None,
            &self.blocks(),
            BLOCK,
            len,
            0,
            len as usize,
            &mut skipped,
        )
        .unwrap()
    }
}

/// Runs `f` with a completion and waits for it.
fn wait(f: impl FnOnce(Done)) -> FsResult<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    f(Box::new(move |r| {
        let _ = tx.send(r);
    }));
    rx.recv_timeout(Duration::from_secs(30))
        .expect("the stream never completed")
}

/// Closes committed on their caller's thread (`OutputStream::close`).
fn closes_on_caller(rig: &Rig) -> u64 {
    let mut snap = crate::metrics::Snapshot::default();
    rig.ctx.metrics.fill(&mut snap);
    snap.closes_on_caller
}

fn write(s: &Arc<OutputStream>, data: &[u8]) -> FsResult<()> {
    wait(|d| s.write(None, data, d))
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

/// Pipelines are drawn at random: compare them as sets.
fn sorted(dns: &[DnId]) -> Vec<DnId> {
    let mut v = dns.to_vec();
    v.sort();
    v
}

fn seen(log: &TestLog) -> Vec<Seen> {
    lock(&log.seen).clone()
}

fn assert_unbroken(log: &TestLog) {
    assert!(lock(&log.broken).is_empty(), "{:?}", lock(&log.broken));
}

#[test]
fn a_stream_writes_every_replica_and_its_close_records_the_file() {
    let rig = Rig::new(3, 3, 8);
    let log = rig.log();
    let s = rig.stream(&log);
    let data = bytes(20_000, 1);
    write(&s, &data[..7000]).unwrap();
    write(&s, &data[7000..]).unwrap();
    wait(|d| s.close(d)).unwrap();
    assert_eq!(s.visible_len(), 20_000);
    assert_eq!(
        seen(&log),
        [
            Seen::Opened {
                gs: rig.blocks()[0].gs,
                durable: false
            },
            Seen::Closed { size: 20_000 }
        ]
    );
    let rows = rig.blocks();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].finalized);
    assert_eq!(rows[0].len, 20_000);
    assert_eq!(sorted(&rows[0].replicas), [DnId(0), DnId(1), DnId(2)]);
    for n in &rig.nodes {
        let r = n.find(rows[0].block_id).unwrap();
        assert_eq!((r.state, r.data_len), (ReplicaState::Finalized, 20_000));
    }
    assert_eq!(rig.read(20_000), data);
    assert_eq!(rig.meta.get(rig.ino).unwrap().size, 20_000);
    assert!(rig.meta.uc(rig.ino).unwrap().is_none());
    // Closing again (as RELEASE does after close()) changes nothing.
    wait(|d| s.close(d)).unwrap();
    assert_eq!(seen(&log).last(), Some(&Seen::Closed { size: 20_000 }));
    assert_eq!(rig.blocks(), rows);
}

#[test]
fn a_file_that_fits_in_its_first_packet_is_closed_in_one_record_with_no_rbw_replica() {
    let rig = Rig::new(3, 3, 8);
    let log = rig.log();
    let s = rig.stream(&log);
    let data = bytes(3000, 4);
    write(&s, &data[..1000]).unwrap();
    write(&s, &data[1000..]).unwrap();
    // Nothing went to a replica before the close.
    assert!(rig.nodes.iter().all(|n| n.calls(Op::Create) == 0));
    assert_eq!(s.visible_len(), 0);
    wait(|d| s.close(d)).unwrap();
    assert_eq!(s.visible_len(), 3000);
    // Block and close in one record: never under construction.
    assert_eq!(seen(&log), [Seen::Closed { size: 3000 }]);
    let rows = rig.blocks();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].finalized);
    assert_eq!(rows[0].len, 3000);
    assert_eq!(sorted(&rows[0].replicas), [DnId(0), DnId(1), DnId(2)]);
    for n in &rig.nodes {
        let r = n.find(rows[0].block_id).unwrap();
        assert_eq!((r.state, r.data_len), (ReplicaState::Finalized, 3000));
        assert_eq!(r.gs, rows[0].gs);
        assert_eq!(n.calls(Op::Finalize), 0, "no rename from rbw/");
        let rbw = std::fs::read_dir(n.root().join("rbw")).unwrap().count();
        assert_eq!(rbw, 0);
    }
    assert_eq!(rig.read(3000), data);
    assert_eq!(rig.meta.get(rig.ino).unwrap().size, 3000);
    assert!(rig.meta.uc(rig.ino).unwrap().is_none());
    // An append afterwards reopens the block as on any closed file.
    write(&s, &data[..100]).unwrap();
    wait(|d| s.close(d)).unwrap();
    assert_eq!(rig.meta.get(rig.ino).unwrap().size, 3100);
    assert_eq!(rig.blocks().len(), 1);
    assert_unbroken(&log);
}

#[test]
fn a_small_file_fsynced_before_its_close_is_written_whole_and_its_close_touches_no_replica() {
    let rig = Rig::new(3, 3, 8);
    rig.ctx.journal.hold_checkpoints();
    // One `syncfs` each, so that every replica's sync shows.
    for n in &rig.nodes {
        n.own_filesystem();
    }
    let log = rig.log();
    let s = rig.stream(&log);
    let data = bytes(3000, 6);
    write(&s, &data).unwrap();
    wait(|d| s.sync(d)).unwrap();
    assert_eq!(s.visible_len(), 3000);
    // One record: the finished block of a file still under construction.
    assert_eq!(seen(&log), [Seen::Finished]);
    assert!(rig.meta.uc(rig.ino).unwrap().is_some());
    assert_eq!(rig.meta.get(rig.ino).unwrap().size, 3000);
    let rows = rig.blocks();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].finalized);
    assert_eq!(rows[0].len, 3000);
    assert_eq!(sorted(&rows[0].replicas), [DnId(0), DnId(1), DnId(2)]);
    let calls = |op| rig.nodes.iter().map(|n| n.calls(op)).collect::<Vec<u64>>();
    let (syncs, creates) = (calls(Op::Sync), calls(Op::Create));
    for n in &rig.nodes {
        let r = n.find(rows[0].block_id).unwrap();
        assert_eq!((r.state, r.data_len), (ReplicaState::Finalized, 3000));
        // Made durable by the block journal: its bytes are in the store.
        assert_eq!(n.calls(Op::Sync), 0, "the fsync synced no replica");
        assert_eq!(n.io().fast_paths().journaled, 1);
        assert_eq!(n.io().fast_paths().one_step_synced, 1);
        assert_eq!(n.io().fast_paths().one_step_replicas, 0);
        let rbw = std::fs::read_dir(n.root().join("rbw")).unwrap().count();
        assert_eq!(rbw, 0);
    }
    // The close records the file closed and touches no replica: one
    // commit, made on the caller's thread (done before `close` returns).
    let (tx, rx) = std::sync::mpsc::channel();
    s.close(Box::new(move |r| {
        let _ = tx.send(r);
    }));
    assert!(matches!(rx.try_recv(), Ok(Ok(()))), "closed by its caller");
    assert_eq!(closes_on_caller(&rig), 1);
    assert_eq!(seen(&log), [Seen::Finished, Seen::Closed { size: 3000 }]);
    assert!(rig.meta.uc(rig.ino).unwrap().is_none());
    for n in &rig.nodes {
        assert_eq!(n.calls(Op::Finalize), 0, "no rename from rbw/");
    }
    assert_eq!((calls(Op::Sync), calls(Op::Create)), (syncs, creates));
    assert_eq!(rig.blocks(), rows);
    let journal = rig.meta.journal_rows().unwrap();
    assert_eq!(journal.len(), 1);
    assert_eq!(
        (journal[0].block_id, &journal[0].data),
        (rows[0].block_id, &data)
    );
    // The checkpoint syncs every replica (one `syncfs` each) and forgets
    // the row.
    assert_eq!(super::journal::checkpoint(&rig.ctx).unwrap(), 1);
    for n in &rig.nodes {
        assert!(n.calls(Op::Sync) > 0, "the checkpoint synced every replica");
    }
    assert!(rig.meta.journal_rows().unwrap().is_empty());
    assert_eq!(rig.ctx.journal.pending(), 0);
    assert_eq!(rig.read(3000), data);
    assert_unbroken(&log);
    // A write after such an fsync reopens the block for append, under a
    // new stamp recorded first, and a second fsync syncs it as any other.
    let rig = Rig::new(2, 2, 8);
    let log = rig.log();
    let s = rig.stream(&log);
    write(&s, &data[..1000]).unwrap();
    wait(|d| s.sync(d)).unwrap();
    let first = rig.blocks()[0].gs;
    write(&s, &data[1000..]).unwrap();
    wait(|d| s.sync(d)).unwrap();
    assert_eq!(s.visible_len(), 3000);
    let Seen::Opened { gs, durable: true } = seen(&log)[1] else {
        panic!("{:?}", seen(&log))
    };
    assert!(gs > first);
    // Its block is open again: this close finalises it, through the worker.
    wait(|d| s.close(d)).unwrap();
    assert_eq!(closes_on_caller(&rig), 0);
    assert_eq!(rig.read(3000), data);
    assert_eq!(rig.meta.get(rig.ino).unwrap().size, 3000);
    assert!(rig.meta.uc(rig.ino).unwrap().is_none());
    assert_unbroken(&log);
}

#[test]
fn a_failed_sync_of_a_small_file_written_whole_fails_its_fsync_and_the_stream() {
    let rig = Rig::new(2, 2, 8);
    // The path without the block journal (over etcd, or with its
    // checkpoint behind); the journal's own failures: `tests::journal`.
    rig.ctx.journal.set_enabled(false);
    let log = rig.log();
    let s = rig.stream(&log);
    for n in &rig.nodes {
        n.arm(Op::Sync, Fault::Fail(libc::EIO), 0);
    }
    write(&s, &bytes(2000, 7)).unwrap();
    let r = wait(|d| s.sync(d));
    assert!(r.is_err(), "{r:?}");
    for n in &rig.nodes {
        assert_eq!(n.io().fast_paths().one_step_synced, 1);
    }
    // Nothing is acknowledged, and the stream stays failed: a later fsync
    // cannot report success for what the failed one did not make durable.
    assert_eq!(s.visible_len(), 0);
    assert!(wait(|d| s.sync(d)).is_err());
    assert!(wait(|d| s.close(d)).is_err());
}

#[test]
fn a_whole_block_write_that_fails_on_a_datanode_goes_to_a_spare() {
    let rig = Rig::new(3, 2, 8);
    let log = rig.log();
    let s = rig.stream(&log);
    for n in &rig.nodes[..2] {
        n.arm(Op::Write, Fault::Fail(libc::ENOSPC), 0);
    }
    let data = bytes(2000, 5);
    write(&s, &data).unwrap();
    wait(|d| s.close(d)).unwrap();
    let row = rig.blocks().remove(0);
    // Whichever two the pipeline drew, the third took what the full ones
    // could not; with only one datanode left the block has one replica.
    assert_eq!(row.replicas, [DnId(2)]);
    assert_eq!(rig.dns.health(DnId(0)), Health::Full);
    assert_eq!(rig.read(2000), data);
    // Every datanode failing is the close's error.
    let rig = Rig::new(2, 2, 8);
    let log = rig.log();
    let s = rig.stream(&log);
    for n in &rig.nodes {
        n.arm(Op::Create, Fault::Fail(libc::EIO), 0);
    }
    write(&s, &data).unwrap();
    assert!(matches!(wait(|d| s.close(d)), Err(FsError::Io(_))));
    assert!(rig.blocks().is_empty());
    assert_eq!(rig.meta.get(rig.ino).unwrap().size, 0);
}

#[test]
fn a_replica_failing_mid_block_leaves_the_pipeline_under_a_new_stamp_and_the_packet_is_resent() {
    let rig = Rig::new(3, 3, 16);
    let log = rig.log();
    let s = rig.stream(&log);
    // The third packet fails on datanode 1, which no spare replaces (all
    // three are in the pipeline).
    rig.nodes[1].arm(Op::Write, Fault::Fail(libc::EIO), 2);
    let data = bytes(10 * PACKET, 2);
    write(&s, &data).unwrap();
    wait(|d| s.flush(d)).unwrap();
    assert_eq!(s.visible_len(), data.len() as u64);
    let row = rig.blocks().remove(0);
    let Seen::Opened { gs: first, .. } = seen(&log)[0] else {
        panic!("{:?}", seen(&log))
    };
    assert!(row.gs > first);
    assert_eq!(sorted(&row.replicas), [DnId(0), DnId(2)]);
    assert!(seen(&log).contains(&Seen::Changed {
        gs: row.gs,
        replicas: vec![DnId(0), DnId(2)],
        durable: true
    }));
    assert_unbroken(&log);
    // The dropped replica is recognisably stale; the survivors hold every
    // byte, the resent packet included.
    assert_eq!(rig.nodes[1].find(row.block_id).unwrap().gs, first);
    assert!(matches!(
        rig.nodes[1].valid_prefix(row.block_id, row.gs),
        Err(StorageError::StaleGenStamp { .. })
    ));
    for k in [0, 2] {
        assert_eq!(
            rig.nodes[k].valid_prefix(row.block_id, row.gs).unwrap(),
            data.len() as u64
        );
    }
    assert_eq!(rig.dns.health(DnId(1)), Health::Dead);
    assert_eq!(rig.read(data.len() as u64), data);
}

#[test]
fn pipeline_recovery_copies_the_acknowledged_prefix_to_a_spare() {
    let rig = Rig::new(3, 2, 16);
    let log = rig.log();
    let s = rig.stream(&log);
    let data = bytes(6 * PACKET, 3);
    write(&s, &data[..PACKET]).unwrap();
    wait(|d| s.flush(d)).unwrap();
    let before = rig.blocks().remove(0).replicas;
    let spare = (0..3)
        .map(DnId)
        .find(|d| !before.contains(d))
        .expect("one datanode is not in the pipeline");
    let full = before[0];
    rig.nodes[full.0 as usize].arm(Op::Write, Fault::Fail(libc::ENOSPC), 0);
    write(&s, &data[PACKET..]).unwrap();
    wait(|d| s.close(d)).unwrap();
    let row = rig.blocks().remove(0);
    assert_eq!(row.replicas, [before[1], spare]);
    assert_eq!(rig.dns.health(full), Health::Full, "ENOSPC: full, not dead");
    let copy = &rig.nodes[spare.0 as usize];
    assert_eq!(copy.calls(Op::Copy), 1);
    assert_eq!(
        copy.valid_prefix(row.block_id, row.gs).unwrap(),
        data.len() as u64
    );
    assert_unbroken(&log);
    assert_eq!(rig.read(data.len() as u64), data);
}

#[test]
fn when_every_replica_fails_the_writer_gets_eio_and_the_acknowledged_prefix_stays() {
    let rig = Rig::new(2, 2, 16);
    let log = rig.log();
    let s = rig.stream(&log);
    for n in &rig.nodes {
        n.arm(Op::Write, Fault::Fail(libc::EIO), 1);
    }
    let data = bytes(3 * PACKET, 4);
    write(&s, &data).unwrap();
    let e = wait(|d| s.flush(d)).unwrap_err();
    assert!(matches!(e, FsError::Io(_)), "{e}");
    assert_eq!(e.errno(), libc::EIO);
    assert!(write(&s, b"more").is_err());
    assert!(s.is_failed().is_some());
    assert_eq!(s.visible_len(), PACKET as u64);
    assert_eq!(rig.read(PACKET as u64), &data[..PACKET]);
}

/// Heals a datanode when dropped: a test that holds one fails rather
/// than hangs when an assertion fails first.
struct Heal<'a>(&'a Faulty);

impl Drop for Heal<'_> {
    fn drop(&mut self) {
        self.0.heal();
    }
}

#[test]
fn a_replica_that_does_not_answer_holds_its_writer_at_the_in_flight_bound() {
    let rig = Rig::new(1, 1, 2);
    let log = rig.log();
    let s = rig.stream(&log);
    rig.nodes[0].arm(Op::Write, Fault::Hold, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    let data = bytes(5 * PACKET, 5);
    s.write(
        None,
        &data,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    // The worker is stuck in the first packet's write.
    let deadline = Instant::now() + Duration::from_secs(10);
    while rig.nodes[0].calls(Op::Write) == 0 {
        assert!(Instant::now() < deadline, "the worker never wrote");
        std::thread::sleep(Duration::from_millis(1));
    }
    let st = s.stats();
    assert_eq!((st.in_flight, st.acked), (2, 0));
    assert_eq!(
        st.pos,
        3 * PACKET as u64,
        "two packets sent, one full waiting"
    );
    assert!(rx.try_recv().is_err(), "the write returned past the bound");
    rig.nodes[0].heal();
    rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    wait(|d| s.flush(d)).unwrap();
    assert_eq!(s.visible_len(), data.len() as u64);
    assert!(s.stats().peak_in_flight <= 3);
}

/// A datanode that asks for merged writes (an object store) gets the
/// packets that queued behind a slow write as one write, beside a
/// directory that takes it as it comes; every packet is acknowledged, the
/// stream may hold twice its bound meanwhile, and both replicas hold
/// every byte.
#[test]
fn packets_queued_behind_a_slow_write_go_to_a_merging_datanode_as_one_write() {
    let rig = Rig::new(2, 2, 8);
    rig.nodes[0].merge_writes_up_to(4 * PACKET as u64);
    let log = rig.log();
    let s = rig.stream(&log);
    let data = bytes(12 * PACKET, 8);
    // The first packet opens the block; the second one's write is held
    // while the writer queues every other packet behind it: 11 in flight,
    // past the bound of 8 (twice it on a merging block).
    rig.nodes[0].arm(Op::Write, Fault::Hold, 1);
    // Let the held write go even when an assertion fails, so that the test
    // fails rather than hangs.
    let _heal = Heal(&rig.nodes[0]);
    write(&s, &data).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while s.stats().in_flight < 11 || rig.nodes[0].calls(Op::Write) < 2 {
        assert!(
            Instant::now() < deadline,
            "never 11 packets in flight: {:?}",
            s.stats()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(s.stats().max_in_flight, 16, "twice the bound");
    rig.nodes[0].heal();
    wait(|d| s.flush(d)).unwrap();
    assert_eq!(s.visible_len(), data.len() as u64);
    // 12 packets: the first alone, the held one with what had queued
    // behind it when it was taken, then at most 4 a write.
    for n in &rig.nodes {
        let writes = n.calls(Op::Write);
        assert!((4..=5).contains(&writes), "{writes} writes for 12 packets");
    }
    wait(|d| s.close(d)).unwrap();
    let row = rig.blocks().remove(0);
    for n in &rig.nodes {
        assert_eq!(
            n.valid_prefix(row.block_id, row.gs).unwrap(),
            data.len() as u64
        );
    }
    assert_eq!(rig.read(data.len() as u64), data);
    assert_unbroken(&log);
}

#[test]
fn an_append_records_its_new_stamp_durably_before_any_replica_carries_it() {
    let rig = Rig::new(2, 2, 8);
    let data = bytes(3000, 6);
    let first = rig.log();
    let s = rig.stream(&first);
    write(&s, &data[..1000]).unwrap();
    wait(|d| s.close(d)).unwrap();
    let old = rig.blocks().remove(0);
    // A new writer (a new log) appends to the closed file's last block.
    let log = rig.log();
    lock(&log.stamps).push((old.block_id, old.gs));
    let s = rig.stream(&log);
    write(&s, &data[1000..]).unwrap();
    wait(|d| s.close(d)).unwrap();
    let row = rig.blocks().remove(0);
    assert_eq!(row.block_id, old.block_id);
    assert!(row.gs > old.gs);
    assert_eq!(
        seen(&log),
        [
            Seen::Opened {
                gs: row.gs,
                durable: true
            },
            Seen::Closed { size: 3000 }
        ]
    );
    assert_unbroken(&log);
    for n in &rig.nodes {
        let r = n.find(row.block_id).unwrap();
        assert_eq!((r.gs, r.state), (row.gs, ReplicaState::Finalized));
    }
    assert_eq!(rig.read(3000), data);
}

/// An append to a closed file reopens its replicas in parallel: while the
/// first datanode of the pipeline hangs in its reopen, the others reopen
/// theirs (one at a time, they would wait behind it); once it answers,
/// the append goes through on every replica.
#[test]
fn an_append_reopens_the_replicas_in_parallel() {
    let rig = Rig::new(3, 3, 8);
    let data = bytes(3000, 9);
    let first = rig.log();
    let s = rig.stream(&first);
    write(&s, &data[..1000]).unwrap();
    wait(|d| s.close(d)).unwrap();
    let old = rig.blocks().remove(0);
    let held = &rig.nodes[old.replicas[0].0 as usize];
    let others: Vec<_> = old.replicas[1..]
        .iter()
        .map(|dn| &rig.nodes[dn.0 as usize])
        .collect();
    held.arm(Op::Reopen, Fault::Hold, 0);
    // Heal even when an assertion fails, so that the test fails rather
    // than hangs.
    let heal = Heal(held);
    let log = rig.log();
    let s = rig.stream(&log);
    write(&s, &data[1000..]).unwrap();
    // Less than a packet: a flush sends it, and the worker reopens the
    // block for it.
    let (tx, rx) = std::sync::mpsc::channel();
    s.flush(Box::new(move |r| {
        let _ = tx.send(r);
    }));
    let deadline = Instant::now() + Duration::from_secs(10);
    while held.calls(Op::Reopen) == 0 || others.iter().any(|n| n.calls(Op::Reopen) == 0) {
        assert!(
            Instant::now() < deadline,
            "the other replicas waited for the held one: {:?}",
            others
                .iter()
                .map(|n| n.calls(Op::Reopen))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    drop(heal);
    rx.recv_timeout(Duration::from_secs(10)).unwrap().unwrap();
    wait(|d| s.close(d)).unwrap();
    let row = rig.blocks().remove(0);
    assert!(row.gs > old.gs);
    assert_eq!(row.replicas.len(), 3, "{row:?}");
    assert_unbroken(&log);
    assert_eq!(rig.read(3000), data);
}

#[test]
fn fsync_drops_a_replica_whose_sync_fails_and_records_that_durably() {
    let rig = Rig::with(2, 2, 8, false);
    let log = rig.log();
    let s = rig.stream(&log);
    rig.nodes[1].arm(Op::Sync, Fault::Fail(libc::EIO), 0);
    write(&s, &bytes(5000, 7)).unwrap();
    wait(|d| s.sync(d)).unwrap();
    let row = rig.blocks().remove(0);
    assert_eq!(row.replicas, [DnId(0)]);
    assert_eq!(
        seen(&log).last(),
        Some(&Seen::Changed {
            gs: row.gs,
            replicas: vec![DnId(0)],
            durable: true
        })
    );
    assert_eq!(rig.dns.health(DnId(1)), Health::Dead);
    assert_eq!(rig.ctx.bad.list(), [(row.block_id, DnId(1))]);
    // With every replica failing, the fsync fails.
    rig.nodes[0].arm(Op::Sync, Fault::Fail(libc::EIO), 0);
    write(&s, b"more").unwrap();
    assert!(wait(|d| s.sync(d)).is_err());
}

#[test]
fn a_truncation_is_recorded_durably_before_any_replica_is_cut() {
    let rig = Rig::new(2, 2, 8);
    let data = bytes(10_000, 8);
    let first = rig.log();
    let s = rig.stream(&first);
    write(&s, &data).unwrap();
    wait(|d| s.close(d)).unwrap();
    let old = rig.blocks().remove(0);
    let log = rig.log();
    lock(&log.stamps).push((old.block_id, old.gs));
    let s = rig.stream(&log);
    wait(|d| s.truncate(3000, d)).unwrap();
    assert_eq!(s.visible_len(), 3000);
    assert_eq!(seen(&log), [Seen::Truncating, Seen::Shrunk { size: 3000 }]);
    assert_unbroken(&log);
    let row = rig.blocks().remove(0);
    assert_eq!((row.len, row.block_id), (3000, old.block_id));
    assert!(row.gs > old.gs);
    for n in &rig.nodes {
        assert_eq!(n.valid_prefix(row.block_id, row.gs).unwrap(), 3000);
    }
    // Growing streams zeros through the packet path.
    wait(|d| s.truncate(5000, d)).unwrap();
    wait(|d| s.close(d)).unwrap();
    assert!(seen(&log).contains(&Seen::Grown { size: 5000 }));
    let mut want = data[..3000].to_vec();
    want.resize(5000, 0);
    assert_eq!(rig.read(5000), want);
}

mod copies;
mod flush_marks;
mod in_flight;
mod journal;
mod sync_faults;
mod synced_cache;
