//! Static API keys: random `ty_...` keys stored only as SHA-256 hashes, each with a user
//! and groups, loaded from a YAML/JSON file or a key of a Kubernetes Secret:
//!
//! ```yaml
//! keys:
//!   - user: alice
//!     groups: [quants]
//!     sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
//!     description: alice's laptop   # optional, for humans
//! ```
//!
//! Keys are random (about 256 bits), so a fast hash is right (a slow password hash would
//! make every request a denial-of-service lever); the comparison runs in constant time
//! over every configured hash. The identity's issuer is `apikey`.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Secret;
use rand::RngExt;
use serde::Deserialize;
use subtle::{ConditionallySelectable, ConstantTimeEq};
use tokio_util::sync::CancellationToken;

use super::{AuthError, Authenticator, reason};
use crate::identity::Identity;

/// Every API key starts with this; other bearer tokens are left to the next authenticator.
pub const API_KEY_PREFIX: &str = "ty_";
/// The issuer recorded on identities authenticated by API key.
pub const ISSUER: &str = "apikey";
/// Length of the random part of a generated key (base62, about 256 bits).
const RANDOM_LEN: usize = 43;

/// Problems loading API keys. Each names where the keys came from and, for content
/// errors, the field.
#[derive(Debug, thiserror::Error)]
pub enum ApiKeyError {
    /// The file could not be read.
    #[error("reading API key file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The Secret could not be read.
    #[error("reading API key Secret {namespace}/{name}: {source}")]
    Secret {
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
        /// Why.
        source: kube::Error,
    },
    /// The document is not valid YAML/JSON of the expected shape (unknown fields included).
    #[error("{origin}: {message}")]
    Parse {
        /// File path or Secret reference.
        origin: String,
        /// The parser's message (names the field and position).
        message: String,
    },
    /// The document changed between two reads a moment apart (a file being rewritten).
    #[error("{origin}: changed while being read (a file being rewritten?); the next reload reads it again")]
    Changing {
        /// File path or Secret reference.
        origin: String,
    },
    /// A field has a bad value.
    #[error("{origin}: {field}: {message}")]
    Field {
        /// File path or Secret reference.
        origin: String,
        /// The field, e.g. `keys[2].sha256`.
        field: String,
        /// What must hold.
        message: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKeyFile {
    #[serde(default)]
    keys: Vec<RawKey>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    user: String,
    #[serde(default)]
    groups: Vec<String>,
    sha256: String,
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
}

/// One configured key: who it authenticates, and the SHA-256 of the key.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// User name.
    pub user: String,
    /// Groups.
    pub groups: Vec<String>,
    hash: [u8; 32],
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The hash is not secret, but it has no business in logs either.
        f.debug_struct("ApiKey").field("user", &self.user).field("groups", &self.groups).finish_non_exhaustive()
    }
}

impl ApiKey {
    /// A key entry from its lowercase or uppercase hex SHA-256 (as [`generate_api_key`] returns).
    pub fn new(user: impl Into<String>, groups: Vec<String>, sha256_hex: &str) -> Result<Self, String> {
        let hash = parse_hex32(sha256_hex)?;
        Ok(Self { user: user.into(), groups, hash })
    }
}

/// A new random key `ty_<43 base62 chars>` and the hex SHA-256 to put in the key file.
pub fn generate_api_key() -> (String, String) {
    let key = random_token(API_KEY_PREFIX);
    let hash = hash_api_key(&key);
    (key, hash)
}

/// `prefix` followed by 43 random base62 characters (256 bits): API keys and the local
/// mode's OAuth codes and access tokens.
pub fn random_token(prefix: &str) -> String {
    let mut rng = rand::rng();
    let random: String = (0..RANDOM_LEN).map(|_| char::from(rng.sample(rand::distr::Alphanumeric))).collect();
    format!("{prefix}{random}")
}

/// The hex SHA-256 of a key, as stored in key files.
pub fn hash_api_key(key: &str) -> String {
    super::sha256_hex(key.as_bytes())
}

/// Parses a key document (YAML, or JSON when it starts with `{`). `origin` names the file
/// or Secret in errors.
pub fn parse_keys(text: &str, origin: &str) -> Result<Vec<ApiKey>, ApiKeyError> {
    let parse_err = |message: String| ApiKeyError::Parse { origin: origin.to_owned(), message };
    let raw: RawKeyFile = if text.trim().is_empty() {
        RawKeyFile { keys: Vec::new() }
    } else if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| parse_err(e.to_string()))?
    } else {
        serde_saphyr::from_str(text).map_err(|e| parse_err(e.to_string()))?
    };
    let field_err = |field: String, message: &str| ApiKeyError::Field {
        origin: origin.to_owned(),
        field,
        message: message.to_owned(),
    };
    let mut keys: Vec<ApiKey> = Vec::with_capacity(raw.keys.len());
    for (i, k) in raw.keys.into_iter().enumerate() {
        if !valid_name(&k.user) {
            return Err(field_err(
                format!("keys[{i}].user"),
                "must be a non-empty name of at most 256 characters without surrounding spaces",
            ));
        }
        if let Some(g) = k.groups.iter().position(|g| !valid_name(g)) {
            return Err(field_err(
                format!("keys[{i}].groups[{g}]"),
                "must be a non-empty name of at most 256 characters without surrounding spaces",
            ));
        }
        let hash = parse_hex32(&k.sha256).map_err(|m| field_err(format!("keys[{i}].sha256"), &m))?;
        if let Some(j) = keys.iter().position(|other| other.hash == hash) {
            return Err(field_err(format!("keys[{i}].sha256"), &format!("same hash as keys[{j}]")));
        }
        keys.push(ApiKey { user: k.user, groups: k.groups, hash });
    }
    Ok(keys)
}

fn valid_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 256 && s.trim() == s && !s.chars().any(char::is_control)
}

fn parse_hex32(s: &str) -> Result<[u8; 32], String> {
    let bytes = s.as_bytes();
    if bytes.len() != 64 {
        return Err(format!("must be 64 hex characters (a SHA-256), got {}", bytes.len()));
    }
    let mut out = [0u8; 32];
    hex::decode_to_slice(bytes, &mut out).map_err(|_| "must contain only hex characters")?;
    Ok(out)
}

/// Where keys come from.
#[derive(Clone)]
pub enum ApiKeySource {
    /// A YAML/JSON file.
    File(PathBuf),
    /// A key of a Kubernetes Secret holding the same document.
    Secret {
        /// Client allowed to `get` that Secret.
        client: kube::Client,
        /// Namespace of the Secret.
        namespace: String,
        /// Name of the Secret.
        name: String,
        /// Key in `data` (e.g. `keys.yaml`).
        key: String,
    },
}

impl std::fmt::Debug for ApiKeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl ApiKeySource {
    /// `file <path>` or `Secret <ns>/<name> key <key>`, as used in errors.
    pub fn describe(&self) -> String {
        match self {
            ApiKeySource::File(path) => path.display().to_string(),
            ApiKeySource::Secret { namespace, name, key, .. } => format!("Secret {namespace}/{name} key {key}"),
        }
    }

    /// Reads and parses the keys.
    pub async fn load(&self) -> Result<Vec<ApiKey>, ApiKeyError> {
        parse_keys(&self.read().await?, &self.describe())
    }

    /// Reads the key document's text.
    async fn read(&self) -> Result<String, ApiKeyError> {
        let origin = self.describe();
        Ok(match self {
            ApiKeySource::File(path) => tokio::fs::read_to_string(path)
                .await
                .map_err(|source| ApiKeyError::Read { path: path.clone(), source })?,
            ApiKeySource::Secret { client, namespace, name, key } => {
                let api: kube::Api<Secret> = kube::Api::namespaced(client.clone(), namespace);
                let secret = tokio::time::timeout(Duration::from_secs(10), api.get(name))
                    .await
                    .map_err(|_| ApiKeyError::Parse { origin: origin.clone(), message: "timed out after 10s".into() })?
                    .map_err(|source| ApiKeyError::Secret {
                        namespace: namespace.clone(),
                        name: name.clone(),
                        source,
                    })?;
                let bytes = secret.data.as_ref().and_then(|d| d.get(key)).ok_or_else(|| ApiKeyError::Field {
                    origin: origin.clone(),
                    field: format!("data.{key}"),
                    message: "missing".into(),
                })?;
                String::from_utf8(bytes.0.clone()).map_err(|_| ApiKeyError::Field {
                    origin: origin.clone(),
                    field: format!("data.{key}"),
                    message: "is not UTF-8 text".into(),
                })?
            }
        })
    }
}

/// How long a changed key document must read the same before a reload takes it (see
/// [`ApiKeyAuthenticator::reload`]).
pub const SETTLE: Duration = Duration::from_millis(200);

/// Authenticates `ty_...` bearer tokens against configured key hashes, from one or more
/// sources (a file and a Secret, say): a key one source does not know is looked up in the
/// next.
pub struct ApiKeyAuthenticator {
    sets: Vec<KeySet>,
}

/// The keys of one source.
struct KeySet {
    keys: RwLock<Arc<Vec<ApiKey>>>,
    source: Option<ApiKeySource>,
}

impl std::fmt::Debug for ApiKeyAuthenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sources: Vec<String> = self
            .sets
            .iter()
            .map(|s| s.source.as_ref().map_or_else(|| "fixed".into(), ApiKeySource::describe))
            .collect();
        f.debug_struct("ApiKeyAuthenticator").field("keys", &self.count()).field("sources", &sources).finish()
    }
}

impl ApiKeyAuthenticator {
    /// An authenticator with fixed keys (e.g. the generated key of local mode).
    pub fn from_keys(keys: Vec<ApiKey>) -> Self {
        Self { sets: vec![KeySet { keys: RwLock::new(Arc::new(keys)), source: None }] }
    }

    /// Loads keys from `source`; [`Self::reload`] reads it again.
    pub async fn load(source: ApiKeySource) -> Result<Self, ApiKeyError> {
        Self::load_all(vec![source]).await
    }

    /// Loads keys from each of `sources`, consulted in this order; [`Self::reload`] reads
    /// them again.
    pub async fn load_all(sources: Vec<ApiKeySource>) -> Result<Self, ApiKeyError> {
        let mut sets = Vec::with_capacity(sources.len());
        for source in sources {
            let keys = source.load().await?;
            tracing::info!(source = %source.describe(), keys = keys.len(), "API keys loaded");
            sets.push(KeySet { keys: RwLock::new(Arc::new(keys)), source: Some(source) });
        }
        Ok(Self { sets })
    }

    /// Reads every source again; a source that fails keeps its current keys (the others are
    /// still read) and the first error is returned. Returns whether any keys changed.
    ///
    /// A file rewritten in place (truncated, then written) can be read half written, so a
    /// reload guards against taking such a read:
    /// - An empty document while keys are in force is refused as an error: taking it would
    ///   revoke every key until the next reload. `keys: []` revokes them all.
    /// - A changed document is taken only if it reads the same again [`SETTLE`] later. A
    ///   document cut after its second key still parses, and taking it would revoke the keys
    ///   after the cut. One that changed in between is refused as an error; the next reload
    ///   reads it again.
    pub async fn reload(&self) -> Result<bool, ApiKeyError> {
        let mut changed = false;
        let mut first_error = None;
        for set in &self.sets {
            match set.reload_after(tokio::time::sleep(SETTLE)).await {
                Ok(c) => changed |= c,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        first_error.map_or(Ok(changed), Err)
    }

    /// [`Self::reload`] of a single-source authenticator, awaiting `pause` between the two
    /// reads of a changed document.
    #[cfg(test)]
    async fn reload_after(&self, pause: impl Future<Output = ()>) -> Result<bool, ApiKeyError> {
        self.sets[0].reload_after(pause).await
    }

    /// Reloads every `interval` until `shutdown`, logging (and keeping the old keys) on errors.
    pub fn spawn_reload(
        self: &Arc<Self>,
        interval: Duration,
        shutdown: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    _ = tick.tick() => {}
                }
                if let Err(e) = this.reload().await {
                    tracing::warn!(error = %e, "API keys not reloaded; keeping the previous ones");
                }
            }
        })
    }

    /// How many keys are in force, in all sources.
    fn count(&self) -> usize {
        self.sets.iter().map(|s| s.current().len()).sum()
    }
}

impl KeySet {
    async fn reload_after(&self, pause: impl Future<Output = ()>) -> Result<bool, ApiKeyError> {
        let Some(source) = &self.source else { return Ok(false) };
        let text = source.read().await?;
        if text.trim().is_empty() && !self.current().is_empty() {
            return Err(ApiKeyError::Parse {
                origin: source.describe(),
                message: "is empty (a file being rewritten?); write `keys: []` to revoke every key".into(),
            });
        }
        let keys = parse_keys(&text, &source.describe())?;
        if *self.current() == keys {
            return Ok(false);
        }
        pause.await;
        if source.read().await? != text {
            return Err(ApiKeyError::Changing { origin: source.describe() });
        }
        tracing::info!(source = %source.describe(), keys = keys.len(), "API keys reloaded");
        *self.keys.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(keys);
        Ok(true)
    }

    fn current(&self) -> Arc<Vec<ApiKey>> {
        Arc::clone(&self.keys.read().unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

#[async_trait]
impl Authenticator for ApiKeyAuthenticator {
    async fn authenticate(&self, token: &str) -> Result<Option<Identity>, AuthError> {
        if !token.starts_with(API_KEY_PREFIX) {
            return Ok(None);
        }
        let presented: [u8; 32] = {
            use sha2::Digest;
            sha2::Sha256::digest(token.as_bytes()).into()
        };
        // Every source's keys, in order: a key the first does not know is looked up in the next.
        // Compare against every hash without branching on secrets; keep the first match.
        let sets: Vec<Arc<Vec<ApiKey>>> = self.sets.iter().map(KeySet::current).collect();
        let mut found = subtle::Choice::from(0u8);
        let (mut set_index, mut key_index) = (0u64, 0u64);
        for (s, keys) in sets.iter().enumerate() {
            for (i, key) in keys.iter().enumerate() {
                let first = key.hash.ct_eq(&presented) & !found;
                set_index = u64::conditional_select(&set_index, &(s as u64), first);
                key_index = u64::conditional_select(&key_index, &(i as u64), first);
                found |= first;
            }
        }
        if !bool::from(found) {
            return Err(AuthError::new(reason::INVALID, "unknown API key"));
        }
        let keys = &sets[usize::try_from(set_index).unwrap_or(0).min(sets.len() - 1)];
        let key = &keys[usize::try_from(key_index).unwrap_or(usize::MAX).min(keys.len() - 1)];
        Ok(Some(Identity {
            issuer: ISSUER.to_owned(),
            user: key.user.clone(),
            groups: key.groups.clone(),
            scopes: Vec::new(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_have_the_prefix_and_match_their_hash() {
        let (key, hash) = generate_api_key();
        assert!(key.starts_with("ty_"));
        assert_eq!(key.len(), 3 + RANDOM_LEN);
        assert!(key[3..].chars().all(|c| c.is_ascii_alphanumeric()));
        assert_eq!(hash, hash_api_key(&key));
        assert_eq!(hash.len(), 64);
        assert_ne!(generate_api_key().0, key);
    }

    #[tokio::test]
    async fn matching_key_gives_user_and_groups_and_others_are_refused_or_skipped() {
        let (alice_key, alice_hash) = generate_api_key();
        let (bob_key, bob_hash) = generate_api_key();
        let auth = ApiKeyAuthenticator::from_keys(vec![
            ApiKey::new("alice", vec!["quants".into()], &alice_hash).expect("hash"),
            ApiKey::new("bob", vec![], &bob_hash.to_uppercase()).expect("hash"),
        ]);
        let alice = auth.authenticate(&alice_key).await.expect("ok").expect("accepted");
        assert_eq!((alice.issuer.as_str(), alice.user.as_str()), ("apikey", "alice"));
        assert_eq!(alice.groups, vec!["quants".to_owned()]);
        let bob = auth.authenticate(&bob_key).await.expect("ok").expect("accepted");
        assert_eq!(bob.user, "bob");
        let wrong = auth.authenticate(&generate_api_key().0).await.expect_err("refused");
        assert_eq!(wrong.reason, reason::INVALID);
        assert_eq!(auth.authenticate("eyJhbGciOi.x.y").await, Ok(None));
    }

    #[test]
    fn bad_documents_name_the_field() {
        let hash = "a".repeat(64);
        let cases = [
            (format!("keys:\n  - user: alice\n    sha256: {hash}\n    role: admin\n"), "role"),
            ("keys:\n  - user: alice\n    sha256: abc\n".to_owned(), "keys[0].sha256"),
            (format!("keys:\n  - user: ''\n    sha256: {hash}\n"), "keys[0].user"),
            (format!("keys:\n  - user: a\n    groups: ['']\n    sha256: {hash}\n"), "keys[0].groups[0]"),
            (format!("keys:\n  - user: a\n    sha256: {hash}\n  - user: b\n    sha256: {hash}\n"), "keys[1].sha256"),
            (format!("{{\"keys\": [{{\"user\": \"a\", \"sha\": \"{hash}\"}}]}}"), "sha"),
        ];
        for (doc, field) in cases {
            let err = parse_keys(&doc, "keys.yaml").expect_err(&doc).to_string();
            assert!(err.starts_with("keys.yaml: "), "{err}");
            assert!(err.contains(field), "{err} should name {field}");
        }
    }

    #[tokio::test]
    async fn a_key_the_first_source_does_not_know_is_looked_up_in_the_second() {
        let dir = std::env::temp_dir().join(format!("toolyard-apikey-sources-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let (alice_key, alice_hash) = generate_api_key();
        let (bob_key, bob_hash) = generate_api_key();
        let (first, second) = (dir.join("first.yaml"), dir.join("second.yaml"));
        std::fs::write(&first, format!("keys:\n  - user: alice\n    sha256: {alice_hash}\n")).expect("write");
        std::fs::write(&second, format!("keys:\n  - user: bob\n    sha256: {bob_hash}\n")).expect("write");
        let auth =
            ApiKeyAuthenticator::load_all(vec![ApiKeySource::File(first.clone()), ApiKeySource::File(second.clone())])
                .await
                .expect("keys");
        assert_eq!(auth.authenticate(&alice_key).await.expect("ok").expect("first").user, "alice");
        assert_eq!(auth.authenticate(&bob_key).await.expect("ok").expect("second").user, "bob");
        let (unknown, _) = generate_api_key();
        assert_eq!(auth.authenticate(&unknown).await.expect_err("in neither").reason, reason::INVALID);
        // A source that fails to reload keeps its keys; the other is still read.
        std::fs::write(&first, "keys: [oops").expect("write");
        std::fs::write(&second, "keys: []\n").expect("write");
        assert!(auth.reload().await.is_err(), "the first source's error is reported");
        assert!(auth.authenticate(&alice_key).await.expect("ok").is_some(), "alice's source kept its keys");
        assert!(auth.authenticate(&bob_key).await.is_err(), "bob's key was revoked by the second");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[tokio::test]
    async fn a_key_file_read_half_written_is_not_taken() {
        let dir = std::env::temp_dir().join(format!("toolyard-apikey-settle-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("keys.yaml");
        let keys: Vec<(String, String)> = (0..3).map(|_| generate_api_key()).collect();
        let doc = |users: &[&str]| {
            let mut doc = String::from("keys:\n");
            for (user, (_, hash)) in users.iter().zip(&keys) {
                doc.push_str(&format!("  - user: {user}\n    sha256: {hash}\n"));
            }
            doc
        };
        std::fs::write(&path, doc(&["alice"])).expect("write");
        let auth = ApiKeyAuthenticator::load(ApiKeySource::File(path.clone())).await.expect("keys");
        let user = |key: &str| {
            let auth = &auth;
            let key = key.to_owned();
            async move { auth.authenticate(&key).await.map(|id| id.map(|id| id.user)) }
        };

        // A rewrite in place that adds bob and carol: the reload reads it when only bob is
        // written (a document that parses), and the writer finishes before the second read.
        std::fs::write(&path, doc(&["alice", "bob"])).expect("first half");
        let finish = async { std::fs::write(&path, doc(&["alice", "bob", "carol"])).expect("the rest") };
        let e = auth.reload_after(finish).await.expect_err("a document that changed is not taken").to_string();
        assert!(e.contains(&path.display().to_string()) && e.contains("changed while being read"), "{e}");
        assert_eq!(user(&keys[0].0).await, Ok(Some("alice".to_owned())));
        assert_eq!(user(&keys[1].0).await.expect_err("bob not yet").reason, reason::INVALID);

        // The next reload reads the whole document twice alike and takes it.
        assert!(auth.reload_after(async {}).await.expect("reloaded"), "the keys changed");
        for ((key, _), name) in keys.iter().zip(["alice", "bob", "carol"]) {
            assert_eq!(user(key).await, Ok(Some(name.to_owned())));
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn empty_document_has_no_keys() {
        assert!(parse_keys("", "f").expect("ok").is_empty());
        assert!(parse_keys("keys: []\n", "f").expect("ok").is_empty());
    }
}
