//! A close that ends the grant before it returns, over a shared namespace
//! (etcd), and the new grant a copy of the descriptor takes when it writes
//! after that close (docs/SEMANTICS.md "Several daemons").
//!
//! FUSE answers `close(2)` after FLUSH; RELEASE comes later, on its own,
//! and only once no copy of the open file description is left. Waiting
//! for RELEASE to give the file's claim up let a writer on another daemon
//! that opened right after `close()` returned find the file still claimed
//! (`EBUSY` in 16 of 80 tries). HDFS releases the lease in `completeFile`,
//! before the client's close returns; so does this: the holder's FLUSH
//! completes the file, then releases the local lease and the cluster claim,
//! then answers. The description may live on in copies (dup, fork, a
//! shell's redirection); one that writes or syncs afterwards takes the
//! file again as an `O_NONBLOCK` open would: a new grant, a new epoch, a
//! stream at the file's current end, or `EBUSY` when another writer has
//! it.

use std::sync::mpsc;

use super::core::{Caller, Core, Opener};
use super::handles::Handle;
use super::proc_info;
use crate::error::{FsError, FsResult};
use crate::meta::Change;
use crate::pipeline::OutputStream;
use crate::sync::{Arc, lock};

impl Core {
    /// The holder closed `h` (its stream closed without error): over etcd
    /// the grant ends before `reply` (see the module's doc). Anything a
    /// copy of the descriptor wrote meanwhile is closed first; writes from
    /// now on take a new grant.
    pub(super) fn end_grant_at_close(
        self: &Arc<Self>,
        h: Arc<Handle>,
        stream: Arc<OutputStream>,
        reply: Box<dyn FnOnce(FsResult<()>) + Send>,
    ) {
        let me = self.clone();
        self.ctx.rt.spawn_blocking(move || {
            if !h.gate.end_begin(h.epoch) {
                return reply(Ok(()));
            }
            let (tx, rx) = mpsc::channel();
            stream.close(Box::new(move |r| {
                let _ = tx.send(r);
            }));
            let r = rx.recv().unwrap_or(Err(FsError::BadHandle));
            if r.is_ok() {
                me.end_grant(&h, true);
            }
            h.gate.end_done(r.is_ok());
            reply(r)
        });
    }

    /// Write handle `h` no longer holds its file: its stream stops being
    /// the file's, its lease goes to the next waiter here and the cluster
    /// claim, once no handle here holds or waits for the file, is released
    /// (`now`: on this thread, before the caller answers; else in the
    /// background).
    pub(super) fn end_grant(&self, h: &Handle, now: bool) {
        let of = self.handles.open_file(h.ino);
        let mut s = lock(&of.stream);
        if s.as_ref()
            .is_some_and(|s| h.stream.as_ref().is_some_and(|m| Arc::ptr_eq(s, m)))
        {
            *s = None;
        }
        drop(s);
        self.cache.idle(h.ino);
        self.leases.release(h.ino, h.fh);
        match &self.cluster {
            Some(cl) if now => cl.unclaim(h.ino, h.fh),
            _ => self.unclaim(h.ino, h.fh),
        }
        self.fences.lease_left_term(h.ino);
    }

    /// The live handle of descriptor `fh` for a write or sync by `caller`:
    /// the current one, or, when a close ended its grant, a new grant
    /// taken as an `O_NONBLOCK` open would (`EBUSY` when another writer
    /// has the file). Waits on the network: never on a request thread.
    pub(super) fn regrant(self: &Arc<Self>, fh: u64, caller: Caller) -> FsResult<Arc<Handle>> {
        let h = self.handles.get(fh)?;
        if h.gate.grant_begin().is_some() {
            return self.handles.get(fh);
        }
        let r = self.regrant_now(&h, caller);
        h.gate.grant_done(r.as_ref().ok().map(|n| n.epoch));
        r
    }

    fn regrant_now(self: &Arc<Self>, h: &Handle, caller: Caller) -> FsResult<Arc<Handle>> {
        let Some(cl) = self.cluster.clone() else {
            return Err(FsError::BadHandle);
        };
        let who = proc_info::identity(caller.pid);
        let mut flags = libc::O_WRONLY | libc::O_NONBLOCK;
        if h.append {
            flags |= libc::O_APPEND;
        }
        if h.sync_writes {
            flags |= libc::O_DSYNC;
        }
        self.claim(&*cl, h.ino, h.fh, flags, caller, &who)?;
        let opener = Opener {
            who,
            uid: h.uid,
            fence: h.fence,
            created: None,
            fresh: false,
            again: Some(h.gate.clone()),
        };
        let (tx, rx) = mpsc::channel();
        self.acquire_local(
            h.ino,
            h.fh,
            flags,
            caller,
            opener,
            None,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.recv().unwrap_or(Err(FsError::BadHandle))?;
        tracing::debug!(ino = h.ino, fh = h.fh, "granted again after a close");
        self.handles.get(h.fh)
    }
}

impl Core {
    /// Before a grant over etcd is answered: the kernel's size of `ino`
    /// becomes the file's, `size` (see `PageCaches::tell_size`). From the
    /// blocking pool only.
    pub(super) fn tell_kernel_size(&self, ino: u64, size: u64) {
        let last = match size {
            0 => 0,
            _ => match self.read_last_byte(ino, size) {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(
                        ino,
                        "cannot read the last byte to tell the kernel the size: {e}"
                    );
                    return self.cache.forget_attrs(ino);
                }
            },
        };
        self.cache.tell_size(ino, size, last);
    }

    fn read_last_byte(&self, ino: u64, size: u64) -> FsResult<u8> {
        let mut tries = 0;
        loop {
            match self.read_once(ino, size - 1, 1, None) {
                Ok(d) if d.len() == 1 => return Ok(d[0]),
                Ok(_) => return Err(FsError::Io("short read of the last byte".into())),
                Err(FsError::Moved(_)) if tries < 20 => tries += 1,
                Err(e) => return Err(e),
            }
        }
    }
}

impl Core {
    /// An `O_APPEND` write over etcd that the kernel placed at `offset`,
    /// short of the file's end (its size of the file was stale: a grant
    /// taken by this very write, after another daemon appended): the
    /// kernel is told the size the write leaves before it is answered, so
    /// that the position of the writes after it is right (this one's is
    /// the kernel's). Otherwise `reply` as it is.
    pub(super) fn kernel_size_after(
        self: &Arc<Self>,
        h: &Handle,
        stream: &OutputStream,
        offset: u64,
        data: &[u8],
        reply: Box<dyn FnOnce(FsResult<u32>) + Send>,
    ) -> Box<dyn FnOnce(FsResult<u32>) + Send> {
        let end = stream.pos();
        let Some(&last) = data.last() else {
            return reply;
        };
        if self.cluster.is_none() || !h.append || offset == end {
            return reply;
        }
        tracing::debug!(
            ino = h.ino,
            offset,
            end,
            "the kernel's size of the file was stale"
        );
        let (me, ino, size) = (self.clone(), h.ino, end + data.len() as u64);
        Box::new(move |r| {
            let me2 = me.clone();
            me.ctx.rt.spawn_blocking(move || {
                me2.cache.tell_size(ino, size, last);
                reply(r)
            });
        })
    }
}

impl Core {
    /// Over etcd: records grant `epoch` of `ino` as the file's last, under
    /// the claim it came from, before its open is answered, so that every
    /// daemon reads the same epoch once the open returned (the
    /// `user.leasefs.epoch` attribute, the lease's JSON). A claim found
    /// gone fences the grant's writes at their first commit anyway.
    pub(super) fn record_grant(&self, ino: u64, epoch: u64) {
        let ch = [
            Change::SetLastEpoch { ino, epoch },
            Change::Claimed { ino, epoch },
        ];
        if let Err(e) = self.meta().commit(&ch, false) {
            tracing::warn!(ino, epoch, "cannot record the grant's epoch: {e}");
        }
    }
}
