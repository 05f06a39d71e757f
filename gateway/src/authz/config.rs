//! Command-line/environment configuration of authorization, flattened into the gateway's
//! `serve` command.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};

use super::Authorizer;
use super::metrics::AuthzMetrics;
use super::policy::PolicyAuthorizer;
use super::sar::{SarAuthorizer, SarSettings};
use super::subject::SubjectMapping;

/// Which authorizer decides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum AuthzMode {
    /// Kubernetes RBAC via SubjectAccessReview.
    #[default]
    Kubernetes,
    /// A static policy file (`--policy-file`).
    Static,
}

/// Authorization flags (`TOOLYARD_*` environment fallbacks).
#[derive(Args, Clone, Debug)]
pub struct AuthzArgs {
    /// `kubernetes` (SubjectAccessReview) or `static` (a policy file).
    #[arg(long, env = "TOOLYARD_AUTHZ_MODE", value_enum, default_value_t = AuthzMode::Kubernetes)]
    pub authz_mode: AuthzMode,
    /// Policy file for `--authz-mode static`.
    #[arg(long, env = "TOOLYARD_POLICY_FILE", value_name = "PATH")]
    pub policy_file: Option<PathBuf>,
    /// How long an allow decision is reused.
    #[arg(long, env = "TOOLYARD_AUTHZ_CACHE_SECONDS", default_value_t = 30)]
    pub authz_cache_seconds: u64,
    /// How long a deny decision is reused.
    #[arg(long, env = "TOOLYARD_AUTHZ_DENY_CACHE_SECONDS", default_value_t = 10)]
    pub authz_deny_cache_seconds: u64,
    /// Timeout of each SubjectAccessReview.
    #[arg(long, env = "TOOLYARD_AUTHZ_TIMEOUT_SECONDS", default_value_t = 5)]
    pub authz_timeout_seconds: u64,
    /// Prefix of OIDC user names in reviews.
    #[arg(long, env = "TOOLYARD_AUTHZ_OIDC_USER_PREFIX", default_value = "oidc:")]
    pub authz_oidc_user_prefix: String,
    /// Prefix of OIDC groups in reviews.
    #[arg(long, env = "TOOLYARD_AUTHZ_OIDC_GROUP_PREFIX", default_value = "oidc:")]
    pub authz_oidc_group_prefix: String,
    /// Prefix of API-key user names in reviews.
    #[arg(long, env = "TOOLYARD_AUTHZ_APIKEY_USER_PREFIX", default_value = "")]
    pub authz_apikey_user_prefix: String,
    /// Prefix of API-key groups in reviews.
    #[arg(long, env = "TOOLYARD_AUTHZ_APIKEY_GROUP_PREFIX", default_value = "")]
    pub authz_apikey_group_prefix: String,
}

impl AuthzArgs {
    /// The configured authorizer. `kube` is required for `kubernetes` mode.
    pub fn build(&self, kube: Option<kube::Client>, metrics: AuthzMetrics) -> anyhow::Result<Arc<dyn Authorizer>> {
        match self.authz_mode {
            AuthzMode::Static => {
                let path = self.policy_file.as_ref().context("--authz-mode static needs --policy-file")?;
                Ok(Arc::new(PolicyAuthorizer::from_file(path)?.with_metrics(metrics)))
            }
            AuthzMode::Kubernetes => {
                if self.policy_file.is_some() {
                    anyhow::bail!("--policy-file is only used with --authz-mode static");
                }
                let client = kube.context("--authz-mode kubernetes needs Kubernetes access")?;
                let settings = SarSettings {
                    allow_ttl: Duration::from_secs(self.authz_cache_seconds),
                    deny_ttl: Duration::from_secs(self.authz_deny_cache_seconds),
                    timeout: Duration::from_secs(self.authz_timeout_seconds.max(1)),
                    subjects: SubjectMapping {
                        oidc_user_prefix: self.authz_oidc_user_prefix.clone(),
                        oidc_group_prefix: self.authz_oidc_group_prefix.clone(),
                        apikey_user_prefix: self.authz_apikey_user_prefix.clone(),
                        apikey_group_prefix: self.authz_apikey_group_prefix.clone(),
                    },
                    ..SarSettings::default()
                };
                Ok(Arc::new(SarAuthorizer::new(client, settings, metrics)))
            }
        }
    }
}
