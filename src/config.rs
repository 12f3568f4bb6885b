//! Mount options (`-o key=value,...`): parsing, validation and defaults.

use std::time::Duration;

/// Every tunable of a mount. Defaults follow HDFS (README "Mount options").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountOptions {
    pub soft_limit: Duration,
    pub hard_limit: Duration,
    pub monitor_interval: Duration,
    /// `None`: a second writer gets EBUSY at once.
    pub lease_wait: Option<Duration>,
    pub block_size: u64,
    pub packet_size: u64,
    pub max_packets_in_flight: usize,
    /// `write_buffer=`: bytes of packets in flight across all streams of
    /// the mount (beyond each stream's first); writers wait for room.
    pub write_buffer: u64,
    /// `log_size=`: `DATA/leasefs.log` is rotated past this size (0:
    /// never); see `daemon::logging`.
    pub log_size: u64,
    /// Period of leader-only housekeeping (re-replication, orphan cleanup).
    pub housekeeping_interval: Duration,
    /// fsync makes replicas durable with one `syncfs` per filesystem
    /// (`replica_sync=fs`, the default) or an `fdatasync` per replica file
    /// (`replica_sync=file`, for datanodes on filesystems shared with
    /// heavy unrelated writers, whose dirty data `syncfs` would also wait for).
    pub sync_by_fs: bool,
    /// `sync_cpus=auto` (the default): a small file's one-step fsync is
    /// made, for that call, from the CPUs that take the metadata store's
    /// disk's completion interrupts, when those are fewer than the CPUs
    /// the daemon may use; `sync_cpus=LIST` (`1`, `0-3,6`): from those
    /// CPUs, for a disk whose routing cannot be read (behind device
    /// mapper); `off`: where it is. See `sync_cpus`.
    pub sync_cpus: crate::sync_cpus::Placement,
    /// `journal_checkpoint=SECONDS`: the longest a small file made durable
    /// by the block journal waits for its replicas' sync (its bytes are
    /// in the metadata store meanwhile); 0 turns the journal off, so each
    /// such fsync syncs its replicas (see `pipeline::journal`).
    pub journal_checkpoint: Duration,
    /// `replica_reads=direct` (the default): a read of a finalized replica
    /// that the page cache does not hold goes to the disk past it
    /// (`O_DIRECT`), so the bytes are cached once, as the leasefs file's;
    /// `cached`: through the page cache, which then holds them twice.
    pub reads_direct: bool,
    /// `HOST:PORT` where Prometheus text is served (`metrics=`); off
    /// when `None`.
    pub metrics: Option<String>,
    /// `fuse_uring=auto` (the default): requests come through FUSE over
    /// io_uring, one ring per CPU, when the kernel offers it (Linux 6.14+
    /// with the `fuse` module's `enable_uring` set); `off`: through
    /// `/dev/fuse` always.
    pub fuse_uring: bool,
    /// `fuse_uring_poll=MICROSECONDS`: the most a ring's thread polls for
    /// a reply another thread owes it (an fsync's) before it sleeps; 0:
    /// never polls. See `fuser::Config::io_uring_poll`.
    pub fuse_uring_poll: Duration,
    /// Generic mount flags (`ro`, `noexec`, ...) passed to the kernel.
    pub kernel_flags: Vec<fuser::MountOption>,
    /// `s3_endpoint=`, `s3_region=`, `s3_credentials=`: how object-store
    /// datanodes (`--datanode s3://BUCKET/PREFIX`) are reached.
    pub s3: S3Options,
    /// `local_copy`: this mount's directory datanodes hold host-local
    /// copies (one more replica of each new block, read first here,
    /// counted toward nothing; see `pipeline::copies`).
    pub local_copy: bool,
    /// `host_id=`: this host's id for host-local copies (default: the
    /// machine id).
    pub host_id: Option<String>,
}

/// How object-store datanodes are reached (see `storage::s3::settings`):
/// the endpoint, the region, and a credentials file only the daemon's
/// user may read. Credentials themselves are never mount options (the
/// command line is visible to every user through `ps`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct S3Options {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub credentials: Option<std::path::PathBuf>,
    /// `s3_retry_timeout=`: how long a request is retried while the store
    /// cannot be reached (`None`: the default of `storage::s3::settings`).
    pub retry_timeout: Option<Duration>,
    /// `s3_capacity=`: the bytes each object-store datanode may hold, as
    /// `df` shows it (a store has no size a client can ask); `None`:
    /// unbounded (docs/SEMANTICS.md, "Object-store datanodes", *Capacity*).
    pub capacity: Option<u64>,
}

impl Default for MountOptions {
    fn default() -> Self {
        MountOptions {
            soft_limit: Duration::from_secs(60),
            hard_limit: Duration::from_secs(3600),
            monitor_interval: Duration::from_secs(2),
            lease_wait: None,
            block_size: 64 << 20,
            packet_size: 64 << 10,
            max_packets_in_flight: 80,
            write_buffer: 256 << 20,
            log_size: 16 << 20,
            housekeeping_interval: Duration::from_secs(30),
            sync_by_fs: true,
            sync_cpus: crate::sync_cpus::Placement::Auto,
            journal_checkpoint: crate::pipeline::journal::CHECKPOINT_AFTER,
            reads_direct: true,
            metrics: None,
            fuse_uring: true,
            fuse_uring_poll: Duration::from_micros(1000),
            kernel_flags: Vec::new(),
            s3: S3Options::default(),
            local_copy: false,
            host_id: None,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum OptionError {
    #[error(
        "unknown mount option '{0}' (known: soft_limit, hard_limit, monitor_interval, lease_wait, block_size, packet_size, max_packets_in_flight, write_buffer, log_size, housekeeping_interval, replica_sync, sync_cpus, journal_checkpoint, replica_reads, fuse_uring, fuse_uring_poll, metrics, s3_endpoint, s3_region, s3_credentials, s3_retry_timeout, s3_capacity, local_copy, host_id)"
    )]
    Unknown(String),
    #[error("mount option '{key}' has a bad value '{value}': {why}")]
    BadValue {
        key: String,
        value: String,
        why: String,
    },
}

/// Parses a size such as `4096`, `64K`, `64M`, `1G`, `2T` (binary multiples).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err("size suffix must be K, M, G or T".into()),
            };
            (&s[..i], m)
        }
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| "expected a whole number with an optional K/M/G/T suffix".to_string())?;
    n.checked_mul(mult)
        .ok_or_else(|| "size too large".to_string())
}

/// Checks a `HOST:PORT` to listen on (`[::1]:9567` for IPv6); the host is
/// resolved when the mount starts.
pub fn parse_listen(s: &str) -> Result<String, String> {
    let (host, port) = s
        .rsplit_once(':')
        .ok_or_else(|| "expected HOST:PORT".to_string())?;
    if host.is_empty() {
        return Err("expected HOST:PORT (the host is missing)".into());
    }
    port.parse::<u16>()
        .map_err(|_| "the port must be a number from 0 to 65535".to_string())?;
    Ok(s.to_string())
}

/// Parses seconds: a whole or decimal number, optionally ending in `s`.
pub fn parse_secs(s: &str) -> Result<Duration, String> {
    let t = s.trim().trim_end_matches('s');
    let v: f64 = t
        .parse()
        .map_err(|_| "expected a number of seconds".to_string())?;
    if !v.is_finite() || !(0.0..=1e9).contains(&v) {
        return Err("seconds must be between 0 and 1e9".into());
    }
    Ok(Duration::from_secs_f64(v))
}

impl MountOptions {
    /// Applies one `-o` argument (`key=value,key=value`).
    pub fn apply(&mut self, list: &str) -> Result<(), OptionError> {
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item.split_once('=').unwrap_or((item, ""));
            let bad = |why: String| OptionError::BadValue {
                key: key.to_string(),
                value: value.to_string(),
                why,
            };
            match key {
                "soft_limit" => self.soft_limit = parse_secs(value).map_err(bad)?,
                "hard_limit" => self.hard_limit = parse_secs(value).map_err(bad)?,
                "monitor_interval" => self.monitor_interval = parse_secs(value).map_err(bad)?,
                "housekeeping_interval" => {
                    self.housekeeping_interval = parse_secs(value).map_err(bad)?
                }
                "lease_wait" => {
                    let d = parse_secs(value).map_err(bad)?;
                    self.lease_wait = if d.is_zero() { None } else { Some(d) };
                }
                "block_size" => self.block_size = parse_size(value).map_err(bad)?,
                "packet_size" => self.packet_size = parse_size(value).map_err(bad)?,
                "write_buffer" => self.write_buffer = parse_size(value).map_err(bad)?,
                "log_size" => self.log_size = parse_size(value).map_err(bad)?,
                "max_packets_in_flight" => {
                    self.max_packets_in_flight = value
                        .parse()
                        .map_err(|_| bad("expected a whole number".into()))?
                }
                "replica_sync" => {
                    self.sync_by_fs = match value {
                        "fs" => true,
                        "file" => false,
                        _ => return Err(bad("expected fs or file".into())),
                    }
                }
                "sync_cpus" => {
                    self.sync_cpus = crate::sync_cpus::Placement::parse(value).map_err(bad)?
                }
                "journal_checkpoint" => self.journal_checkpoint = parse_secs(value).map_err(bad)?,
                "replica_reads" => {
                    self.reads_direct = match value {
                        "direct" => true,
                        "cached" => false,
                        _ => return Err(bad("expected direct or cached".into())),
                    }
                }
                "s3_endpoint" => {
                    if !(value.starts_with("http://") || value.starts_with("https://")) {
                        return Err(bad("expected an http:// or https:// URL".into()));
                    }
                    self.s3.endpoint = Some(value.to_string())
                }
                "s3_region" if !value.is_empty() => self.s3.region = Some(value.to_string()),
                "s3_retry_timeout" => {
                    let d = parse_secs(value).map_err(bad)?;
                    if d.is_zero() {
                        return Err(bad("must be > 0".into()));
                    }
                    self.s3.retry_timeout = Some(d)
                }
                "s3_capacity" => {
                    let n = parse_size(value).map_err(bad)?;
                    if n == 0 {
                        return Err(bad("must be > 0".into()));
                    }
                    self.s3.capacity = Some(n)
                }
                "s3_credentials" => {
                    let p = std::path::PathBuf::from(value);
                    if !p.is_absolute() {
                        return Err(bad("expected an absolute path".into()));
                    }
                    self.s3.credentials = Some(p)
                }
                "metrics" => self.metrics = Some(parse_listen(value).map_err(bad)?),
                "local_copy" => {
                    if !value.is_empty() {
                        return Err(bad("takes no value".into()));
                    }
                    self.local_copy = true
                }
                "host_id" => {
                    crate::pipeline::copies::check_host_id(value).map_err(bad)?;
                    self.host_id = Some(value.to_string())
                }
                "fuse_uring" => {
                    self.fuse_uring = match value {
                        "auto" => true,
                        "off" => false,
                        _ => return Err(bad("expected auto or off".into())),
                    }
                }
                "fuse_uring_poll" => {
                    let us: u64 = value
                        .parse()
                        .ok()
                        .filter(|us| *us <= 100_000)
                        .ok_or_else(|| bad("expected microseconds, 0 to 100000".into()))?;
                    self.fuse_uring_poll = Duration::from_micros(us)
                }
                // Generic mount(8) options: kernel flags are passed on (so
                // `ro` and `noexec` are enforced), the rest mean nothing to
                // a FUSE daemon. nosuid and nodev are always in force.
                "ro" => self.kernel_flags.push(fuser::MountOption::RO),
                "noexec" => self.kernel_flags.push(fuser::MountOption::NoExec),
                "noatime" => self.kernel_flags.push(fuser::MountOption::NoAtime),
                "dirsync" => self.kernel_flags.push(fuser::MountOption::DirSync),
                "rw" | "exec" | "nosuid" | "nodev" | "atime" | "relatime" | "defaults"
                | "_netdev" | "nofail" | "auto" | "noauto" | "user" | "users" | "nouser" => {}
                _ => return Err(OptionError::Unknown(key.to_string())),
            }
        }
        self.validate()
    }

    /// The write buffer in packets (what the streams' budget counts).
    pub fn write_buffer_packets(&self) -> usize {
        usize::try_from(self.write_buffer / self.packet_size.max(1)).unwrap_or(usize::MAX)
    }

    fn validate(&self) -> Result<(), OptionError> {
        let bad = |key: &str, value: String, why: &str| {
            Err(OptionError::BadValue {
                key: key.into(),
                value,
                why: why.into(),
            })
        };
        if self.packet_size < 512
            || !self.packet_size.is_multiple_of(512)
            || self.packet_size > 16 << 20
        {
            return bad(
                "packet_size",
                self.packet_size.to_string(),
                "must be a multiple of 512 between 512 and 16M",
            );
        }
        if !self.block_size.is_multiple_of(self.packet_size) || self.block_size < self.packet_size {
            return bad(
                "block_size",
                self.block_size.to_string(),
                "must be a multiple of packet_size",
            );
        }
        if self.max_packets_in_flight == 0 || self.max_packets_in_flight > 100_000 {
            return bad(
                "max_packets_in_flight",
                self.max_packets_in_flight.to_string(),
                "must be between 1 and 100000",
            );
        }
        if self.soft_limit.is_zero() || self.hard_limit < self.soft_limit {
            return bad(
                "hard_limit",
                format!("{:?}", self.hard_limit),
                "soft_limit must be > 0 and hard_limit >= soft_limit",
            );
        }
        if self.housekeeping_interval.is_zero() {
            return bad("housekeeping_interval", "0".into(), "must be > 0");
        }
        if self.monitor_interval.is_zero() {
            return bad("monitor_interval", "0".into(), "must be > 0");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_accept_binary_suffixes() {
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size("512"), Ok(512));
        assert!(parse_size("12X").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn options_parse_and_reject_unknown_keys() {
        let mut o = MountOptions::default();
        o.apply("soft_limit=2,hard_limit=5,lease_wait=1.5,block_size=1M,packet_size=64K")
            .unwrap();
        assert_eq!(o.soft_limit, Duration::from_secs(2));
        assert_eq!(o.lease_wait, Some(Duration::from_millis(1500)));
        assert_eq!(o.block_size, 1 << 20);
        assert!(matches!(o.apply("bogus=1"), Err(OptionError::Unknown(_))));
        assert!(o.apply("packet_size=1000").is_err());
        assert!(o.apply("max_packets_in_flight=x").is_err());
        let mut w = MountOptions::default();
        w.apply("write_buffer=16M").unwrap();
        assert_eq!(w.write_buffer, 16 << 20);
        assert_eq!(w.write_buffer_packets(), 256);
        let mut o = MountOptions::default();
        assert_eq!(o.journal_checkpoint, Duration::from_millis(200));
        o.apply("journal_checkpoint=0").unwrap();
        assert!(o.journal_checkpoint.is_zero());
        assert!(o.apply("journal_checkpoint=soon").is_err());
        assert!(o.apply("replica_sync=disk").is_err());
        use crate::sync_cpus::Placement;
        assert_eq!(o.sync_cpus, Placement::Auto);
        o.apply("sync_cpus=off").unwrap();
        assert_eq!(o.sync_cpus, Placement::Off);
        o.apply("sync_cpus=auto").unwrap();
        assert_eq!(o.sync_cpus, Placement::Auto);
        let cpu = crate::sync_cpus::allowed_cpus()[0];
        o.apply(&format!("sync_cpus={cpu}")).unwrap();
        assert_eq!(o.sync_cpus, Placement::Cpus(vec![cpu]));
        for bad in ["", "on", "2-1", "4096", "x,1"] {
            assert!(o.apply(&format!("sync_cpus={bad}")).is_err(), "{bad}");
        }
        assert!(o.sync_by_fs);
        o.apply("replica_sync=file").unwrap();
        assert!(o.reads_direct);
        o.apply("replica_reads=cached").unwrap();
        assert!(!o.reads_direct);
        o.apply("replica_reads=direct").unwrap();
        assert!(o.reads_direct);
        assert!(o.apply("replica_reads=").is_err());
        assert!(o.apply("replica_reads=odirect").is_err());
        assert!(!o.sync_by_fs);
        let mut o = MountOptions::default();
        assert_eq!(o.fuse_uring_poll, Duration::from_micros(1000));
        o.apply("fuse_uring_poll=0").unwrap();
        assert!(o.fuse_uring_poll.is_zero());
        o.apply("fuse_uring_poll=250").unwrap();
        assert_eq!(o.fuse_uring_poll, Duration::from_micros(250));
        for bad in [
            "fuse_uring_poll=",
            "fuse_uring_poll=-1",
            "fuse_uring_poll=1ms",
        ] {
            assert!(o.apply(bad).is_err(), "{bad}");
        }
        assert!(o.apply("fuse_uring_poll=100001").is_err());
    }

    #[test]
    fn s3_options_name_an_endpoint_a_region_and_a_file() {
        let mut o = MountOptions::default();
        o.apply(
            "s3_endpoint=http://127.0.0.1:3900,s3_region=garage,s3_credentials=/etc/leasefs/s3",
        )
        .unwrap();
        assert_eq!(o.s3.endpoint.as_deref(), Some("http://127.0.0.1:3900"));
        assert_eq!(o.s3.region.as_deref(), Some("garage"));
        assert_eq!(
            o.s3.credentials.as_deref(),
            Some(std::path::Path::new("/etc/leasefs/s3"))
        );
        for bad in [
            "s3_endpoint=127.0.0.1:3900",
            "s3_credentials=rel/path",
            "s3_region=",
            "s3_retry_timeout=0",
            "s3_retry_timeout=soon",
            "s3_capacity=0",
            "s3_capacity=lots",
        ] {
            assert!(o.apply(bad).is_err(), "{bad}");
        }
        assert_eq!(o.s3.retry_timeout, None);
        o.apply("s3_retry_timeout=2.5").unwrap();
        assert_eq!(o.s3.retry_timeout, Some(Duration::from_millis(2500)));
        assert_eq!(o.s3.capacity, None, "unbounded by default");
        o.apply("s3_capacity=10T").unwrap();
        assert_eq!(o.s3.capacity, Some(10 << 40));
    }

    #[test]
    fn local_copy_is_a_flag_and_host_id_a_plain_name() {
        let mut o = MountOptions::default();
        assert!(!o.local_copy && o.host_id.is_none());
        o.apply("local_copy,host_id=rack1-host7").unwrap();
        assert!(o.local_copy);
        assert_eq!(o.host_id.as_deref(), Some("rack1-host7"));
        for bad in ["local_copy=yes", "host_id=", "host_id=a b"] {
            assert!(o.apply(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_metrics_address_is_host_and_port() {
        let mut o = MountOptions::default();
        assert_eq!(o.metrics, None);
        o.apply("metrics=127.0.0.1:9567").unwrap();
        assert_eq!(o.metrics.as_deref(), Some("127.0.0.1:9567"));
        o.apply("metrics=[::1]:0").unwrap();
        assert_eq!(o.metrics.as_deref(), Some("[::1]:0"));
        for bad in [
            "metrics=9567",
            "metrics=:9567",
            "metrics=host:http",
            "metrics=h:70000",
        ] {
            assert!(
                matches!(o.apply(bad), Err(OptionError::BadValue { .. })),
                "{bad}"
            );
        }
    }
}
