//! The authenticated caller.

use toolyard_api::{Owner, OwnerKey};

/// Who is calling, as established by an [`crate::auth::Authenticator`].
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct Identity {
    /// Who vouched: `apikey`, an OIDC issuer URL, `kubernetes`, `local`.
    pub issuer: String,
    /// User name (subject).
    pub user: String,
    /// Groups.
    pub groups: Vec<String>,
    /// OAuth scopes granted to the credential (empty when the scheme has none).
    pub scopes: Vec<String>,
}

impl Identity {
    /// The owner recorded on ToolCalls and CodingTasks.
    pub fn owner(&self) -> Owner {
        Owner { issuer: self.issuer.clone(), user: self.user.clone(), groups: self.groups.clone() }
    }

    /// The storage prefix of this identity.
    pub fn owner_key(&self) -> OwnerKey {
        OwnerKey::derive(&self.issuer, &self.user)
    }

    /// The identity a run acts as, from its owner record.
    pub fn from_owner(owner: &Owner) -> Self {
        Self {
            issuer: owner.issuer.clone(),
            user: owner.user.clone(),
            groups: owner.groups.clone(),
            scopes: Vec::new(),
        }
    }
}
