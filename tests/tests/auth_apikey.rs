//! Static API keys: hashed key files (YAML and JSON), the command-line configuration,
//! reloads, and the Kubernetes Secret source read from the real apiserver by the gateway's
//! user with `get` on that one Secret only.

use crate::auth_support;

use std::collections::BTreeMap;
use std::time::Duration;

use auth_support::rbac::{self, Ask, subject};
use clap::Parser;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams};
use tokio_util::sync::CancellationToken;
use toolyard_gateway::auth::apikey::{ApiKeyAuthenticator, ApiKeySource, generate_api_key};
use toolyard_gateway::auth::config::AuthContext;
use toolyard_gateway::auth::{AuthArgs, AuthMetrics, Authenticator, reason};
use toolyard_tests::{TestEnv, User, wait_until};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    auth: AuthArgs,
}

fn args(extra: &[&str]) -> AuthArgs {
    Cli::parse_from(std::iter::once("toolyard-gateway").chain(extra.iter().copied())).auth
}

fn context(kube: Option<kube::Client>) -> AuthContext {
    AuthContext {
        kube,
        namespace: "default".into(),
        public_url: Some("https://gw.example.com".into()),
        default_scheme: "https".into(),
        allowed_hosts: Vec::new(),
        metrics: AuthMetrics::default(),
        shutdown: CancellationToken::new(),
    }
}

fn key_doc(entries: &[(&str, &[&str], &str)]) -> String {
    let mut doc = String::from("keys:\n");
    for (user, groups, hash) in entries {
        doc.push_str(&format!("  - user: {user}\n    groups: {groups:?}\n    sha256: {hash}\n"));
    }
    doc
}

#[tokio::test]
async fn a_hashed_key_file_authenticates_its_users_and_nothing_else() {
    let dir = auth_support::temp_dir("apikeys");
    let (alice_key, alice_hash) = generate_api_key();
    let (bob_key, bob_hash) = generate_api_key();
    let path = dir.join("keys.yaml");
    std::fs::write(&path, key_doc(&[("alice", &["quants"], &alice_hash), ("bob", &[], &bob_hash)])).expect("write");
    let file_text = std::fs::read_to_string(&path).expect("read");
    assert!(!file_text.contains(&alice_key), "the file holds hashes, not keys");

    let path_arg = path.to_string_lossy().into_owned();
    let setup = args(&["--api-keys-file", &path_arg]).build(context(None)).await.expect("auth setup");
    let chain = &setup.state.chain;
    let alice = chain.authenticate(Some(&alice_key)).await.expect("alice");
    assert_eq!((alice.issuer.as_str(), alice.user.as_str()), ("apikey", "alice"));
    assert_eq!(alice.groups, vec!["quants"]);
    assert_eq!(chain.authenticate(Some(&bob_key)).await.expect("bob").user, "bob");

    let (other_key, _) = generate_api_key();
    assert_eq!(chain.authenticate(Some(&other_key)).await.expect_err("unknown key").reason, reason::INVALID);
    let mut almost = alice_key.clone();
    almost.pop();
    almost.push(if alice_key.ends_with('a') { 'b' } else { 'a' });
    assert_eq!(chain.authenticate(Some(&almost)).await.expect_err("altered key").reason, reason::INVALID);
    assert_eq!(chain.authenticate(Some("not-an-api-key")).await.expect_err("other").reason, reason::UNRECOGNIZED);
    assert_eq!(chain.authenticate(None).await.expect_err("no key").reason, reason::MISSING);
    assert_eq!(chain.metrics().failures_for(reason::INVALID), 2);
}

#[tokio::test]
async fn a_json_key_file_works_too_and_bad_files_name_file_and_field() {
    let dir = auth_support::temp_dir("apikeys");
    let (key, hash) = generate_api_key();
    let json_path = dir.join("keys.json");
    std::fs::write(&json_path, format!(r#"{{"keys": [{{"user": "carol", "groups": ["ops"], "sha256": "{hash}"}}]}}"#))
        .expect("write");
    let auth = ApiKeyAuthenticator::load(ApiKeySource::File(json_path)).await.expect("json keys");
    assert_eq!(auth.authenticate(&key).await.expect("ok").expect("carol").user, "carol");

    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, format!("keys:\n  - user: dave\n    sha256: {hash}\n    password: hunter2\n")).expect("write");
    let e = ApiKeyAuthenticator::load(ApiKeySource::File(bad.clone())).await.expect_err("unknown field").to_string();
    assert!(e.contains(&bad.display().to_string()) && e.contains("password"), "{e}");

    std::fs::write(&bad, "keys:\n  - user: dave\n    sha256: 1234\n").expect("write");
    let e = ApiKeyAuthenticator::load(ApiKeySource::File(bad.clone())).await.expect_err("short hash").to_string();
    assert!(e.contains(&bad.display().to_string()) && e.contains("keys[0].sha256"), "{e}");

    let missing = dir.join("missing.yaml");
    let e = ApiKeyAuthenticator::load(ApiKeySource::File(missing.clone())).await.expect_err("missing").to_string();
    assert!(e.contains(&missing.display().to_string()), "{e}");
}

#[tokio::test]
async fn a_changed_key_file_is_picked_up_by_the_reload_task() {
    let dir = auth_support::temp_dir("apikeys");
    let path = dir.join("keys.yaml");
    let (old_key, old_hash) = generate_api_key();
    let (new_key, new_hash) = generate_api_key();
    std::fs::write(&path, key_doc(&[("alice", &[], &old_hash)])).expect("write");
    let auth = std::sync::Arc::new(ApiKeyAuthenticator::load(ApiKeySource::File(path.clone())).await.expect("keys"));
    let stop = CancellationToken::new();
    auth.spawn_reload(Duration::from_millis(100), stop.clone());

    replace_file(&path, &key_doc(&[("alice", &[], &new_hash)]));
    wait_until(Duration::from_secs(10), "the new key to be accepted", || {
        let (auth, new_key) = (auth.clone(), new_key.clone());
        async move { Ok(auth.authenticate(&new_key).await.is_ok()) }
    })
    .await
    .expect("reloaded");
    assert_eq!(auth.authenticate(&old_key).await.expect_err("revoked").reason, reason::INVALID);

    // A broken file keeps the keys in force.
    replace_file(&path, "keys: [this is not right\n");
    assert!(auth.reload().await.is_err());
    assert!(auth.authenticate(&new_key).await.expect("still accepted").is_some());
    stop.cancel();
}

#[tokio::test]
async fn an_empty_key_file_on_reload_keeps_the_keys_and_an_empty_list_revokes_them() {
    let dir = auth_support::temp_dir("apikeys");
    let path = dir.join("keys.yaml");
    let (key, hash) = generate_api_key();
    std::fs::write(&path, key_doc(&[("alice", &[], &hash)])).expect("write");
    let auth = ApiKeyAuthenticator::load(ApiKeySource::File(path.clone())).await.expect("keys");

    // What a reload reads between the truncation and the write of `>` in a shell.
    std::fs::write(&path, "").expect("truncate");
    let e = auth.reload().await.expect_err("an empty file is not taken").to_string();
    assert!(e.contains(&path.display().to_string()) && e.contains("keys: []"), "{e}");
    assert!(auth.authenticate(&key).await.expect("still accepted").is_some());

    std::fs::write(&path, "keys: []\n").expect("write");
    assert!(auth.reload().await.expect("reloaded"), "the keys changed");
    assert_eq!(auth.authenticate(&key).await.expect_err("revoked").reason, reason::INVALID);

    // With no keys in force, an empty file is no change.
    std::fs::write(&path, "").expect("truncate");
    assert!(!auth.reload().await.expect("an empty file with no keys in force"));
}

/// Replaces a file's content in one step (write a sibling, rename it over), as editors and
/// Kubernetes volume updates do. `std::fs::write` truncates first: the reload task could read
/// the file half written.
fn replace_file(path: &std::path::Path, text: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).expect("write");
    std::fs::rename(&next, path).expect("rename");
}

#[tokio::test]
async fn keys_from_a_secret_are_read_with_get_on_that_secret_only() {
    let env = TestEnv::get();
    let ns = env.namespace("authkeys").await.expect("namespace");
    let (alice_key, alice_hash) = generate_api_key();
    let (bob_key, bob_hash) = generate_api_key();
    let secrets: Api<Secret> = Api::namespaced(env.client(User::Admin).await, &ns);
    let put = |doc: String| {
        let secrets = secrets.clone();
        async move {
            let secret = Secret {
                metadata: ObjectMeta { name: Some("toolyard-api-keys".into()), ..Default::default() },
                data: Some(BTreeMap::from([("keys.yaml".to_owned(), ByteString(doc.into_bytes()))])),
                ..Default::default()
            };
            secrets
                .patch("toolyard-api-keys", &PatchParams::apply("toolyard-auth-tests").force(), &Patch::Apply(&secret))
                .await
                .expect("secret");
        }
    };
    put(key_doc(&[("alice", &["quants"], &alice_hash)])).await;
    rbac::namespace_grant(
        &ns,
        "read-api-keys",
        "",
        "secrets",
        &["get"],
        &["toolyard-api-keys"],
        vec![subject("User", "toolyard-gateway")],
    )
    .await;
    rbac::wait_for(Ask::new("toolyard-gateway", &[], &ns, "", "secrets", "get").named("toolyard-api-keys"), true).await;

    // Through the command-line configuration, as the gateway's user.
    let secret_arg = format!("{ns}/toolyard-api-keys");
    let gateway = env.client(User::Gateway).await;
    let setup = args(&["--api-keys-secret", &secret_arg, "--api-keys-reload-seconds", "0"])
        .build(context(Some(gateway.clone())))
        .await
        .expect("keys from the Secret");
    let alice = setup.state.chain.authenticate(Some(&alice_key)).await.expect("alice");
    assert_eq!((alice.user.as_str(), alice.groups.clone()), ("alice", vec!["quants".to_owned()]));

    // Rotation in the Secret: reload replaces the keys.
    let source = ApiKeySource::Secret {
        client: gateway.clone(),
        namespace: ns.clone(),
        name: "toolyard-api-keys".into(),
        key: "keys.yaml".into(),
    };
    let auth = ApiKeyAuthenticator::load(source).await.expect("keys");
    put(key_doc(&[("bob", &["ops"], &bob_hash)])).await;
    assert!(auth.reload().await.expect("reload"), "the keys changed");
    assert_eq!(auth.authenticate(&bob_key).await.expect("ok").expect("bob").user, "bob");
    assert_eq!(auth.authenticate(&alice_key).await.expect_err("rotated out").reason, reason::INVALID);

    // Another Secret in the same namespace is not readable: the grant is for one Secret.
    let other =
        ApiKeySource::Secret { client: gateway, namespace: ns.clone(), name: "other".into(), key: "keys.yaml".into() };
    let e = ApiKeyAuthenticator::load(other).await.expect_err("forbidden").to_string();
    assert!(e.contains(&format!("{ns}/other")), "{e}");
}
