//! The filesystem in process, for tests: a real [`Core`] over a SQLite
//! store and temporary datanodes, with a fake clock, no mount. Requests
//! are made as the adapter makes them and their replies awaited; lease
//! limits pass in microseconds by moving the clock, and the daemon's
//! background work (monitor tick, lease renewal) runs when a test says.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use super::core::{ClusterParts, Core, Instance};
use super::fake_cluster::{FakeCluster, FakeEpochs};
use super::namespace::Node;
use super::request::{Caller, Opened, Reply};
use crate::clock::{Clock, FakeClock};
use crate::config::MountOptions;
use crate::error::FsResult;
use crate::meta::{Kind, Meta, MetaStore, ROOT_INO};
use crate::pipeline::Datanodes;
use crate::storage::faulty::Faulty;
use crate::storage::{Datanode, DnId, Storage};
use crate::sync::Arc;

/// How long a test waits for a reply before it fails: far above anything
/// a request takes, so only a reply that never comes reaches it.
const REPLY_DEADLINE: Duration = Duration::from_secs(30);

pub struct TestFs {
    pub dir: tempfile::TempDir,
    pub meta: Arc<dyn Meta>,
    /// The same store, for its fault injection (a failing WAL sync).
    pub store: Arc<MetaStore>,
    pub clock: Arc<FakeClock>,
    pub core: Arc<Core>,
    pub opts: MountOptions,
    datanodes: usize,
    /// The datanodes, each able to fail or stall an operation a test picks.
    pub faults: Vec<Arc<Faulty>>,
    /// Set for a filesystem over a shared namespace (see [`TestFs::clustered`]).
    cluster: Option<Arc<FakeCluster>>,
    rt: tokio::runtime::Runtime,
}

/// The test process itself as the caller (root).
pub fn me() -> Caller {
    caller(std::process::id())
}

/// Process `pid` as the caller (root).
pub fn caller(pid: u32) -> Caller {
    Caller {
        pid,
        uid: 0,
        gid: 0,
    }
}

/// A node to create: `kind`, mode 0644 (0755 for directories).
pub fn node(kind: Kind) -> Node {
    Node {
        kind,
        mode: if kind == Kind::Dir { 0o755 } else { 0o644 },
        rdev: 0,
        target: None,
        umask: 0,
    }
}

/// Waits for the reply of a request.
pub fn wait<T: Send + 'static>(f: impl FnOnce(Reply<T>)) -> FsResult<T> {
    let (tx, rx) = mpsc::channel();
    f(Box::new(move |r| {
        let _ = tx.send(r);
    }));
    rx.recv_timeout(REPLY_DEADLINE)
        .expect("the request was never answered")
}

impl TestFs {
    /// A filesystem with `datanodes` datanodes (replication: all of them)
    /// and the given options.
    pub fn new(opts: MountOptions, datanodes: usize) -> TestFs {
        Self::build(opts, datanodes, None)
    }

    /// As [`TestFs::new`], as one daemon of several over a shared
    /// namespace: its claims are `cluster`'s, which the test may take away.
    pub fn clustered(opts: MountOptions, datanodes: usize, cluster: Arc<FakeCluster>) -> TestFs {
        Self::build(opts, datanodes, Some(cluster))
    }

    fn build(opts: MountOptions, datanodes: usize, cluster: Option<Arc<FakeCluster>>) -> TestFs {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Arc::new(MetaStore::open(&dir.path().join("meta.db"), 0, 0).expect("store"));
        let meta: Arc<dyn Meta> = store.clone();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .expect("runtime");
        let clock = Arc::new(FakeClock::new());
        let (core, faults) = Self::core_on(&dir, &meta, &rt, &clock, &opts, datanodes, &cluster);
        TestFs {
            dir,
            meta,
            store,
            clock,
            core,
            opts,
            datanodes,
            faults,
            cluster,
            rt,
        }
    }

    fn core_on(
        dir: &tempfile::TempDir,
        meta: &Arc<dyn Meta>,
        rt: &tokio::runtime::Runtime,
        clock: &Arc<FakeClock>,
        opts: &MountOptions,
        datanodes: usize,
        cluster: &Option<Arc<FakeCluster>>,
    ) -> (Arc<Core>, Vec<Arc<Faulty>>) {
        let dirs: Vec<PathBuf> = (1..=datanodes)
            .map(|i| dir.path().join(format!("dn{i}")))
            .collect();
        let faults: Vec<Arc<Faulty>> = dirs
            .iter()
            .enumerate()
            .map(|(i, d)| {
                Arc::new(Faulty::new(
                    Datanode::open(DnId(i as u32), d, None).expect("datanode"),
                ))
            })
            .collect();
        let nodes = faults
            .iter()
            .map(|f| f.clone() as Arc<dyn Storage>)
            .collect();
        let dns = Datanodes::of(nodes, datanodes);
        let clock: Arc<dyn Clock> = clock.clone();
        let mut instance = Instance::new();
        instance.cluster = cluster.as_ref().map(|c| ClusterParts {
            cluster: c.clone(),
            epochs: Box::new(FakeEpochs::default()),
        });
        let core = Core::new(
            meta.clone(),
            Arc::new(dns),
            opts.clone(),
            rt.handle().clone(),
            dir.path().join("data"),
            clock,
            instance,
        );
        (core, faults)
    }

    /// Another daemon on the same data directory and datanodes, as after a
    /// restart (the old core is dropped by the caller, or left as a
    /// daemon that died would be).
    pub fn restart(&mut self) -> Arc<Core> {
        (self.core, self.faults) = Self::core_on(
            &self.dir,
            &self.meta,
            &self.rt,
            &self.clock,
            &self.opts,
            self.datanodes,
            &self.cluster,
        );
        self.core.clone()
    }

    /// Creates a regular file in the root directory; its inode number.
    pub fn create(&self, name: &str) -> u64 {
        self.core
            .mknode(ROOT_INO, name.as_bytes(), node(Kind::File), me())
            .expect("create")
            .ino
    }

    pub fn open(&self, ino: u64, flags: i32, who: Caller) -> FsResult<u64> {
        wait(|r: Reply<Opened>| self.core.open(ino, flags, who, r)).map(|o| o.fh)
    }

    /// Appends `data` through `fh` (at offset `at`).
    pub fn write(&self, fh: u64, at: u64, data: &[u8]) -> FsResult<u32> {
        wait(|r| self.core.write(fh, at, data, (me(), false), r))
    }

    pub fn read(&self, fh: u64, at: u64, size: u32) -> FsResult<Vec<u8>> {
        wait(|r| self.core.read_any(fh, at, size, true, r))
    }

    pub fn fsync(&self, fh: u64) -> FsResult<()> {
        wait(|r| self.core.fsync(fh, r))
    }

    /// close(2): FLUSH, then RELEASE, as the kernel sends them.
    pub fn close(&self, fh: u64) -> FsResult<()> {
        wait(|r| self.core.flush(fh, me(), r))?;
        wait(|r| self.core.release(fh, r))
    }

    pub fn size(&self, ino: u64) -> u64 {
        self.core.getattr(ino).expect("getattr").size
    }

    /// One tick of the lease monitor, as the daemon runs it.
    pub fn monitor_tick(&self) {
        for t in self.core.leases.tick() {
            self.core.spawn_recovery(t);
        }
    }

    /// Waits until `cond` holds, failing the test with `what` after the
    /// reply deadline (recoveries run on the blocking pool).
    pub fn wait_until(&self, what: &str, cond: impl Fn() -> bool) {
        let end = std::time::Instant::now() + REPLY_DEADLINE;
        while !cond() {
            assert!(std::time::Instant::now() < end, "never happened: {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
