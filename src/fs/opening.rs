//! Opening a file: for reading (never gated), for writing (the lease,
//! granted at once, queued with `lease_wait`, or refused), and the create
//! that opens what it made.

use std::time::Duration;

use super::cache::ReadMode;
use super::core::{Caller, Core, Opened, Opener, Reply};
use super::handles::Handle;
use super::{privs, proc_info};
use crate::error::FsError;
use crate::lease::{Acquire, AcquireOpts, Grant, Holder, LeaseError};
use crate::meta::{Inode, Kind, UnderConstruction};
use crate::pipeline::OutputStream;
use crate::pipeline::reader::OpenReplicas;
use crate::sync::{Arc, AtomicBool, Mutex, Ordering, lock};

impl Core {
    /// Opens `ino`. Readers are never gated; writers take the file's lease
    /// first, which may complete later (lease_wait, a pending release, or
    /// recovery of an expired holder).
    pub fn open(self: &Arc<Self>, ino: u64, flags: i32, caller: Caller, reply: Reply<Opened>) {
        self.open_as(ino, None, flags, caller, reply)
    }

    /// [`Self::open`], of the inode `created` when the same request just
    /// created it (see [`Opener::created`]).
    pub(super) fn open_as(
        self: &Arc<Self>,
        ino: u64,
        created: Option<Inode>,
        flags: i32,
        caller: Caller,
        reply: Reply<Opened>,
    ) {
        let write = flags & libc::O_ACCMODE != libc::O_RDONLY;
        let fh = self.handles.next_fh();
        if !write {
            return match self.meta().get(ino) {
                Ok(inode) => self.open_reader(fh, &inode, caller.uid, reply),
                Err(e) => reply(Err(e)),
            };
        }
        // A writer reads the inode once the lease is ours (`granted`), not
        // before: FUSE sends OPEN for regular files only (directories get
        // OPENDIR, the kernel keeps special files to itself), and anything
        // read before the grant could be stale by then.
        let who = proc_info::identity(caller.pid);
        let fence = self.fences.of(caller.pid, Some(&who));
        if let Err(e) = self.fences.check(fence, caller.uid) {
            return reply(Err(e));
        }
        let opener = Opener {
            who,
            uid: caller.uid,
            fence,
            fresh: created.is_some(),
            created: created.filter(|_| self.cluster.is_none()),
            again: None,
        };
        // Counted until answered; past its user's bound it does not wait
        // (see `waits`): only lease decisions read O_NONBLOCK.
        let permit = self.waits.enter(caller.uid);
        let flags = if permit.may_wait() {
            flags
        } else {
            flags | libc::O_NONBLOCK
        };
        let reply: Reply<Opened> = Box::new(move |r| {
            let _counted = permit;
            reply(r)
        });
        if let Some(cl) = self.cluster.clone() {
            // Claiming waits on the network: not on a request thread.
            let me = self.clone();
            self.ctx.rt.spawn_blocking(move || {
                let left = match me.claim(&*cl, ino, fh, flags, caller, &opener.who) {
                    Ok(left) => left,
                    Err(e) => return reply(Err(e)),
                };
                me.acquire_local(ino, fh, flags, caller, opener, left, reply)
            });
            return;
        }
        self.acquire_local(ino, fh, flags, caller, opener, None, reply)
    }

    /// A read-only handle (also what a write open of anything but a regular
    /// file gets). A file nobody changes is read through the page cache;
    /// one under construction directly, so that readers never see bytes
    /// not yet acknowledged nor a zero-filled last page (`cache`).
    fn open_reader(&self, fh: u64, inode: &Inode, uid: u32, reply: Reply<Opened>) {
        let ino = inode.ino;
        let mode = if inode.kind == Kind::File {
            self.read_mode(ino)
        } else {
            ReadMode::Direct
        };
        let h = Handle {
            fh,
            ino,
            write: false,
            append: false,
            sync_writes: false,
            cached: mode != ReadMode::Direct,
            epoch: 0,
            tgid: 0,
            fence: None,
            uid,
            flushed: Default::default(),
            fresh: Default::default(),
            stream: None,
            gate: Default::default(),
            replicas: OpenReplicas::new(uid),
        };
        self.handles.register(h);
        reply(Ok(match mode {
            ReadMode::Direct => Opened {
                fh,
                direct_io: true,
                keep_cache: false,
            },
            ReadMode::Cached { keep } => Opened {
                fh,
                direct_io: false,
                keep_cache: keep,
            },
        }))
    }

    /// Takes the file's lease among this daemon's handles (the whole
    /// decision on a lone daemon).
    /// `wait`: what is left of a wait begun in the queue across daemons
    /// (`None`: `lease_wait`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn acquire_local(
        self: &Arc<Self>,
        ino: u64,
        fh: u64,
        flags: i32,
        caller: Caller,
        opener: Opener,
        wait: Option<Duration>,
        reply: Reply<Opened>,
    ) {
        let who = &opener.who;
        let holder = Holder {
            host: self.host.clone(),
            pid: who.tgid,
            comm: who.comm.clone(),
            handle: fh,
            opened_wall_ms: crate::clock::wall_ms(),
        };
        let me = self.clone();
        let cont: Box<dyn FnOnce(Result<Grant, LeaseError>) + Send> = Box::new(move |g| {
            me.waiter_tids.remove(&fh);
            match g {
                Ok(grant) => me.granted(ino, fh, flags, opener, grant, reply),
                Err(e) => {
                    me.unclaim(ino, fh);
                    reply(Err(e.into()))
                }
            }
        });
        let opts = AcquireOpts {
            nonblock: flags & libc::O_NONBLOCK != 0,
        };
        // The callback is shared between the immediate and deferred paths.
        let slot = Arc::new(Mutex::new(Some(cont)));
        let slot2 = slot.clone();
        let cb: Box<dyn FnOnce(Result<Grant, LeaseError>) + Send> = Box::new(move |g| {
            if let Some(c) = lock(&slot2).take() {
                c(g)
            }
        });
        let take = || lock(&slot).take();
        match self.leases.acquire_within(ino, holder, opts, wait, cb) {
            Ok(Acquire::Granted(g)) => {
                if let Some(c) = take() {
                    c(Ok(g))
                }
            }
            Ok(Acquire::Queued) => {
                tracing::info!(
                    ino,
                    fh,
                    pid = caller.pid,
                    uid = caller.uid,
                    "queued for the lease"
                );
                self.waiter_tids.insert(fh, (caller.pid, caller.uid));
                // The grant may have come in between.
                if lock(&slot).is_none() {
                    self.waiter_tids.remove(&fh);
                }
            }
            Ok(Acquire::Recover(ticket)) => self.spawn_recovery(ticket),
            Err(e) => {
                if let Some(c) = take() {
                    c(Err(e))
                }
            }
        }
    }

    /// The mode of a read-only open of a regular file: through the page
    /// cache only while nothing may change it (no stream, lease free) and
    /// never over etcd, where other daemons change files without this one
    /// knowing.
    fn read_mode(&self, ino: u64) -> ReadMode {
        if self.cluster.is_some()
            || self.stream_of(ino).is_some()
            || self.leases.state(ino) != crate::lease::LeaseState::Free
        {
            return ReadMode::Direct;
        }
        self.cache.open_reader(ino)
    }

    /// The lease is ours: set up the file's output stream.
    #[allow(clippy::too_many_arguments)]
    fn granted(
        self: &Arc<Self>,
        ino: u64,
        fh: u64,
        flags: i32,
        opener: Opener,
        grant: Grant,
        reply: Reply<Opened>,
    ) {
        let Opener {
            who,
            uid,
            fence,
            created,
            fresh,
            again,
        } = opener;
        let found = match created {
            Some(i) => Ok((i, false)),
            None => self
                .meta()
                .get_with_xattr(ino, privs::CAPABILITY)
                .map(|(i, caps)| (i, caps.is_some())),
        };
        let (inode, has_caps) = match found {
            Ok((i, caps)) if i.kind == Kind::File => (i, caps),
            r => {
                self.leases.release(ino, fh);
                self.unclaim(ino, fh);
                return match r.map(|(i, _)| i) {
                    Ok(i) if i.kind == Kind::Dir => reply(Err(FsError::IsDir)),
                    Ok(i) => self.open_reader(fh, &i, uid, reply),
                    Err(e) => reply(Err(e)),
                };
            }
        };
        let uc = UnderConstruction {
            ino,
            holder: format!("{}:{}", self.host, who.tgid),
            pid: who.tgid,
            comm: who.comm,
            epoch: grant.epoch,
            mount_id: self.mount_id.clone(),
            since_ms: crate::clock::wall_ms(),
        };
        let bs = if inode.block_size == 0 {
            self.opts.block_size
        } else {
            inode.block_size
        };
        // From here until this handle's release the file may change: read
        // opens go direct and no longer keep earlier pages.
        self.cache.busy(ino);
        let log = Arc::new(self.file_record(uc));
        let stream = OutputStream::new(self.ctx.clone(), ino, inode.size, bs, log, uid);
        let h = Handle {
            fh,
            ino,
            write: true,
            append: flags & libc::O_APPEND != 0,
            // O_SYNC is O_DSYNC and more (the same for leasefs: an fsync).
            sync_writes: flags & libc::O_DSYNC != 0,
            cached: false,
            epoch: grant.epoch,
            tgid: who.tgid,
            fence,
            uid,
            flushed: Default::default(),
            fresh: AtomicBool::new(fresh),
            stream: Some(stream.clone()),
            replicas: OpenReplicas::new(uid),
            gate: again
                .clone()
                .unwrap_or_else(|| super::handles::Gate::new(grant.epoch)),
        };
        let of = self.handles.open_file(ino);
        *lock(&of.stream) = Some(stream.clone());
        of.privs
            .store(privs::at_open(&inode, has_caps), Ordering::Relaxed);
        if again.is_some() {
            self.handles.replace(h);
        } else {
            self.handles.register(h);
        }
        self.epochs.granted(ino, grant.epoch);
        tracing::debug!(ino, fh, epoch = grant.epoch, "write lease granted");
        // Writers never use the page cache (see `open`).
        let opened = Opened {
            fh,
            direct_io: true,
            keep_cache: false,
        };
        // O_TRUNC follows as a SETATTR through this descriptor (`set_size`).
        if self.cluster.is_some() {
            // Other daemons change the file: the kernel's size of it may
            // be theirs of before (see `PageCaches::tell_size`).
            let (me, size, epoch) = (self.clone(), inode.size, grant.epoch);
            self.ctx.rt.spawn_blocking(move || {
                me.record_grant(ino, epoch);
                me.tell_kernel_size(ino, size);
                reply(Ok(opened))
            });
            return;
        }
        reply(Ok(opened))
    }
}
