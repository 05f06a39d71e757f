//! Who a SubjectAccessReview asks about, for each kind of identity.
//!
//! | identity issuer | reviewed user | reviewed groups |
//! |---|---|---|
//! | `kubernetes` (TokenReview) | as Kubernetes named it | as Kubernetes named them (incl. `system:authenticated`) |
//! | `apikey` | `<apikey_user_prefix><user>` (prefix empty by default) | `<apikey_group_prefix><group>` + `system:authenticated` |
//! | an OIDC issuer URL | `<oidc_user_prefix><user>` (`oidc:` by default), or `<issuer's prefix><user>` | `<oidc_group_prefix><group>` (`oidc:`), or `<issuer's prefix><group>`; + `system:authenticated` |
//! | `anonymous`, `local` | as configured | as configured |
//!
//! The OIDC prefixes keep a user of an outside identity provider from ever being reviewed
//! as a Kubernetes user or group such as `system:masters`: bind RBAC to `oidc:alice` or
//! `oidc:quants`. With several OIDC issuers, each has a prefix of its own
//! ([`SubjectMapping::oidc_issuer_prefixes`]), so that `alice` of one identity provider is
//! never taken for `alice` of another. API keys are written by the gateway's operator, so by
//! default their users are reviewed under their own names.

use std::collections::BTreeMap;

use crate::auth::{apikey, chain, tokenreview};
use crate::identity::Identity;

/// The group Kubernetes gives every authenticated user.
pub const AUTHENTICATED_GROUP: &str = "system:authenticated";

/// Prefixes applied per identity kind.
#[derive(Clone, Debug)]
pub struct SubjectMapping {
    /// Prefix of OIDC user names.
    pub oidc_user_prefix: String,
    /// Prefix of OIDC groups.
    pub oidc_group_prefix: String,
    /// Prefix of API-key user names.
    pub apikey_user_prefix: String,
    /// Prefix of API-key groups.
    pub apikey_group_prefix: String,
    /// Prefix of the users and groups of one OIDC issuer (by issuer URL), instead of the
    /// OIDC prefixes above.
    pub oidc_issuer_prefixes: BTreeMap<String, String>,
}

impl Default for SubjectMapping {
    fn default() -> Self {
        Self {
            oidc_user_prefix: "oidc:".into(),
            oidc_group_prefix: "oidc:".into(),
            apikey_user_prefix: String::new(),
            apikey_group_prefix: String::new(),
            oidc_issuer_prefixes: BTreeMap::new(),
        }
    }
}

/// A user and sorted, de-duplicated groups, as sent in a review (and used as cache key).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Subject {
    /// User name.
    pub user: String,
    /// Groups, sorted.
    pub groups: Vec<String>,
}

impl SubjectMapping {
    /// The subject reviewed for `identity`.
    pub fn subject(&self, identity: &Identity) -> Subject {
        let (user_prefix, group_prefix, authenticated) = match identity.issuer.as_str() {
            tokenreview::ISSUER | chain::ANONYMOUS_ISSUER | "local" => ("", "", false),
            apikey::ISSUER => (self.apikey_user_prefix.as_str(), self.apikey_group_prefix.as_str(), true),
            issuer => match self.oidc_issuer_prefixes.get(issuer) {
                Some(prefix) => (prefix.as_str(), prefix.as_str(), true),
                None => (self.oidc_user_prefix.as_str(), self.oidc_group_prefix.as_str(), true),
            },
        };
        let mut groups: Vec<String> = identity.groups.iter().map(|g| format!("{group_prefix}{g}")).collect();
        if authenticated {
            groups.push(AUTHENTICATED_GROUP.to_owned());
        }
        groups.sort();
        groups.dedup();
        Subject { user: format!("{user_prefix}{}", identity.user), groups }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(issuer: &str, user: &str, groups: &[&str]) -> Identity {
        Identity {
            issuer: issuer.into(),
            user: user.into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            scopes: vec![],
        }
    }

    #[test]
    fn each_identity_kind_maps_as_documented() {
        let m = SubjectMapping::default();
        let k = m.subject(&id(
            "kubernetes",
            "system:serviceaccount:a:b",
            &["system:serviceaccounts", "system:authenticated"],
        ));
        assert_eq!(k.user, "system:serviceaccount:a:b");
        assert_eq!(k.groups, vec!["system:authenticated", "system:serviceaccounts"]);
        let a = m.subject(&id("apikey", "alice", &["quants"]));
        assert_eq!((a.user.as_str(), a.groups.clone()), ("alice", vec!["quants".into(), AUTHENTICATED_GROUP.into()]));
        let o = m.subject(&id("https://idp.example.com", "system:admin", &["system:masters"]));
        assert_eq!(o.user, "oidc:system:admin");
        assert_eq!(o.groups, vec!["oidc:system:masters", "system:authenticated"]);
        let anon = m.subject(&id("anonymous", "anonymous", &["system:unauthenticated"]));
        assert_eq!(anon.groups, vec!["system:unauthenticated"]);
    }

    #[test]
    fn each_oidc_issuer_can_have_its_own_prefix() {
        let m = SubjectMapping {
            oidc_issuer_prefixes: BTreeMap::from([
                ("https://a.example".to_owned(), "a:".to_owned()),
                ("https://b.example".to_owned(), "b:".to_owned()),
            ]),
            ..SubjectMapping::default()
        };
        let a = m.subject(&id("https://a.example", "alice", &["quants"]));
        let b = m.subject(&id("https://b.example", "alice", &["quants"]));
        assert_eq!(
            (a.user.as_str(), a.groups.clone()),
            ("a:alice", vec!["a:quants".into(), AUTHENTICATED_GROUP.into()])
        );
        assert_eq!(b.user, "b:alice");
        assert_ne!(a, b, "the same name at two identity providers is two subjects");
        assert_eq!(m.subject(&id("https://other.example", "alice", &[])).user, "oidc:alice");
    }
}
