//! Where an object-store datanode is and how to reach it: `s3://BUCKET/PREFIX`
//! names it; the endpoint and region come from `-o s3_endpoint=`,
//! `-o s3_region=` (or `AWS_ENDPOINT`/`AWS_REGION`); the credentials from the
//! `AWS_*` environment variables or from `-o s3_credentials=FILE`, a file
//! that only the daemon's user may read (`KEY=value` lines, as
//! `mount-scripts/garage.sh` writes, or `key = value` lines of an AWS
//! credentials file). Never from the command line, which `ps` shows.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::{BackoffConfig, ObjectStore, RetryConfig};

use crate::storage::StorageError;
use crate::sync::Arc;

/// The scheme of an object-store datanode.
pub const SCHEME: &str = "s3://";

pub use crate::config::S3Options;

/// The options the daemon was mounted with: attaching a datanode (at mount,
/// `datanode add`, or one another daemon added) reads them here, where the
/// mount's options are not at hand. Set once, at mount.
static OPTIONS: std::sync::OnceLock<S3Options> = std::sync::OnceLock::new();

/// Records the mount's options (the first call wins: one mount per daemon).
pub fn install(opts: S3Options) {
    let _ = OPTIONS.set(opts);
}

/// The mount's options (defaults before [`install`]).
pub fn installed() -> S3Options {
    OPTIONS.get().cloned().unwrap_or_default()
}

/// The file in a data directory that records how the last mount reached
/// its object stores (see [`record`]).
pub const RECORD_FILE: &str = "s3-options";

/// `opts` as the `-o` options that give them, one per entry: the URL, the
/// region, the credentials file's path (never what it holds), the retry
/// timeout and the capacity.
pub fn as_mount_options(opts: &S3Options) -> Vec<String> {
    let mut v = Vec::new();
    if let Some(e) = &opts.endpoint {
        v.push(format!("s3_endpoint={e}"));
    }
    if let Some(r) = &opts.region {
        v.push(format!("s3_region={r}"));
    }
    if let Some(c) = &opts.credentials {
        v.push(format!("s3_credentials={}", c.display()));
    }
    if let Some(t) = opts.retry_timeout {
        v.push(format!("s3_retry_timeout={}", t.as_secs_f64()));
    }
    if let Some(c) = opts.capacity {
        v.push(format!("s3_capacity={c}"));
    }
    v
}

/// Records the mount's options in `DATA/s3-options` (one `-o` option a
/// line, mode 0600, replaced whole), so that tools run without the daemon
/// (`leasefs fsck --data DATA`) reach the stores as the mount did. Holds
/// no secret: the credentials stay in the file `s3_credentials` names.
/// Without any such option the file is removed (the environment is used).
pub fn record(data: &Path, opts: &S3Options) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = data.join(RECORD_FILE);
    let lines = as_mount_options(opts);
    if lines.is_empty() {
        return match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    let tmp = data.join(format!("{RECORD_FILE}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(format!("{}\n", lines.join("\n")).as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)
}

/// The options [`record`] left in `data` (`None`: no file; the
/// environment alone then says how to reach the stores).
pub fn recorded(data: &Path) -> Result<Option<S3Options>, String> {
    let path = data.join(RECORD_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut o = crate::config::MountOptions::default();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !line.starts_with("s3_") {
            return Err(format!("{}: not an s3_ option: {line}", path.display()));
        }
        o.apply(line)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(Some(o.s3))
}

/// A bucket and the prefix in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Url {
    pub bucket: String,
    pub prefix: String,
}

impl S3Url {
    /// `s3://bucket/prefix` as given.
    pub fn to_url(&self) -> String {
        if self.prefix.is_empty() {
            format!("{SCHEME}{}", self.bucket)
        } else {
            format!("{SCHEME}{}/{}", self.bucket, self.prefix)
        }
    }
}

/// Whether a `--datanode` value names an object-store datanode.
pub fn is_s3(p: &Path) -> bool {
    p.to_str().is_some_and(|s| s.starts_with(SCHEME))
}

/// Parses `s3://BUCKET/PREFIX` (the prefix may be empty; `..` and empty
/// components are refused, so two spellings never name one prefix).
pub fn parse_url(s: &str) -> Result<S3Url, String> {
    let rest = s
        .strip_prefix(SCHEME)
        .ok_or_else(|| format!("{s}: not an s3:// URL"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    let prefix = prefix.trim_end_matches('/');
    if bucket.is_empty()
        || !bucket
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        return Err(format!("{s}: bad bucket name {bucket:?}"));
    }
    if !prefix.is_empty()
        && prefix
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(format!("{s}: bad prefix {prefix:?}"));
    }
    Ok(S3Url {
        bucket: bucket.to_string(),
        prefix: prefix.to_string(),
    })
}

/// How long a request is retried while the store cannot be reached, unless
/// `-o s3_retry_timeout=` says otherwise.
pub const DEFAULT_RETRY_TIMEOUT: Duration = Duration::from_secs(30);

/// The client's retry policy: by time, not by count. `object_store`'s
/// default stops after 10 retries, and its backoff (a random step between
/// 100 ms and twice the last one) makes those 10 last about 3 s: a store
/// unreachable for 3 s then failed every packet in flight, and with it
/// every writer of a bucket-only mount on that host (`tests/s3_hosts.rs`,
/// a 4 s cut of one host's connection: `EIO` after 2.96 s). Retried until
/// `timeout` instead, each wait at most 1 s, so a writer rides out an
/// outage shorter than the timeout and goes on at most a second after the
/// store is back; a longer one fails the request, and the replica, as an
/// I/O error (docs/SEMANTICS.md "Object-store datanodes", *Losing the
/// store*). Only what `object_store` deems safe is retried: any request
/// that was not sent, and idempotent ones (PUT, GET, LIST, DELETE, COPY)
/// after a timeout or a reset too.
pub fn retry_config(timeout: Duration) -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(1),
            base: 2.0,
        },
        // The timeout bounds the retries; no count cuts them short.
        max_retries: usize::MAX,
        retry_timeout: timeout,
    }
}

/// Credentials read from a file.
#[derive(Default)]
struct Creds {
    key_id: Option<String>,
    secret: Option<String>,
    token: Option<String>,
    region: Option<String>,
    endpoint: Option<String>,
}

/// Reads a credentials file, refusing one that another user could read or
/// change (owned by someone else, or any group/other permission bit).
fn read_credentials(path: &Path) -> Result<Creds, StorageError> {
    let bad = |why: String| StorageError::Untrusted {
        path: path.to_path_buf(),
        why,
    };
    let md = std::fs::metadata(path).map_err(|e| StorageError::io(path, e))?;
    if md.uid() != nix::unistd::geteuid().as_raw() {
        return Err(bad(format!(
            "the credentials file is owned by uid {}",
            md.uid()
        )));
    }
    if md.mode() & 0o077 != 0 {
        return Err(bad(format!(
            "the credentials file has mode {:o}: it must be readable by its owner only (chmod 600)",
            md.mode() & 0o777
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| StorageError::io(path, e))?;
    let mut c = Creds::default();
    for line in text.lines().map(str::trim) {
        let line = line.strip_prefix("export ").unwrap_or(line);
        let Some((k, v)) = line.split_once('=') else {
            continue;
        };
        let v = v.trim().trim_matches('"').trim_matches('\'').to_string();
        match k.trim().to_ascii_lowercase().as_str() {
            "aws_access_key_id" => c.key_id = Some(v),
            "aws_secret_access_key" => c.secret = Some(v),
            "aws_session_token" => c.token = Some(v),
            "aws_region" | "region" => c.region = Some(v),
            "aws_endpoint" | "aws_endpoint_url" | "s3_endpoint" => c.endpoint = Some(v),
            _ => {}
        }
    }
    Ok(c)
}

/// The client for `url` with `opts`: the environment first, then the
/// credentials file, then the mount options.
pub fn build_store(url: &S3Url, opts: &S3Options) -> Result<Arc<dyn ObjectStore>, StorageError> {
    let mut b = AmazonS3Builder::from_env()
        .with_bucket_name(&url.bucket)
        .with_retry(retry_config(
            opts.retry_timeout.unwrap_or(DEFAULT_RETRY_TIMEOUT),
        ));
    let mut endpoint = std::env::var("AWS_ENDPOINT").ok();
    if let Some(path) = &opts.credentials {
        let c = read_credentials(path)?;
        if let Some(v) = c.key_id {
            b = b.with_access_key_id(v);
        }
        if let Some(v) = c.secret {
            b = b.with_secret_access_key(v);
        }
        if let Some(v) = c.token {
            b = b.with_token(v);
        }
        if let Some(v) = c.region {
            b = b.with_region(v);
        }
        if let Some(v) = c.endpoint {
            endpoint = Some(v);
        }
    }
    if let Some(v) = &opts.region {
        b = b.with_region(v);
    }
    if let Some(v) = &opts.endpoint {
        endpoint = Some(v.clone());
    }
    if let Some(e) = endpoint {
        b = b
            .with_allow_http(e.starts_with("http://"))
            .with_endpoint(e)
            .with_virtual_hosted_style_request(false);
    }
    let store = b.build().map_err(|e| StorageError::Io {
        path: PathBuf::from(url.to_url()),
        source: std::io::Error::other(e),
    })?;
    Ok(Arc::new(store))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_a_bucket_and_a_clean_prefix() {
        assert_eq!(
            parse_url("s3://b-1/a/b/").unwrap(),
            S3Url {
                bucket: "b-1".into(),
                prefix: "a/b".into()
            }
        );
        assert_eq!(parse_url("s3://b").unwrap().prefix, "");
        for bad in [
            "s3://",
            "s3://B/x",
            "s3://b//x",
            "s3://b/../x",
            "/dn",
            "s3://b/x/./y",
        ] {
            assert!(parse_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn requests_are_retried_for_a_time_not_a_count() {
        let r = retry_config(DEFAULT_RETRY_TIMEOUT);
        assert_eq!(r.retry_timeout, Duration::from_secs(30));
        // At 100 ms a retry at the very least, a count cannot end the
        // retries before the timeout does.
        assert!(r.max_retries as u128 >= r.retry_timeout.as_millis() / 100);
        // Back within a second of the store.
        assert!(r.backoff.max_backoff <= Duration::from_secs(1));
        assert!(r.backoff.init_backoff <= r.backoff.max_backoff);
    }

    #[test]
    fn recorded_options_come_back_as_they_were_given() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(recorded(d.path()), Ok(None));
        let opts = S3Options {
            endpoint: Some("http://127.0.0.1:3900".into()),
            region: Some("garage".into()),
            credentials: Some("/etc/leasefs/s3.env".into()),
            retry_timeout: Some(Duration::from_millis(2500)),
            capacity: Some(10 << 30),
        };
        record(d.path(), &opts).unwrap();
        assert_eq!(recorded(d.path()), Ok(Some(opts)));
        let text = std::fs::read_to_string(d.path().join(RECORD_FILE)).unwrap();
        assert!(
            text.contains("s3_credentials=/etc/leasefs/s3.env\n"),
            "{text}"
        );
        let mode = std::fs::metadata(d.path().join(RECORD_FILE))
            .unwrap()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        record(d.path(), &S3Options::default()).unwrap();
        assert_eq!(recorded(d.path()), Ok(None), "no options, no file");
    }

    #[test]
    fn a_credentials_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("env");
        std::fs::write(
            &p,
            "export AWS_ACCESS_KEY_ID=\"k\"\naws_secret_access_key = s\n",
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(
            read_credentials(&p),
            Err(StorageError::Untrusted { .. })
        ));
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = read_credentials(&p).unwrap();
        assert_eq!(c.key_id.as_deref(), Some("k"));
        assert_eq!(c.secret.as_deref(), Some("s"));
    }
}
