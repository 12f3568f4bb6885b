//! `leasefs fsck (MOUNTPOINT | --data DIR [-o s3_key=value,...]) [--json]
//! [--repair] [--shallow]`.
//! Exit codes: 0 healthy (with --repair: everything found was repaired),
//! 1 problems remain, 2 could not run.

use std::path::Path;
use std::process::ExitCode;

use serde_json::json;

use super::client::{ask, find_mount};
use super::fail;
use crate::fsck::{self, Check, Report};
use crate::meta::{DatanodeRegistry, MetaStore};
use crate::pipeline::Health;

/// What to do besides checking.
#[derive(Debug, Clone)]
pub struct How {
    pub repair: bool,
    /// Read every replica's checksums (online: root and the mounter only).
    pub deep: bool,
    /// Offline: `-o` options saying how to reach object-store datanodes.
    pub s3: Vec<String>,
}

pub fn run(mountpoint: Option<&Path>, data: Option<&Path>, as_json: bool, how: How) -> ExitCode {
    let report = match (mountpoint, data) {
        (Some(m), None) => online(m, how),
        (None, Some(d)) => offline(d, &how),
        _ => Err("give a mountpoint or --data DIR".to_string()),
    };
    let report = match report {
        Ok(r) => r,
        Err(e) => return fail(2, e),
    };
    if as_json {
        println!(
            "{}",
            serde_json::to_string(&report).unwrap_or_else(|_| "{}".into())
        );
    } else {
        for f in &report.open_for_write {
            let what = if f.live { "OPENFORWRITE" } else { "LEFT OPEN" };
            println!(
                "{}: {what} by {} ({}), epoch {}",
                f.path, f.holder, f.comm, f.epoch
            );
        }
        for p in &report.problems {
            let fixed = if p.repaired { " [repaired]" } else { "" };
            let block = p.block.map(|b| format!(" block {b}")).unwrap_or_default();
            let dn = p
                .datanode
                .map(|d| format!(" datanode {d}"))
                .unwrap_or_default();
            println!("{}:{block}{dn} {:?}: {}{fixed}", p.path, p.kind, p.detail);
        }
        for d in report
            .datanode_states
            .iter()
            .filter(|d| d.state != Health::Live)
        {
            let detail = d
                .detail
                .as_deref()
                .map(|w| format!(": {w}"))
                .unwrap_or_default();
            println!(
                "{}: datanode {} {}{detail}",
                d.path.display(),
                d.id,
                format!("{:?}", d.state).to_uppercase()
            );
        }
        println!("{}", report.summary());
    }
    ExitCode::from(report.exit_code())
}

fn online(m: &Path, how: How) -> Result<Report, String> {
    let (mp, _) = find_mount(m)?;
    let v = ask(
        &mp,
        json!({"op": "fsck", "repair": how.repair, "deep": how.deep}),
    )?;
    serde_json::from_value(v["report"].clone())
        .map_err(|e| format!("bad fsck answer from the daemon: {e}"))
}

/// How the offline check reaches object-store datanodes: what the last
/// mount of `data` recorded (`DATA/s3-options`: the endpoint, region and
/// credentials file it was given, never a secret), each `-o` key given
/// here replacing the recorded one; the `AWS_*` environment under both,
/// as for a mount.
fn s3_options(data: &Path, given: &[String]) -> Result<crate::config::S3Options, String> {
    use crate::storage::s3::settings;
    let mut o = crate::config::MountOptions {
        s3: settings::recorded(data)?.unwrap_or_default(),
        ..Default::default()
    };
    for list in given {
        for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            if !item.starts_with("s3_") {
                return Err(format!(
                    "fsck --data takes only the s3_ options of a mount with -o (not {item})"
                ));
            }
        }
        o.apply(list).map_err(|e| e.to_string())?;
    }
    Ok(o.s3)
}

fn offline(data: &Path, how: &How) -> Result<Report, String> {
    let repair = how.repair;
    let db = data.join("meta.db");
    if !db.exists() {
        if data.join("instance").exists() {
            return Err(format!(
                "{} is the data directory of a daemon over etcd; run fsck on a mountpoint of that filesystem",
                data.display()
            ));
        }
        return Err(format!("{} holds no leasefs metadata", data.display()));
    }
    let _lock = crate::daemon::lock_data_dir(data)
        .map_err(|e| format!("{e}; run fsck on its mountpoint instead"))?;
    crate::storage::s3::settings::install(s3_options(data, &how.s3)?);
    let meta = MetaStore::open(&db, 0, 0).map_err(|e| e.to_string())?;
    let replication = meta.replication().map_err(|e| e.to_string())?;
    let mut dns = crate::pipeline::attach::recorded(&meta, 1).map_err(|e| e.to_string())?;
    if dns.is_empty() {
        return Err(format!("{} records no datanodes", data.display()));
    }
    dns.replication = replication.unwrap_or(dns.len().min(3));
    dns.heartbeat();
    // What the block journal holds is restored before anything is judged
    // missing or corrupt (as at mount); a check that repairs nothing
    // leaves it to the next mount.
    if repair {
        crate::pipeline::journal::replay(&meta, &dns).map_err(|e| e.to_string())?;
    }
    let recover =
        |ino| crate::pipeline::recovery::recover_file(&meta, &dns, ino, Default::default());
    fsck::run(&Check {
        meta: &meta,
        dns: &dns,
        repair,
        live_leases: Default::default(),
        busy_blocks: Default::default(),
        progress: true,
        deep: true,
        suspect: Default::default(),
        orphans: true,
        excess: true,
        // No daemon runs on this data directory: nothing is being created.
        orphan_grace: std::time::Duration::ZERO,
        grace_finalized: false,
        shared: false,
        copy: true,
        pin: &fsck::no_writers,
        recover: &recover,
        cancelled: &fsck::never_cancelled,
    })
}
