//! The control-socket requests of datanode administration. `list`,
//! `progress` and `balance_status` are open to every user (they say
//! nothing about anyone's files); the changes (`add`, `decommission`,
//! `remove`, `balance`) are for root and the user who mounted, which the
//! control socket decides from the peer's credentials (`SO_PEERCRED`, see
//! docs/SEMANTICS.md, "The control socket") and passes as `may_change`.
//!
//! | op | fields | answer |
//! |---|---|---|
//! | `datanode_list` | | `datanodes`: [`super::DatanodeInfo`]s |
//! | `datanode_add` | `dir` | `id` |
//! | `datanode_decommission` | `dir` | `progress`: [`super::Progress`] |
//! | `datanode_progress` | `id` | `progress` |
//! | `datanode_remove` | `dir`, `force` | `removed`: [`super::Removed`] |
//! | `datanode_balance` | `threshold` | `balance`: [`super::balance::Status`] |
//! | `datanode_balance_status` | | `balance` (null before any) |

use std::path::Path;

use serde_json::{Value, json};

use super::Admin;
use crate::meta::DnId;

/// Whether request `op` changes the mount's datanodes.
pub fn changes(op: &str) -> bool {
    matches!(
        op,
        "datanode_add" | "datanode_decommission" | "datanode_remove" | "datanode_balance"
    )
}

/// Answers one request `op` (a name starting with `datanode_`).
pub fn answer(admin: &Admin, op: &str, req: &Value, may_change: bool) -> Value {
    if changes(op) && !may_change {
        return json!({"error": "permission denied: datanode changes are for root and the user who mounted"});
    }
    let dir = || -> Result<&Path, String> {
        req["dir"]
            .as_str()
            .map(Path::new)
            .filter(|p| p.is_absolute() || p.to_str().is_some_and(|s| s.starts_with("DS-")))
            .ok_or_else(|| {
                "bad request: 'dir' must be an absolute path or a storage ID".to_string()
            })
    };
    let r: Result<Value, String> = match op {
        "datanode_list" => admin
            .list()
            .map(|l| json!({ "datanodes": l }))
            .map_err(|e| e.to_string()),
        "datanode_add" => dir().and_then(|d| {
            admin
                .add(d)
                .map(|id| json!({ "id": id }))
                .map_err(|e| e.to_string())
        }),
        "datanode_decommission" => dir().and_then(|d| {
            admin
                .decommission(d)
                .map(|p| json!({ "progress": p }))
                .map_err(|e| e.to_string())
        }),
        "datanode_progress" => match req["id"].as_u64().and_then(|v| u32::try_from(v).ok()) {
            Some(id) => admin
                .progress(DnId(id))
                .map(|p| json!({ "progress": p }))
                .map_err(|e| e.to_string()),
            None => Err("bad request: 'id' is missing".into()),
        },
        "datanode_remove" => dir().and_then(|d| {
            admin
                .remove(d, req["force"].as_bool().unwrap_or(false))
                .map(|r| json!({ "removed": r }))
                .map_err(|e| e.to_string())
        }),
        "datanode_balance" => match req["threshold"].as_f64() {
            Some(t) if t > 0.0 && t <= 100.0 => Ok(json!({ "balance": admin.balance(t) })),
            _ => Err("bad request: 'threshold' must be a percentage in (0, 100]".into()),
        },
        "datanode_balance_status" => Ok(json!({ "balance": admin.balance_status() })),
        other => Err(format!("unknown op '{other}'")),
    };
    r.unwrap_or_else(|e| json!({ "error": e }))
}
