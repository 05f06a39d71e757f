//! `GET /status`: what the caller's own requests meet, for `toolyard check` and for people
//! wondering why something fails. Authenticated like `/mcp`; it tells the caller only about
//! itself:
//!
//! ```json
//! {"version": "0.1.0",
//!  "identity": {"issuer": "kubernetes", "user": "system:serviceaccount:team-a:quant", "groups": [...]},
//!  "storage": {"writable": true},
//!  "codingTasks": true,
//!  "models": [{"profile": "default", "default": true, "reachable": true, "status": 200}]}
//! ```
//!
//! `storage` writes and reads back `status/write-probe` under the caller's own prefix, with
//! the gateway's credentials (what every call's files need). `models` lists the profiles
//! the caller may use, each probed from the gateway ([`crate::model::ModelProxy::probe`],
//! answers reused for 30 seconds).

use bytes::Bytes;
use serde_json::{Value, json};

use crate::identity::Identity;
use crate::state::AppState;

/// Where the storage probe writes, under the caller's prefix.
pub const PROBE_PATH: &str = "status/write-probe";

/// The report for `who`.
pub async fn report(state: &AppState, who: &Identity) -> Value {
    let (storage, (coding_tasks, models)) = tokio::join!(storage(state, who), models(state, who));
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "identity": {"issuer": who.issuer, "user": who.user, "groups": who.groups},
        "storage": storage,
        "codingTasks": coding_tasks,
        "models": models,
    })
}

async fn storage(state: &AppState, who: &Identity) -> Value {
    let owner = who.owner_key();
    let stamp = jiff::Timestamp::now().to_string();
    let probe = async {
        state.store.put(&owner, PROBE_PATH, Bytes::from(stamp.clone())).await?;
        state.store.get(&owner, PROBE_PATH).await
    };
    match tokio::time::timeout(state.settings.readiness_timeout, probe).await {
        Ok(Ok(Some(read))) if read == stamp.as_bytes() => json!({"writable": true}),
        Ok(Ok(_)) => json!({"writable": false, "error": "the probe written was not read back"}),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "status: storage probe failed");
            json!({"writable": false, "error": e.to_string()})
        }
        Err(_) => json!({"writable": false, "error": "storage did not answer in time"}),
    }
}

/// Whether `who` may start coding tasks, and the profiles it may use with their reach.
async fn models(state: &AppState, who: &Identity) -> (bool, Vec<Value>) {
    let Some(tasks) = &state.tasks else { return (false, Vec::new()) };
    let namespace = tasks.namespace();
    let allowed = state.authorizer.can_create_task(who, namespace).await.unwrap_or(false);
    let profiles = state.models.profiles();
    let default = profiles.resolve(None).ok().map(|p| p.name.clone());
    let mut out = Vec::new();
    for name in profiles.names() {
        if !state.authorizer.can_use_model(who, namespace, name).await.unwrap_or(false) {
            continue;
        }
        let Ok(profile) = profiles.resolve(Some(name)) else { continue };
        let reach = state.models.probe(profile).await;
        let mut entry = json!({"profile": name, "default": default.as_deref() == Some(name)});
        if let (Value::Object(entry), Ok(Value::Object(reach))) = (&mut entry, serde_json::to_value(&reach)) {
            entry.extend(reach);
        }
        out.push(entry);
    }
    (allowed, out)
}
