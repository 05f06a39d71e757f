//! Command-line/environment configuration of authorization, flattened into the gateway's
//! `serve` command.

use std::collections::BTreeMap;
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
    /// A prefix per OIDC issuer for its users and groups in reviews, as `ISSUER=PREFIX`
    /// (comma-separated), e.g. `https://login.example.com=corp:`. Required for every issuer
    /// when several are accepted, so their users can be told apart in RBAC.
    #[arg(long, env = "TOOLYARD_AUTHZ_OIDC_ISSUER_PREFIXES", value_delimiter = ',', value_name = "ISSUER=PREFIX")]
    pub authz_oidc_issuer_prefixes: Vec<String>,
}

impl AuthzArgs {
    /// `--authz-oidc-issuer-prefixes` as a map, each entry checked.
    pub fn issuer_prefixes(&self) -> anyhow::Result<BTreeMap<String, String>> {
        let mut out = BTreeMap::new();
        for entry in self.authz_oidc_issuer_prefixes.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
            let (issuer, prefix) = entry
                .rsplit_once('=')
                .filter(|(i, p)| !i.trim().is_empty() && !p.trim().is_empty())
                .with_context(|| format!("--authz-oidc-issuer-prefixes: {entry:?} is not ISSUER=PREFIX"))?;
            if out.insert(issuer.trim().to_owned(), prefix.trim().to_owned()).is_some() {
                anyhow::bail!("--authz-oidc-issuer-prefixes: {issuer:?} is named twice");
            }
        }
        Ok(out)
    }

    /// With several OIDC issuers (`oidc_issuers`), Kubernetes RBAC must tell their users apart:
    /// every issuer needs a prefix of its own.
    pub fn check_issuers(&self, oidc_issuers: &[String]) -> anyhow::Result<()> {
        let prefixes = self.issuer_prefixes()?;
        if let Some(unknown) = prefixes.keys().find(|i| !oidc_issuers.contains(i)) {
            anyhow::bail!("--authz-oidc-issuer-prefixes names {unknown:?}, which is not an accepted OIDC issuer");
        }
        if self.authz_mode != AuthzMode::Kubernetes || oidc_issuers.len() < 2 {
            return Ok(());
        }
        if let Some(missing) = oidc_issuers.iter().find(|i| !prefixes.contains_key(i.as_str())) {
            anyhow::bail!(
                "several OIDC issuers are accepted, so each needs a prefix of its own for RBAC (users named \
                 alike at two identity providers must not be one subject): {missing:?} has none; set \
                 --authz-oidc-issuer-prefixes ISSUER=PREFIX,..."
            );
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(dup) = prefixes.values().find(|p| !seen.insert(p.as_str())) {
            anyhow::bail!("--authz-oidc-issuer-prefixes: the prefix {dup:?} is given to two issuers");
        }
        Ok(())
    }

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
                        oidc_issuer_prefixes: self.issuer_prefixes()?,
                    },
                    ..SarSettings::default()
                };
                Ok(Arc::new(SarAuthorizer::new(client, settings, metrics)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        authz: AuthzArgs,
    }

    fn args(flags: &[&str]) -> AuthzArgs {
        Cli::try_parse_from(std::iter::once("x").chain(flags.iter().copied())).expect("flags").authz
    }

    #[test]
    fn several_oidc_issuers_need_a_prefix_each() {
        let two = ["https://a.example".to_owned(), "https://b.example".to_owned()];
        let none = args(&[]);
        assert!(none.check_issuers(&two[..1]).is_ok(), "one issuer may use the common prefix");
        let e = none.check_issuers(&two).unwrap_err().to_string();
        assert!(e.contains("\"https://a.example\" has none"), "{e}");
        let both = args(&["--authz-oidc-issuer-prefixes", "https://a.example=a:,https://b.example=b:"]);
        assert!(both.check_issuers(&two).is_ok());
        assert_eq!(both.issuer_prefixes().unwrap()["https://b.example"], "b:");
        let same = args(&["--authz-oidc-issuer-prefixes", "https://a.example=x:,https://b.example=x:"]);
        assert!(same.check_issuers(&two).unwrap_err().to_string().contains("given to two issuers"));
        let stray = args(&["--authz-oidc-issuer-prefixes", "https://c.example=c:"]);
        assert!(stray.check_issuers(&two).unwrap_err().to_string().contains("not an accepted OIDC issuer"));
        let malformed = args(&["--authz-oidc-issuer-prefixes", "https://a.example"]);
        assert!(malformed.issuer_prefixes().unwrap_err().to_string().contains("is not ISSUER=PREFIX"));
        let static_mode = args(&["--authz-mode", "static"]);
        assert!(static_mode.check_issuers(&two).is_ok(), "a policy file names issuers itself");
    }
}
