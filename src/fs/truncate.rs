//! Truncate and fallocate: a size change needs the lease, as a write
//! does.

use super::core::{Caller, Core, Reply};
use super::{privs, proc_info};
use crate::error::{FsError, FsResult};
use crate::sync::Arc;

impl Core {
    /// Changes a file's size. Needs the lease: through the caller's own
    /// handle (`fh`, or any write handle of the same process), or taken
    /// implicitly when nobody holds it.
    pub fn set_size(
        self: &Arc<Self>,
        ino: u64,
        size: u64,
        fh: Option<u64>,
        caller: Caller,
        reply: Reply<()>,
    ) {
        if let Err(e) = self.may_change(caller) {
            return reply(Err(e));
        }
        // A truncation drops privileges as a write does, once it is done.
        let me = self.clone();
        let reply: Reply<()> = Box::new(move |r| match r {
            // The reply carries the new mode to this kernel.
            Ok(()) => reply(
                me.drop_privs(ino, caller, privs::Kill::UnlessCapFsetid)
                    .map(drop),
            ),
            Err(e) => reply(Err(e)),
        });
        let own = fh
            .and_then(|f| self.handles.get(f).ok())
            .filter(|h| h.write && h.live())
            .or_else(|| {
                let tgid = proc_info::identity(caller.pid).tgid;
                self.handles
                    .find(|h| h.ino == ino && h.write && h.tgid == tgid && h.live())
            });
        if let Some(h) = own
            && let Some(stream) = h.stream.clone()
        {
            if let Err(e) = self.writable(&h) {
                return reply(Err(e));
            }
            let me = self.clone();
            return stream.truncate(
                size,
                Box::new(move |r| match r {
                    Ok(()) => me.cache.invalidate_all_then(ino, (), reply),
                    Err(e) => reply(Err(e)),
                }),
            );
        }
        // Nobody of ours holds it: take the lease for the duration.
        let me = self.clone();
        self.open(
            ino,
            libc::O_WRONLY,
            caller,
            Box::new(move |r| match r {
                Err(e) => reply(Err(e)),
                Ok(o) => {
                    let Ok(h) = me.handles.get(o.fh) else {
                        return reply(Err(FsError::BadHandle));
                    };
                    let Some(stream) = h.stream.clone() else {
                        return reply(Err(FsError::BadHandle));
                    };
                    let me2 = me.clone();
                    let release = move |r: FsResult<()>| {
                        me2.release(o.fh, Box::new(move |r2| reply(r.and(r2))))
                    };
                    let me3 = me.clone();
                    stream.truncate(
                        size,
                        Box::new(move |r| match r {
                            // Pages go while the file is still busy.
                            Ok(()) => me3.cache.invalidate_all_then(ino, (), Box::new(release)),
                            Err(e) => release(Err(e)),
                        }),
                    );
                }
            }),
        );
    }

    /// fallocate: mode 0 grows the file with zeros (like truncate) when the
    /// range ends past it; KEEP_SIZE is accepted and does nothing (blocks
    /// are not preallocated); other modes would rewrite existing bytes.
    pub fn fallocate(
        self: &Arc<Self>,
        fh: u64,
        offset: u64,
        length: u64,
        mode: i32,
        caller: Caller,
        reply: Reply<()>,
    ) {
        let h = match self.handles.get(fh) {
            Ok(h) => h,
            Err(e) => return reply(Err(e)),
        };
        if mode & !libc::FALLOC_FL_KEEP_SIZE != 0 {
            return reply(Err(FsError::Unsupported(
                "fallocate mode other than 0 or KEEP_SIZE",
            )));
        }
        let end = offset.saturating_add(length);
        let size = match self.getattr(h.ino) {
            Ok(a) => h.stream.as_ref().map(|s| s.pos()).unwrap_or(a.size),
            Err(e) => return reply(Err(e)),
        };
        if mode & libc::FALLOC_FL_KEEP_SIZE != 0 || end <= size {
            return reply(Ok(()));
        }
        self.set_size(h.ino, end, Some(fh), caller, reply)
    }
}
