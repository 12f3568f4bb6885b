//! Writes, flush and release: what a write descriptor's bytes go through
//! before the stream takes them (the lease, the election term, setuid
//! and setgid cleared), and a descriptor's end.

use super::core::{Caller, Core, Reply};
use super::handles::Handle;
use super::{privs, proc_info};
use crate::error::{FsError, FsResult};
use crate::lease::{LeaseError, RecoveryReason};
use crate::pipeline::OutputStream;
use crate::sync::{Arc, Ordering};

impl Core {
    /// Writes through `fh`. `kill_suidgid` is the kernel's word that the
    /// caller lacks CAP_FSETID: the write then clears setuid and setgid
    /// (`privs`) before its bytes go anywhere.
    pub fn write(
        self: &Arc<Self>,
        fh: u64,
        offset: u64,
        data: &[u8],
        (caller, kill_suidgid): (Caller, bool),
        reply: Reply<u32>,
    ) {
        let h = match self.handles.get(fh) {
            Ok(h) => h,
            Err(e) => return reply(Err(e)),
        };
        if h.stream.is_none() {
            return reply(Err(FsError::BadHandle));
        }
        if !h.live() {
            // A close ended this description's grant: a new one first.
            let (me, data) = (self.clone(), data.to_vec());
            self.ctx
                .rt
                .spawn_blocking(move || match me.regrant(fh, caller) {
                    Ok(_) => me.write(fh, offset, &data, (caller, kill_suidgid), reply),
                    Err(e) => reply(Err(e)),
                });
            return;
        }
        if let Err(e) = self.writable(&h) {
            tracing::warn!(ino = h.ino, fh, uid = h.uid, "write refused: {e}");
            return reply(Err(e));
        }
        if self.handles.privs_to_drop(h.ino, kill_suidgid) {
            return self.drop_privs_then_write(h, offset, data, (caller, kill_suidgid), reply);
        }
        self.write_checked(&h, offset, data, reply)
    }

    /// The write of `Core::write` once privileges are dropped. The drop
    /// is a metadata commit: on the request thread only when it is local.
    fn drop_privs_then_write(
        self: &Arc<Self>,
        h: Arc<Handle>,
        offset: u64,
        data: &[u8],
        (caller, kill_suidgid): (Caller, bool),
        reply: Reply<u32>,
    ) {
        let kill = if kill_suidgid {
            privs::Kill::Yes
        } else {
            privs::Kill::No
        };
        // A mode cleared here is not one the kernel knows: it would show
        // the old one from its attribute cache (to a statx of the mode
        // alone) for up to a second. So such a write is answered only once
        // the kernel has forgotten the inode's attributes, which it is
        // told from the blocking pool, never from a request thread.
        if self.cluster.is_some() {
            let (me, data) = (self.clone(), data.to_vec());
            self.ctx
                .rt
                .spawn_blocking(move || match me.drop_privs(h.ino, caller, kill) {
                    Ok(changed) => {
                        if changed {
                            me.cache.forget_attrs(h.ino);
                        }
                        me.write_checked(&h, offset, &data, reply)
                    }
                    Err(e) => reply(Err(e)),
                });
            return;
        }
        match self.drop_privs(h.ino, caller, kill) {
            Ok(false) => self.write_checked(&h, offset, data, reply),
            Ok(true) => {
                let (me, data) = (self.clone(), data.to_vec());
                self.ctx.rt.spawn_blocking(move || {
                    me.cache.forget_attrs(h.ino);
                    me.write_checked(&h, offset, &data, reply)
                });
            }
            Err(e) => reply(Err(e)),
        }
    }

    /// Drops what a data change of `ino` by `caller` removes (see
    /// `privs`), and remembers what is left for the next write; whether
    /// the mode changed.
    pub(super) fn drop_privs(&self, ino: u64, caller: Caller, kill: privs::Kill) -> FsResult<bool> {
        let (i, changed) = privs::drop(&**self.meta(), ino, caller, kill)?;
        self.handles.note_privs(ino, privs::mode_bits(&i), false);
        Ok(changed)
    }

    /// Appends through the handle's stream; the reply may wait for acks
    /// (backpressure). O_APPEND writes go to the real end of the file.
    ///
    /// While handles that read through the page cache are open (opened
    /// before this writer), the reply waits until the bytes are
    /// acknowledged and the pages from the previous visible end to the new
    /// one are invalidated: the kernel grows its file size when the reply
    /// arrives, and a page it read while the end was there (zero-filled
    /// past it) must not survive that, nor may the size pass unacknowledged
    /// bytes.
    fn write_checked(self: &Arc<Self>, h: &Handle, offset: u64, data: &[u8], reply: Reply<u32>) {
        let fh = h.fh;
        let Some(stream) = h.stream.as_ref() else {
            return reply(Err(FsError::BadHandle));
        };
        // Held until the write is in the stream: a close that ends the
        // grant (`closing`) waits for it, and closes it with the rest.
        let Some(_entered) = h.gate.enter(h.epoch) else {
            let (me, data) = (self.clone(), data.to_vec());
            let caller = Caller {
                pid: h.tgid,
                uid: h.uid,
                gid: 0,
            };
            self.ctx
                .rt
                .spawn_blocking(move || match me.regrant(fh, caller) {
                    Ok(h) => me.write_checked(&h, offset, &data, reply),
                    Err(e) => reply(Err(e)),
                });
            return;
        };
        if h.flushed.swap(false, Ordering::Relaxed) {
            self.leases.note_write(h.ino, fh);
        }
        // The kernel grows its size of the file when this write returns,
        // by bytes not yet acknowledged; while it may still hold the
        // attributes of the create's reply, a stat would show that size
        // without asking (docs/SEMANTICS.md "Visible length"). Forgetting
        // them first sends the next stat here, for the visible length.
        if h.fresh.swap(false, Ordering::Relaxed) {
            self.cache.forget_attrs(h.ino);
        }
        let reply: Reply<u32> = if h.sync_writes {
            let s = stream.clone();
            Box::new(move |r| match r {
                Ok(n) => s.sync(Box::new(move |r| reply(r.map(|_| n)))),
                Err(e) => reply(Err(e)),
            })
        } else {
            reply
        };
        let n = data.len() as u32;
        let off = if h.append { None } else { Some(offset) };
        let reply = self.kernel_size_after(h, stream, offset, data, reply);
        if !self.cache.has_cached_readers(h.ino) {
            return stream.write(off, data, Box::new(move |r| reply(r.map(|_| n))));
        }
        let from = stream.visible_len();
        let (s, me, ino) = (stream.clone(), self.clone(), h.ino);
        stream.write(
            off,
            data,
            Box::new(move |r| {
                if let Err(e) = r {
                    return reply(Err(e));
                }
                let s2 = s.clone();
                s.flush(Box::new(move |r| match r {
                    Err(e) => reply(Err(e)),
                    Ok(()) => {
                        let to = s2.visible_len();
                        me.cache
                            .invalidate_range_then(ino, from, to, move || reply(Ok(n)));
                    }
                }));
            }),
        );
    }

    /// close(): every byte of this writer acknowledged by all replicas,
    /// and the file closed as far as its metadata goes (last block
    /// finalised, length committed), so that a failed commit (`ENOSPC` of
    /// a full metadata store) is what `close()` returns: FUSE's RELEASE
    /// comes after `close()` has returned, and its errors reach nobody.
    /// Only a close by the process that opened the handle counts as the
    /// holder closing (for the reopen grace): a child closing an inherited
    /// copy (exec) does not.
    pub fn flush(self: &Arc<Self>, fh: u64, caller: Caller, reply: Reply<()>) {
        let (h, stream) = match self.writer(fh) {
            Ok(Some(w)) => w,
            Ok(None) => return reply(Ok(())),
            Err(e) => return reply(Err(e)),
        };
        // The holder's main thread needs no /proc read to be recognised.
        let by_holder = caller.pid == h.tgid || proc_info::identity(caller.pid).tgid == h.tgid;
        let me = self.clone();
        let s = stream.clone();
        stream.close(Box::new(move |r| {
            if r.is_ok() && by_holder {
                // Over etcd the close ends the grant (`closing`).
                if me.cluster.is_some() {
                    return me.end_grant_at_close(h, s, reply);
                }
                h.flushed.store(true, Ordering::Relaxed);
                me.leases.note_flush(h.ino, h.fh);
            }
            reply(r)
        }));
    }

    /// The handle and stream of a descriptor that may still write, or
    /// `None` for a read-only one.
    fn writer(&self, fh: u64) -> FsResult<Option<(Arc<Handle>, Arc<OutputStream>)>> {
        let h = self.handles.get(fh)?;
        let Some(stream) = h.stream.clone() else {
            return Ok(None);
        };
        // A grant a close ended has nothing left to close.
        if !h.live() {
            return Ok(None);
        }
        self.writable(&h)?;
        Ok(Some((h, stream)))
    }

    /// The open file description is gone: close the file (finalising its
    /// last block) and hand the lease to the next waiter.
    pub fn release(self: &Arc<Self>, fh: u64, reply: Reply<()>) {
        let Some(h) = self.handles.remove(fh) else {
            return reply(Ok(()));
        };
        let ino = h.ino;
        if h.write && !h.live() {
            // Its grant ended at a close (`closing`): nothing left to end.
            if h.cached {
                self.cache.cached_closed(ino);
            }
            self.drop_open(ino);
            return reply(Ok(()));
        }
        let stream_to_close = h.stream.clone();
        if h.write {
            // A handle of an ended election term closes nothing: its
            // unflushed bytes are dropped and the file is recovered.
            let _ = self.writable(&h);
        }
        let me = self.clone();
        let finish = move |r: FsResult<()>| {
            if h.write {
                me.end_grant(&h, false);
            }
            if h.cached {
                me.cache.cached_closed(h.ino);
            }
            // No cache invalidation here: the kernel's pages and size of this
            // inode were updated by the writer's own writes through it.
            me.drop_open(h.ino);
            reply(r)
        };
        let failed = stream_to_close.as_ref().and_then(|s| s.is_failed());
        match stream_to_close {
            // The writer is gone with its stream failed (no replica left):
            // close the file now by recovery, before the lease moves on.
            Some(_)
                if failed
                    .as_ref()
                    .is_some_and(|e| !matches!(e, FsError::Lease(LeaseError::Fenced { .. }))) =>
            {
                self.handles.close_started();
                let me = self.clone();
                self.ctx.rt.spawn_blocking(move || {
                    if let Err(e) = me.recover(ino, RecoveryReason::HolderGone) {
                        tracing::error!(ino, "recovery after a failed stream: {e}");
                    }
                    finish(Ok(()));
                    me.handles.close_finished();
                });
            }
            Some(stream) if failed.is_none() => {
                self.handles.close_started();
                let me = self.clone();
                stream.close(Box::new(move |r| {
                    if let Err(e) = &r {
                        tracing::error!("close failed: {e}");
                    }
                    finish(r);
                    me.handles.close_finished();
                }));
            }
            _ => finish(Ok(())),
        }
    }

    /// One open fewer; an unlinked file goes away with its last open.
    /// Over etcd another daemon may have removed its last name: the store
    /// says; on a lone daemon the unlink told its handles.
    fn drop_open(&self, ino: u64) {
        if let Some(unlinked) = self.handles.drop_open(ino)
            && (unlinked || self.cluster.is_some())
            && let Ok(i) = self.meta().get(ino)
            && i.nlink == 0
        {
            self.delete_inode(ino);
        }
    }

    /// Deletes an inode with no names and no opens, and its replicas.
    pub(crate) fn delete_inode(&self, ino: u64) {
        self.cache.drop_state(ino);
        self.ctx.ledger.forget(ino);
        match self.meta().delete_inode(ino) {
            Ok(blocks) => self.deletions.delete(blocks),
            Err(e) => tracing::error!(ino, "cannot delete inode: {e}"),
        }
    }
}
