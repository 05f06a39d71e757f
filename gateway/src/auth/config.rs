//! Command-line/environment configuration of authentication, flattened into the gateway's
//! `serve` command, and [`AuthArgs::build`] which turns it into the middleware state.
//!
//! Any combination of API keys (file or Secret), OIDC issuers and TokenReview may be on;
//! anonymous access only with `--anonymous`. With none of them the gateway refuses to start.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use tokio_util::sync::CancellationToken;

use super::Authenticator;
use super::apikey::{ApiKeyAuthenticator, ApiKeySource};
use super::chain::{Anonymous, AuthChain};
use super::jwks::JwksTiming;
use super::jwt::{JwtAuthenticator, JwtIssuerConfig, JwtSettings};
use super::metadata::ProtectedResourceMetadata;
use super::metrics::AuthMetrics;
use super::middleware::AuthState;
use super::tokenreview::{TokenReviewAuthenticator, TokenReviewSettings};
use crate::hosts::AllowedHosts;

/// Authentication flags (`TOOLYARD_*` environment fallbacks).
#[derive(Args, Clone, Debug)]
pub struct AuthArgs {
    /// YAML/JSON file of API key hashes (`keys: [{user, groups, sha256}]`).
    #[arg(long, env = "TOOLYARD_API_KEYS_FILE", value_name = "PATH")]
    pub api_keys_file: Option<PathBuf>,
    /// Secret holding the API key document: `name` (in the gateway's namespace) or `namespace/name`.
    #[arg(long, env = "TOOLYARD_API_KEYS_SECRET", value_name = "[NAMESPACE/]NAME")]
    pub api_keys_secret: Option<String>,
    /// Key of that Secret holding the document.
    #[arg(long, env = "TOOLYARD_API_KEYS_SECRET_KEY", default_value = "keys.yaml")]
    pub api_keys_secret_key: String,
    /// Re-read the API key file/Secret this often (0: never). A document that fails to parse,
    /// an empty one while keys are in force (`keys: []` revokes them all), or a changed one that
    /// does not read the same again 200 ms later (a file being rewritten) keeps the previous
    /// keys.
    #[arg(long, env = "TOOLYARD_API_KEYS_RELOAD_SECONDS", default_value_t = 30)]
    pub api_keys_reload_seconds: u64,

    /// Trusted OIDC/OAuth issuer URL (repeat or comma-separate for several).
    #[arg(long = "oidc-issuer", env = "TOOLYARD_OIDC_ISSUERS", value_delimiter = ',', value_name = "URL")]
    pub oidc_issuers: Vec<String>,
    /// Accepted `aud` values of JWTs (required with --oidc-issuer).
    #[arg(long = "oidc-audience", env = "TOOLYARD_OIDC_AUDIENCES", value_delimiter = ',')]
    pub oidc_audiences: Vec<String>,
    /// JWT claim holding the user name (a dotted path reaches nested claims).
    #[arg(long, env = "TOOLYARD_OIDC_USERNAME_CLAIM", default_value = "sub")]
    pub oidc_username_claim: String,
    /// JWT claim holding the groups.
    #[arg(long, env = "TOOLYARD_OIDC_GROUPS_CLAIM", default_value = "groups")]
    pub oidc_groups_claim: String,
    /// Tolerated clock skew for `exp`/`nbf`.
    #[arg(long, env = "TOOLYARD_OIDC_CLOCK_SKEW_SECONDS", default_value_t = 30)]
    pub oidc_clock_skew_seconds: u64,
    /// How long fetched JWKS keys are used before fetching again.
    #[arg(long, env = "TOOLYARD_OIDC_JWKS_TTL_SECONDS", default_value_t = 300)]
    pub oidc_jwks_ttl_seconds: u64,
    /// Minimum time between two JWKS fetches of one issuer (bounds refreshes on unknown `kid`s).
    #[arg(long, env = "TOOLYARD_OIDC_JWKS_MIN_REFRESH_SECONDS", default_value_t = 10)]
    pub oidc_jwks_min_refresh_seconds: u64,
    /// Timeout of discovery/JWKS requests.
    #[arg(long, env = "TOOLYARD_OIDC_HTTP_TIMEOUT_SECONDS", default_value_t = 10)]
    pub oidc_http_timeout_seconds: u64,
    /// OAuth scopes every OIDC token must carry (403 insufficient_scope otherwise).
    #[arg(long = "required-scope", env = "TOOLYARD_REQUIRED_SCOPES", value_delimiter = ',')]
    pub required_scopes: Vec<String>,
    /// Further scopes advertised in the protected resource metadata.
    #[arg(long = "supported-scope", env = "TOOLYARD_SUPPORTED_SCOPES", value_delimiter = ',')]
    pub supported_scopes: Vec<String>,

    /// Accept Kubernetes tokens (ServiceAccount tokens) via TokenReview.
    #[arg(long, env = "TOOLYARD_TOKENREVIEW", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub tokenreview: bool,
    /// Audience Kubernetes tokens must be valid for.
    #[arg(long, env = "TOOLYARD_TOKENREVIEW_AUDIENCE", default_value = "toolyard")]
    pub tokenreview_audience: String,
    /// How long an accepted Kubernetes token's identity is cached.
    #[arg(long, env = "TOOLYARD_TOKENREVIEW_CACHE_SECONDS", default_value_t = 60)]
    pub tokenreview_cache_seconds: u64,
    /// Also send tokens that are not JWTs to TokenReview (clusters with a static token file, or
    /// a webhook authenticator with opaque tokens). Off: only JWTs, the shape of ServiceAccount
    /// tokens, are reviewed; other tokens are refused without asking the apiserver.
    #[arg(long, env = "TOOLYARD_TOKENREVIEW_OPAQUE_TOKENS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub tokenreview_opaque_tokens: bool,
    /// Also send JWTs that none of the cluster's ServiceAccount keys signed to TokenReview (an
    /// apiserver that also accepts OIDC JWTs). Off: the gateway checks a JWT's signature with
    /// the keys at /openid/v1/jwks first and refuses the others itself.
    #[arg(long, env = "TOOLYARD_TOKENREVIEW_OTHER_JWTS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub tokenreview_other_jwts: bool,

    /// Let requests without credentials in as --anonymous-user. Off by default; meant for loopback.
    #[arg(long, env = "TOOLYARD_ANONYMOUS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub anonymous: bool,
    /// User name of anonymous requests.
    #[arg(long, env = "TOOLYARD_ANONYMOUS_USER", default_value = "anonymous")]
    pub anonymous_user: String,
    /// Groups of anonymous requests.
    #[arg(
        long = "anonymous-group",
        env = "TOOLYARD_ANONYMOUS_GROUPS",
        value_delimiter = ',',
        default_value = "system:unauthenticated"
    )]
    pub anonymous_groups: Vec<String>,
}

/// What [`AuthArgs::build`] needs from the rest of the gateway.
#[derive(Clone)]
pub struct AuthContext {
    /// Kubernetes client (for the key Secret and TokenReview); `None` in embedded mode.
    pub kube: Option<kube::Client>,
    /// Namespace of a Secret named without one (the gateway's namespace).
    pub namespace: String,
    /// Public base URL (`https://host[:port]`) for the resource metadata, if known.
    pub public_url: Option<String>,
    /// `https`, or `http` when serving plain HTTP (used with the Host header).
    pub default_scheme: String,
    /// The `Host` values served (`--allowed-hosts`; empty: any): the metadata is made for
    /// these only.
    pub allowed_hosts: Vec<String>,
    /// Counters to update (register them on `/metrics`).
    pub metrics: AuthMetrics,
    /// Stops background reloads.
    pub shutdown: CancellationToken,
}

impl std::fmt::Debug for AuthContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthContext")
            .field("kube", &self.kube.is_some())
            .field("namespace", &self.namespace)
            .field("public_url", &self.public_url)
            .finish_non_exhaustive()
    }
}

/// The result of [`AuthArgs::build`].
#[derive(Clone, Debug)]
pub struct AuthSetup {
    /// State for [`super::require_identity`].
    pub state: Arc<AuthState>,
    /// Document for [`super::metadata_router`] (same as `state.metadata`).
    pub metadata: ProtectedResourceMetadata,
}

impl AuthArgs {
    /// Builds the chain (API keys, then OIDC, then TokenReview), loads API keys (failing
    /// on a bad file), and starts the key reload task.
    pub async fn build(&self, ctx: AuthContext) -> anyhow::Result<AuthSetup> {
        let mut authenticators: Vec<Arc<dyn Authenticator>> = Vec::new();
        let mut sources = Vec::new();
        if let Some(path) = &self.api_keys_file {
            sources.push(ApiKeySource::File(path.clone()));
        }
        if let Some(secret) = &self.api_keys_secret {
            let client = ctx.kube.clone().context("--api-keys-secret needs Kubernetes access")?;
            let (namespace, name) = secret.split_once('/').unwrap_or((ctx.namespace.as_str(), secret.as_str()));
            if namespace.is_empty() || name.is_empty() {
                bail!("--api-keys-secret {secret:?}: expected NAME or NAMESPACE/NAME");
            }
            sources.push(ApiKeySource::Secret {
                client,
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                key: self.api_keys_secret_key.clone(),
            });
        }
        if !sources.is_empty() {
            // One authenticator over both sources: a key the file does not know is looked up
            // in the Secret.
            let keys = Arc::new(ApiKeyAuthenticator::load_all(sources).await?);
            if self.api_keys_reload_seconds > 0 {
                keys.spawn_reload(Duration::from_secs(self.api_keys_reload_seconds), ctx.shutdown.clone());
            }
            authenticators.push(keys);
        }

        if !self.oidc_issuers.is_empty() {
            let settings = JwtSettings {
                clock_skew: Duration::from_secs(self.oidc_clock_skew_seconds),
                jwks: JwksTiming {
                    ttl: Duration::from_secs(self.oidc_jwks_ttl_seconds),
                    min_refresh_interval: Duration::from_secs(self.oidc_jwks_min_refresh_seconds),
                },
                http_timeout: Duration::from_secs(self.oidc_http_timeout_seconds.max(1)),
            };
            let issuers = self
                .oidc_issuers
                .iter()
                .map(|issuer| JwtIssuerConfig {
                    issuer: issuer.clone(),
                    audiences: self.oidc_audiences.clone(),
                    jwks_uri: None,
                    username_claim: self.oidc_username_claim.clone(),
                    groups_claim: self.oidc_groups_claim.clone(),
                })
                .collect();
            authenticators.push(Arc::new(JwtAuthenticator::new(issuers, settings).map_err(anyhow::Error::msg)?));
        } else if !self.required_scopes.is_empty() {
            bail!("--required-scope only applies to OIDC tokens: also set --oidc-issuer");
        }

        if self.tokenreview {
            let client = ctx.kube.clone().context("--tokenreview needs Kubernetes access")?;
            if self.tokenreview_audience.is_empty() {
                bail!("--tokenreview-audience must not be empty");
            }
            let settings = TokenReviewSettings {
                audience: self.tokenreview_audience.clone(),
                positive_ttl: Duration::from_secs(self.tokenreview_cache_seconds),
                opaque_tokens: self.tokenreview_opaque_tokens,
                other_jwts: self.tokenreview_other_jwts,
                ..TokenReviewSettings::default()
            };
            authenticators.push(Arc::new(TokenReviewAuthenticator::new(client, settings)));
        }

        if authenticators.is_empty() && !self.anonymous {
            bail!(
                "no authentication configured: set --api-keys-file, --api-keys-secret, --oidc-issuer or --tokenreview \
                 (or --anonymous for local use)"
            );
        }
        let mut chain = AuthChain::new(authenticators).with_metrics(ctx.metrics);
        if self.anonymous {
            if self.anonymous_user.is_empty() {
                bail!("--anonymous-user must not be empty");
            }
            tracing::warn!(user = %self.anonymous_user, "anonymous access is on: requests without credentials are let in");
            chain = chain.with_anonymous(
                Anonymous { user: self.anonymous_user.clone(), groups: self.anonymous_groups.clone() }.identity(),
            );
        }

        let mut scopes_supported = self.required_scopes.clone();
        scopes_supported.extend(self.supported_scopes.iter().filter(|s| !self.required_scopes.contains(s)).cloned());
        let metadata = ProtectedResourceMetadata {
            public_url: ctx.public_url,
            default_scheme: ctx.default_scheme,
            authorization_servers: self.oidc_issuers.clone(),
            scopes_supported,
            resource_name: Some("Toolyard".into()),
            allowed_hosts: AllowedHosts::new(&ctx.allowed_hosts),
            own_authorization_server: false,
        };
        metadata.validate().map_err(anyhow::Error::msg)?;
        let state = AuthState {
            chain,
            metadata: metadata.clone(),
            required_scopes: self.required_scopes.clone(),
            scoped_issuers: self.oidc_issuers.clone(),
        };
        Ok(AuthSetup { state: Arc::new(state), metadata })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        auth: AuthArgs,
    }

    fn ctx() -> AuthContext {
        AuthContext {
            kube: None,
            namespace: "toolyard".into(),
            public_url: None,
            default_scheme: "https".into(),
            allowed_hosts: Vec::new(),
            metrics: AuthMetrics::default(),
            shutdown: CancellationToken::new(),
        }
    }

    #[tokio::test]
    async fn nothing_configured_refuses_to_start_and_anonymous_must_be_explicit() {
        let none = Cli::parse_from(["gw"]).auth;
        assert!(none.build(ctx()).await.is_err());
        let anon = Cli::parse_from(["gw", "--anonymous"]).auth;
        let setup = anon.build(ctx()).await.expect("anonymous");
        assert!(setup.state.chain.allows_anonymous());
    }

    #[tokio::test]
    async fn kubernetes_sources_need_a_client_and_oidc_needs_an_audience() {
        for args in [
            vec!["gw", "--tokenreview"],
            vec!["gw", "--api-keys-secret", "keys"],
            vec!["gw", "--oidc-issuer", "https://idp.example.com"],
            vec!["gw", "--anonymous", "--required-scope", "mcp"],
        ] {
            let parsed = Cli::parse_from(&args).auth;
            assert!(parsed.build(ctx()).await.is_err(), "{args:?} should be refused");
        }
        let oidc = Cli::parse_from(["gw", "--oidc-issuer", "https://idp.example.com", "--oidc-audience", "toolyard"]);
        let setup = oidc.auth.build(ctx()).await.expect("oidc");
        assert_eq!(setup.metadata.authorization_servers, vec!["https://idp.example.com".to_owned()]);
    }
}
