//! Owner keys: the per-identity storage prefix, derived from issuer and subject.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Storage prefix of one identity: 32 lowercase hex characters of
/// `SHA-256(issuer || 0x00 || subject)`.
///
/// Derived only from the authenticated identity, never from client input, so a user can
/// neither pick nor guess another user's prefix. The same user name from two issuers gets
/// two keys.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OwnerKey(String);

/// Length of an owner key in characters.
pub const OWNER_KEY_LEN: usize = 32;

impl OwnerKey {
    /// Derives the key of `subject` as vouched for by `issuer`.
    pub fn derive(issuer: &str, subject: &str) -> Self {
        let mut hasher = Sha256::new();
        hasher.update(issuer.as_bytes());
        hasher.update([0u8]);
        hasher.update(subject.as_bytes());
        Self(hex::encode(&hasher.finalize()[..OWNER_KEY_LEN / 2]))
    }

    /// The key as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for OwnerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for OwnerKey {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        if s.len() == OWNER_KEY_LEN && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            Ok(Self(s))
        } else {
            Err(format!("an owner key is {OWNER_KEY_LEN} lowercase hex characters"))
        }
    }
}

impl From<OwnerKey> for String {
    fn from(k: OwnerKey) -> String {
        k.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derivation_is_stable_and_separates_issuers() {
        let a = OwnerKey::derive("apikey", "alice");
        assert_eq!(a, OwnerKey::derive("apikey", "alice"));
        assert_eq!(a.as_str().len(), OWNER_KEY_LEN);
        assert_ne!(a, OwnerKey::derive("https://issuer.example", "alice"));
        assert_ne!(a, OwnerKey::derive("apikey", "bob"));
        // The separator keeps ("ab", "c") apart from ("a", "bc").
        assert_ne!(OwnerKey::derive("ab", "c"), OwnerKey::derive("a", "bc"));
    }

    #[test]
    fn known_vector() {
        // python3 -c "import hashlib; print(hashlib.sha256(b'local\\x00dev').hexdigest()[:32])"
        assert_eq!(OwnerKey::derive("local", "dev").as_str(), "498a008e6ca11e17c0742e1f3e548b2f");
    }

    #[test]
    fn parsing_rejects_anything_but_the_canonical_form() {
        assert!(OwnerKey::try_from("../../etc".to_string()).is_err());
        assert!(OwnerKey::try_from("A".repeat(32)).is_err());
        assert!(OwnerKey::try_from("a".repeat(32)).is_ok());
    }
}
