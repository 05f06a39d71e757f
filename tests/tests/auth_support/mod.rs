//! Shared pieces of the authentication tests: keys made with openssl, a local OIDC
//! identity provider (discovery + JWKS over HTTP on 127.0.0.1, counting JWKS fetches),
//! signed tokens, temp folders.

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use base64::Engine;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};
use toolyard_tests::local::TempDir;

/// A fresh folder under the system temp dir, removed when dropped.
pub fn temp_dir(prefix: &str) -> TempDir {
    TempDir::new(prefix)
}

/// Runs openssl with `args` in `dir`, panicking with its stderr on failure.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl").current_dir(dir).args(args).output().expect("running openssl");
    assert!(out.status.success(), "openssl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// A signing key of the test identity provider.
pub struct SigningKey {
    /// `kid` in the JWKS and token headers.
    pub kid: String,
    /// RS256 or ES256.
    pub alg: Algorithm,
    /// Private key.
    pub encoding: EncodingKey,
    /// Public JWK (with `kid`).
    pub jwk: Jwk,
    /// Public key PEM (what an attacker would use as an HMAC secret).
    pub public_pem: Vec<u8>,
}

impl SigningKey {
    /// A fresh RSA 2048 key.
    pub fn rsa(kid: &str) -> Self {
        let dir = temp_dir("jwt-key");
        openssl(&dir, &["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "key.pem"]);
        openssl(&dir, &["rsa", "-in", "key.pem", "-outform", "DER", "-traditional", "-out", "key.der"]);
        openssl(&dir, &["pkey", "-in", "key.pem", "-pubout", "-out", "pub.pem"]);
        let der = std::fs::read(dir.join("key.der")).expect("key");
        Self::finish(kid, Algorithm::RS256, EncodingKey::from_rsa_der(&der), &dir)
    }

    /// A fresh P-256 key.
    pub fn ec(kid: &str) -> Self {
        let dir = temp_dir("jwt-key");
        openssl(&dir, &["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "key.pem"]);
        openssl(&dir, &["pkcs8", "-topk8", "-nocrypt", "-in", "key.pem", "-outform", "DER", "-out", "key.der"]);
        openssl(&dir, &["pkey", "-in", "key.pem", "-pubout", "-out", "pub.pem"]);
        let der = std::fs::read(dir.join("key.der")).expect("key");
        Self::finish(kid, Algorithm::ES256, EncodingKey::from_ec_der(&der), &dir)
    }

    fn finish(kid: &str, alg: Algorithm, encoding: EncodingKey, dir: &Path) -> Self {
        let mut jwk = Jwk::from_encoding_key(&encoding, alg).expect("jwk");
        jwk.common.key_id = Some(kid.to_owned());
        let public_pem = std::fs::read(dir.join("pub.pem")).expect("pub");
        let _ = std::fs::remove_dir_all(dir);
        Self { kid: kid.to_owned(), alg, encoding, jwk, public_pem }
    }

    /// Signs `claims` with this key, `kid` in the header.
    pub fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding).expect("sign")
    }

    /// Signs `claims` with this key but names another `kid`.
    pub fn sign_as(&self, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(self.alg);
        header.kid = Some(kid.to_owned());
        jsonwebtoken::encode(&header, claims, &self.encoding).expect("sign")
    }
}

/// An unsigned token (`alg: none`).
pub fn unsigned(kid: &str, claims: &Value) -> String {
    let enc = |v: &Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    format!("{}.{}.", enc(&json!({"alg": "none", "typ": "JWT", "kid": kid})), enc(claims))
}

/// An HS256 token whose HMAC secret is `secret` (e.g. an RSA public key PEM).
pub fn hs256(kid: &str, secret: &[u8], claims: &Value) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(kid.to_owned());
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_secret(secret).expect("secret")).expect("sign")
}

/// Seconds since the epoch.
pub fn now() -> i64 {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock");
    i64::try_from(d.as_secs()).expect("time")
}

#[derive(Clone)]
struct IdpState {
    issuer: String,
    jwks: Arc<Mutex<JwkSet>>,
    fetches: Arc<AtomicUsize>,
}

/// A local OIDC identity provider: discovery and JWKS on `http://127.0.0.1:<port>`.
pub struct Idp {
    /// Issuer URL (also the discovery base).
    pub issuer: String,
    state: IdpState,
}

impl Idp {
    /// Starts serving with an empty key set.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let issuer = format!("http://{}", listener.local_addr().expect("addr"));
        let state = IdpState {
            issuer: issuer.clone(),
            jwks: Arc::new(Mutex::new(JwkSet { keys: Vec::new() })),
            fetches: Arc::new(AtomicUsize::new(0)),
        };
        let app = Router::new()
            .route(
                "/.well-known/openid-configuration",
                get(|State(s): State<IdpState>| async move {
                    axum::Json(json!({"issuer": s.issuer, "jwks_uri": format!("{}/jwks", s.issuer)}))
                }),
            )
            .route(
                "/jwks",
                get(|State(s): State<IdpState>| async move {
                    s.fetches.fetch_add(1, Ordering::SeqCst);
                    let set = s.jwks.lock().expect("jwks").clone();
                    axum::Json(serde_json::to_value(set).expect("jwks json"))
                }),
            )
            .with_state(state.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { issuer, state }
    }

    /// Publishes exactly `keys`.
    pub fn set_keys(&self, keys: &[&SigningKey]) {
        *self.state.jwks.lock().expect("jwks") = JwkSet { keys: keys.iter().map(|k| k.jwk.clone()).collect() };
    }

    /// JWKS documents served so far.
    pub fn jwks_fetches(&self) -> usize {
        self.state.fetches.load(Ordering::SeqCst)
    }

    /// Claims of a valid token for `sub` with audience `aud`, valid for an hour.
    pub fn claims(&self, sub: &str, aud: &str) -> Value {
        json!({
            "iss": self.issuer,
            "aud": aud,
            "sub": sub,
            "iat": now(),
            "exp": now() + 3600,
            "groups": ["quants", "viewers"],
            "scope": "mcp:tools profile",
        })
    }
}

/// RBAC set-up on the test cluster (as admin) and propagation waits.
pub mod rbac {
    use std::time::Duration;

    use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
    use k8s_openapi::api::rbac::v1::{
        ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
    };
    use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
    use toolyard_tests::{TestEnv, User, wait_until};

    /// One question about one subject.
    #[derive(Clone, Debug, Default)]
    pub struct Ask {
        /// User.
        pub user: String,
        /// Groups.
        pub groups: Vec<String>,
        /// Namespace ("" = cluster).
        pub namespace: String,
        /// API group.
        pub group: String,
        /// Resource.
        pub resource: String,
        /// Verb.
        pub verb: String,
        /// Resource name.
        pub name: Option<String>,
    }

    impl Ask {
        /// May `user` (in `groups`) `verb` `group`/`resource` in `namespace`?
        pub fn new(user: &str, groups: &[&str], namespace: &str, group: &str, resource: &str, verb: &str) -> Self {
            Self {
                user: user.to_owned(),
                groups: groups.iter().map(|g| (*g).to_owned()).collect(),
                namespace: namespace.to_owned(),
                group: group.to_owned(),
                resource: resource.to_owned(),
                verb: verb.to_owned(),
                name: None,
            }
        }

        /// The same question about one named object.
        pub fn named(mut self, name: &str) -> Self {
            self.name = Some(name.to_owned());
            self
        }
    }

    /// The apiserver's answer to `ask`, asked by admin.
    pub async fn allowed(ask: &Ask) -> anyhow::Result<bool> {
        let client = TestEnv::get().client(User::Admin).await;
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(ask.user.clone()),
                groups: Some(ask.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(ask.group.clone()),
                    resource: Some(ask.resource.clone()),
                    verb: Some(ask.verb.clone()),
                    namespace: (!ask.namespace.is_empty()).then(|| ask.namespace.clone()),
                    name: ask.name.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = Api::<SubjectAccessReview>::all(client).create(&PostParams::default(), &review).await?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }

    /// Waits until RBAC answers `ask` with `expected` (bindings take a moment to apply).
    pub async fn wait_for(ask: Ask, expected: bool) {
        let what = format!("RBAC to answer {expected} for {ask:?}");
        wait_until(Duration::from_secs(30), &what, || {
            let ask = ask.clone();
            async move { Ok(allowed(&ask).await? == expected) }
        })
        .await
        .expect("RBAC propagation");
    }

    fn rule(group: &str, resource: &str, verbs: &[&str], names: &[&str]) -> PolicyRule {
        PolicyRule {
            api_groups: Some(vec![group.to_owned()]),
            resources: Some(vec![resource.to_owned()]),
            verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
            resource_names: (!names.is_empty()).then(|| names.iter().map(|n| (*n).to_owned()).collect()),
            ..Default::default()
        }
    }

    /// A `User` or `Group` subject.
    pub fn subject(kind: &str, name: &str) -> Subject {
        Subject {
            kind: kind.to_owned(),
            name: name.to_owned(),
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            ..Default::default()
        }
    }

    fn apply() -> PatchParams {
        PatchParams::apply("toolyard-auth-tests").force()
    }

    /// ClusterRole `name` with one rule, bound cluster-wide to `subjects`.
    pub async fn cluster_grant(
        name: &str,
        group: &str,
        resource: &str,
        verbs: &[&str],
        names: &[&str],
        subjects: Vec<Subject>,
    ) {
        cluster_grant_rules(name, vec![rule(group, resource, verbs, names)], subjects).await;
    }

    /// `get` on the non-resource URL `path` for the gateway's user, waited for until the
    /// gateway's client can read it.
    pub async fn grant_gateway_url(name: &str, path: &str) {
        let rule = PolicyRule {
            non_resource_urls: Some(vec![path.to_owned()]),
            verbs: vec!["get".into()],
            ..Default::default()
        };
        cluster_grant_rules(name, vec![rule], vec![subject("User", "toolyard-gateway")]).await;
        let client = TestEnv::get().client(User::Gateway).await;
        for _ in 0..100 {
            let request = http::Request::get(path).body(Vec::new()).expect("request");
            if client.request_text(request).await.is_ok() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!("the gateway user still cannot get {path}");
    }

    /// ClusterRole `name` with `rules`, bound to `subjects`.
    pub async fn cluster_grant_rules(name: &str, rules: Vec<PolicyRule>, subjects: Vec<Subject>) {
        let client = TestEnv::get().client(User::Admin).await;
        let role = ClusterRole {
            metadata: ObjectMeta { name: Some(name.to_owned()), ..Default::default() },
            rules: Some(rules),
            ..Default::default()
        };
        Api::<ClusterRole>::all(client.clone()).patch(name, &apply(), &Patch::Apply(&role)).await.expect("ClusterRole");
        let binding = ClusterRoleBinding {
            metadata: ObjectMeta { name: Some(name.to_owned()), ..Default::default() },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: name.into(),
            },
            subjects: Some(subjects),
        };
        Api::<ClusterRoleBinding>::all(client)
            .patch(name, &apply(), &Patch::Apply(&binding))
            .await
            .expect("ClusterRoleBinding");
    }

    /// Role `name` in `namespace` with one rule, bound there to `subjects`.
    pub async fn namespace_grant(
        namespace: &str,
        name: &str,
        group: &str,
        resource: &str,
        verbs: &[&str],
        names: &[&str],
        subjects: Vec<Subject>,
    ) {
        let client = TestEnv::get().client(User::Admin).await;
        let role = Role {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                ..Default::default()
            },
            rules: Some(vec![rule(group, resource, verbs, names)]),
        };
        Api::<Role>::namespaced(client.clone(), namespace)
            .patch(name, &apply(), &Patch::Apply(&role))
            .await
            .expect("Role");
        let binding = RoleBinding {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                ..Default::default()
            },
            role_ref: RoleRef { api_group: "rbac.authorization.k8s.io".into(), kind: "Role".into(), name: name.into() },
            subjects: Some(subjects),
        };
        Api::<RoleBinding>::namespaced(client, namespace)
            .patch(name, &apply(), &Patch::Apply(&binding))
            .await
            .expect("RoleBinding");
    }

    /// Grants the gateway's user exactly `verb` on `group`/`resource` cluster-wide and
    /// waits until it applies.
    pub async fn grant_gateway(name: &str, group: &str, resource: &str, verb: &str) {
        cluster_grant(name, group, resource, &[verb], &[], vec![subject("User", "toolyard-gateway")]).await;
        wait_for(Ask::new("toolyard-gateway", &[], "", group, resource, verb), true).await;
    }

    /// Deletes a ClusterRole and its binding (best effort).
    pub async fn remove_cluster_grant(name: &str) {
        let client = TestEnv::get().client(User::Admin).await;
        let _ = Api::<ClusterRoleBinding>::all(client.clone()).delete(name, &Default::default()).await;
        let _ = Api::<ClusterRole>::all(client).delete(name, &Default::default()).await;
    }
}
