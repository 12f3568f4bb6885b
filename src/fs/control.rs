//! The daemon's control socket (`DATA/control.sock`): one JSON request per
//! line, one JSON answer per line. It serves `leasefs leases` and
//! `leasefs recover-lease`, which need more than an xattr can carry.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use serde_json::{Value, json};

use super::core::Core;
use crate::meta::ROOT_INO;
use crate::sync::Arc;

pub fn socket_path(data: &Path) -> std::path::PathBuf {
    data.join("control.sock")
}

/// Starts the control server on its own thread.
pub fn serve(core: Arc<Core>, data: &Path, mountpoint: &Path) {
    let path = socket_path(data);
    let _ = std::fs::remove_file(&path);
    let listener = match UnixListener::bind(&path) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("control socket {}: {e}", path.display());
            return;
        }
    };
    let mnt = mountpoint.to_path_buf();
    let _ = std::thread::Builder::new()
        .name("control".into())
        .spawn(move || {
            for conn in listener.incoming().flatten() {
                let core = core.clone();
                let mnt = mnt.clone();
                let _ = std::thread::Builder::new()
                    .name("control-conn".into())
                    .spawn(move || handle(&core, &mnt, conn));
            }
        });
}

fn handle(core: &Arc<Core>, mnt: &Path, conn: UnixStream) {
    let Ok(w) = conn.try_clone() else { return };
    let mut w = w;
    for line in BufReader::new(conn).lines() {
        let Ok(line) = line else { return };
        let answer = match serde_json::from_str::<Value>(&line) {
            Ok(req) => answer(core, mnt, &req),
            Err(e) => json!({"error": format!("bad request: {e}")}),
        };
        if writeln!(w, "{answer}").is_err() {
            return;
        }
    }
}

/// Resolves a path relative to the mount root.
fn resolve(core: &Core, rel: &str) -> Result<u64, String> {
    let mut ino = ROOT_INO;
    for part in rel.split('/').filter(|p| !p.is_empty() && *p != ".") {
        ino = core
            .meta
            .lookup(ino, part.as_bytes())
            .map_err(|e| format!("{rel}: {e}"))?
            .ino;
    }
    Ok(ino)
}

fn answer(core: &Arc<Core>, mnt: &Path, req: &Value) -> Value {
    match req["op"].as_str().unwrap_or("") {
        "leases" => {
            let list: Vec<Value> = core
                .leases
                .list()
                .into_iter()
                .map(|l| {
                    let mut v = serde_json::to_value(&l).unwrap_or(Value::Null);
                    if let Some(o) = v.as_object_mut() {
                        let rel = core.meta.path_of(l.file);
                        o.insert("path".into(), json!(format!("{}{}", mnt.display(), rel)));
                    }
                    v
                })
                .collect();
            json!({ "leases": list })
        }
        "recover" => {
            let rel = req["path"].as_str().unwrap_or("");
            match resolve(core, rel) {
                Err(e) => json!({"error": e}),
                Ok(ino) => match core.recover_now(ino) {
                    Ok(closed) => json!({"closed": closed}),
                    Err(e) => json!({"error": e.to_string()}),
                },
            }
        }
        "audit" => match serde_json::from_value::<crate::meta::AuditEvent>(req["event"].clone()) {
            Ok(e) => match core.meta.audit(&e) {
                Ok(id) => json!({"id": id}),
                Err(e) => json!({"error": e.to_string()}),
            },
            Err(e) => json!({"error": format!("bad audit event: {e}")}),
        },
        "history" => match core
            .meta
            .audit_history(req["election"].as_str().unwrap_or(""))
        {
            Ok(rows) => json!({"events": rows}),
            Err(e) => json!({"error": e.to_string()}),
        },
        "fence" => match serde_json::from_value::<super::TermRegistration>(req.clone()) {
            Err(e) => json!({"error": format!("bad fence request: {e}")}),
            Ok(reg) => match resolve(core, &reg.path) {
                Err(e) => json!({"error": e}),
                Ok(ino) => match core.register_term(ino, &reg) {
                    Ok(()) => json!({"ok": true}),
                    Err(e) => json!({"error": e}),
                },
            },
        },
        "unfence" => {
            core.unregister_fence(req["pgid"].as_u64().unwrap_or(0) as u32);
            json!({"ok": true})
        }
        "fsck" => {
            let repair = req["repair"].as_bool().unwrap_or(false);
            match core.fsck(repair) {
                Ok(r) => json!({ "report": r }),
                Err(e) => json!({"error": e}),
            }
        }
        other => json!({"error": format!("unknown op '{other}'")}),
    }
}
