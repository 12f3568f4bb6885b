//! [`Bucket`]: the object store under one prefix, with synchronous
//! methods. [`super::ObjectDatanode`] is called from the daemon's blocking
//! threads (as a directory datanode's `pread`s are), so each request runs
//! on a small tokio runtime the bucket owns: never on the daemon's own
//! runtime, whose worker a `block_on` would stall.

use crate::sync::{AtomicU64, Ordering};
use std::io;
use std::ops::Range;
use std::path::PathBuf;

use futures::TryStreamExt;
use object_store::path::Path as Key;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};

use crate::storage::StorageError;
use crate::sync::Arc;

/// An object store and the prefix a datanode owns in it.
pub struct Bucket {
    /// `Some` until dropped; shut down in the background on drop, so a
    /// bucket dropped from an async context does not panic.
    rt: Option<tokio::runtime::Runtime>,
    store: Arc<dyn ObjectStore>,
    /// `s3://bucket/prefix`, as errors, logs and `datanode list` name it.
    url: String,
    /// The prefix inside the bucket (no leading or trailing `/`; may be empty).
    prefix: String,
    /// Requests sent, by kind (what the store bills and what the layout
    /// costs; docs/SEMANTICS.md, "Object-store datanodes").
    counts: Requests,
}

/// Requests sent to the store, by kind.
#[derive(Debug, Default)]
pub struct Requests {
    pub put: AtomicU64,
    pub get: AtomicU64,
    pub list: AtomicU64,
    pub delete: AtomicU64,
    pub copy: AtomicU64,
}

impl Requests {
    /// (put, get, list, delete, copy) so far.
    pub fn snapshot(&self) -> [u64; 5] {
        [&self.put, &self.get, &self.list, &self.delete, &self.copy]
            .map(|c| c.load(Ordering::Relaxed))
    }
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket").field("url", &self.url).finish()
    }
}

impl Drop for Bucket {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// One object as listed: its key relative to the prefix, and its size.
#[derive(Debug, Clone)]
pub struct Listed {
    pub rel: String,
    pub size: u64,
    /// When the store says it was written.
    pub modified: Option<std::time::SystemTime>,
}

impl Bucket {
    /// A bucket reached through `store`, owning `prefix`, named `url`.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        url: String,
        prefix: String,
    ) -> Result<Bucket, StorageError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("leasefs-s3")
            .enable_all()
            .build()
            .map_err(|e| StorageError::io(&PathBuf::from(&url), e))?;
        Ok(Bucket {
            rt: Some(rt),
            store,
            url,
            prefix: prefix.trim_matches('/').to_string(),
            counts: Requests::default(),
        })
    }

    /// Requests sent so far.
    pub fn requests(&self) -> &Requests {
        &self.counts
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The key of `rel` under the prefix.
    fn key(&self, rel: &str) -> Key {
        if self.prefix.is_empty() {
            Key::from(rel)
        } else {
            Key::from(format!("{}/{rel}", self.prefix))
        }
    }

    /// `rel` as a path in errors: `s3://bucket/prefix/rel`.
    pub fn path_of(&self, rel: &str) -> PathBuf {
        PathBuf::from(format!("{}/{rel}", self.url))
    }

    /// Runs `f` to completion on the bucket's runtime. From inside another
    /// runtime's context (where `block_on` would panic) it runs on a scoped
    /// thread of its own.
    fn run<T: Send>(&self, f: impl std::future::Future<Output = T> + Send) -> T {
        let rt = self.rt.as_ref().expect("runtime present until drop");
        if tokio::runtime::Handle::try_current().is_ok() {
            std::thread::scope(|s| {
                s.spawn(|| rt.block_on(f))
                    .join()
                    .unwrap_or_else(|p| std::panic::resume_unwind(p))
            })
        } else {
            rt.block_on(f)
        }
    }

    fn err(&self, rel: &str, e: object_store::Error) -> StorageError {
        StorageError::Io {
            path: self.path_of(rel),
            source: io::Error::other(e),
        }
    }

    /// PUT: returns once the store acknowledged the whole object.
    pub fn put(&self, rel: &str, body: Vec<u8>) -> Result<(), StorageError> {
        let key = self.key(rel);
        bump(&self.counts.put, 1);
        self.run(self.store.put(&key, PutPayload::from(body)))
            .map(|_| ())
            .map_err(|e| self.err(rel, e))
    }

    /// PUT unless the object exists (`If-None-Match: *`); `false` when the
    /// store says it does. A store that ignores the header (Garage 2.5.0:
    /// docs/SEMANTICS.md, "Object-store datanodes", *Identity*) overwrites
    /// as a plain PUT; one that refuses it is sent a plain PUT instead.
    pub fn put_new(&self, rel: &str, body: Vec<u8>) -> Result<bool, StorageError> {
        let key = self.key(rel);
        bump(&self.counts.put, 1);
        let opts = PutOptions::from(PutMode::Create);
        let payload = PutPayload::from(body.clone());
        match self.run(self.store.put_opts(&key, payload, opts)) {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. }) => Ok(false),
            Err(e) => {
                tracing::debug!(key = %key, "conditional PUT refused ({e}): a plain PUT instead");
                self.put(rel, body).map(|()| true)
            }
        }
    }

    /// The whole object; `None` when there is none.
    pub fn get(&self, rel: &str) -> Result<Option<Vec<u8>>, StorageError> {
        let key = self.key(rel);
        bump(&self.counts.get, 1);
        let r = self.run(async {
            let got = self.store.get(&key).await?;
            got.bytes().await
        });
        match r {
            Ok(b) => Ok(Some(b.to_vec())),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.err(rel, e)),
        }
    }

    /// Bytes `range` of the object, each range fetched in parallel.
    pub fn get_ranges(
        &self,
        rel: &str,
        ranges: &[Range<u64>],
    ) -> Result<Vec<Vec<u8>>, StorageError> {
        let key = self.key(rel);
        bump(&self.counts.get, ranges.len() as u64);
        self.run(self.store.get_ranges(&key, ranges))
            .map(|v| v.into_iter().map(|b| b.to_vec()).collect())
            .map_err(|e| self.err(rel, e))
    }

    /// Removes the object (absent: no error).
    pub fn delete(&self, rel: &str) -> Result<(), StorageError> {
        let key = self.key(rel);
        bump(&self.counts.delete, 1);
        match self.run(self.store.delete(&key)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.err(rel, e)),
        }
    }

    /// A server-side copy (no bytes through the daemon).
    pub fn copy(&self, from: &str, to: &str) -> Result<(), StorageError> {
        let (f, t) = (self.key(from), self.key(to));
        bump(&self.counts.copy, 1);
        self.run(self.store.copy(&f, &t))
            .map_err(|e| self.err(from, e))
    }

    /// Every object whose key starts with `rel/` (every page of the
    /// listing), keys relative to the prefix.
    pub fn list(&self, rel: &str) -> Result<Vec<Listed>, StorageError> {
        let key = self.key(rel);
        let strip = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        bump(&self.counts.list, 1);
        let metas: Vec<object_store::ObjectMeta> = self
            .run(self.store.list(Some(&key)).try_collect())
            .map_err(|e| self.err(rel, e))?;
        Ok(metas
            .into_iter()
            .filter_map(|m| {
                let k = m.location.to_string();
                k.strip_prefix(&strip).map(|r| Listed {
                    rel: r.to_string(),
                    size: m.size,
                    modified: Some(m.last_modified.into()),
                })
            })
            .collect())
    }
}
