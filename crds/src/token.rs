//! Scoped runner tokens: HMAC-SHA256 signed claims naming one call or task.
//!
//! The controller (Kubernetes) or the local executor (embedded mode) mints a token per run;
//! the runner presents it to the gateway's internal API, which only lets it touch that run's
//! files under that owner's prefix. Format: `tyr1.<base64url(json claims)>.<base64url(mac)>`.

use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use thiserror::Error;

use crate::common::Owner;

const PREFIX: &str = "tyr1";

/// What a token is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunKind {
    /// One tool call.
    Call,
    /// One coding task (may also call tools as its owner).
    Task,
}

/// The claims a runner token carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// Call or task.
    pub kind: RunKind,
    /// Namespace of the ToolCall / CodingTask (empty in embedded mode).
    pub ns: String,
    /// The run id (object name).
    pub id: String,
    /// The identity the run acts as.
    pub owner: Owner,
    /// Expiry, seconds since the Unix epoch.
    pub exp: i64,
}

/// A shared HMAC key. At least 32 bytes; its bytes never appear in `Debug` output.
#[derive(Clone)]
pub struct SigningKey(Vec<u8>);

/// Shortest accepted key.
pub const MIN_KEY_LEN: usize = 32;

impl SigningKey {
    /// Wraps key bytes (as read from a file or Secret; a trailing newline is dropped).
    pub fn new(mut bytes: Vec<u8>) -> Result<Self, TokenError> {
        while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
            bytes.pop();
        }
        if bytes.len() < MIN_KEY_LEN {
            return Err(TokenError::WeakKey(bytes.len()));
        }
        Ok(Self(bytes))
    }

    fn mac(&self) -> Hmac<Sha256> {
        <Hmac<Sha256> as KeyInit>::new_from_slice(&self.0).expect("HMAC accepts keys of any length")
    }

    /// A key of exactly these bytes, e.g. freshly drawn random ones. Unlike [`SigningKey::new`]
    /// nothing is stripped: random bytes may end in a newline.
    pub fn from_bytes(bytes: [u8; MIN_KEY_LEN]) -> Self {
        Self(bytes.to_vec())
    }

    /// A key for one purpose (e.g. one warm pool), derived as HMAC(self, purpose). Holders of a
    /// derived key cannot mint tokens the parent key accepts.
    pub fn derive(&self, purpose: &str) -> SigningKey {
        let mut mac = self.mac();
        mac.update(b"toolyard-derive\0");
        mac.update(purpose.as_bytes());
        SigningKey(mac.finalize().into_bytes().to_vec())
    }

    /// The key as lowercase hex: how a derived key travels to a pool server (a Secret key or
    /// the `TOOLYARD_POOL_KEY` variable), since raw HMAC bytes may end in a newline that
    /// [`SigningKey::new`] would strip. The result is secret: never log it.
    pub fn to_hex(&self) -> String {
        hex::encode(&self.0)
    }

    /// Parses a key written by [`SigningKey::to_hex`] (surrounding whitespace ignored).
    pub fn from_hex(text: &str) -> Result<Self, TokenError> {
        let bytes = hex::decode(text.trim()).map_err(|_| TokenError::NotHex)?;
        if bytes.len() < MIN_KEY_LEN {
            return Err(TokenError::WeakKey(bytes.len()));
        }
        Ok(Self(bytes))
    }

    /// The answer to challenge `nonce` (hex HMAC): proves the key is held without sending it,
    /// as the gateway does to a `toolyard-runner bridge`. The result is secret: never log it.
    pub fn prove(&self, nonce: &str) -> String {
        let mut mac = self.mac();
        mac.update(b"toolyard-prove\0");
        mac.update(nonce.as_bytes());
        hex::encode(mac.finalize().into_bytes())
    }

    /// True when `proof` answers challenge `nonce` for this key (constant time).
    pub fn check_proof(&self, nonce: &str, proof: &str) -> bool {
        let Ok(bytes) = hex::decode(proof.trim()) else { return false };
        let mut mac = self.mac();
        mac.update(b"toolyard-prove\0");
        mac.update(nonce.as_bytes());
        mac.verify_slice(&bytes).is_ok()
    }

    /// Signs `claims` into a token string.
    pub fn sign(&self, claims: &Claims) -> String {
        let body = B64.encode(serde_json::to_vec(claims).expect("claims serialize"));
        let mut mac = self.mac();
        mac.update(PREFIX.as_bytes());
        mac.update(b".");
        mac.update(body.as_bytes());
        let sig = B64.encode(mac.finalize().into_bytes());
        format!("{PREFIX}.{body}.{sig}")
    }

    /// Checks the signature and expiry (`now` in Unix seconds) and returns the claims.
    pub fn verify(&self, token: &str, now: i64) -> Result<Claims, TokenError> {
        let mut parts = token.split('.');
        let (Some(prefix), Some(body), Some(sig), None) = (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        if prefix != PREFIX {
            return Err(TokenError::Malformed);
        }
        let sig = B64.decode(sig).map_err(|_| TokenError::Malformed)?;
        let mut mac = self.mac();
        mac.update(PREFIX.as_bytes());
        mac.update(b".");
        mac.update(body.as_bytes());
        // Constant-time comparison.
        mac.verify_slice(&sig).map_err(|_| TokenError::BadSignature)?;
        let json = B64.decode(body).map_err(|_| TokenError::Malformed)?;
        let claims: Claims = serde_json::from_slice(&json).map_err(|_| TokenError::Malformed)?;
        if claims.exp <= now {
            return Err(TokenError::Expired);
        }
        Ok(claims)
    }
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningKey({} bytes)", self.0.len())
    }
}

/// Why a token was refused. Messages are safe to return to the runner.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TokenError {
    /// Not a token of this format.
    #[error("malformed runner token")]
    Malformed,
    /// The signature does not match.
    #[error("runner token signature does not match")]
    BadSignature,
    /// Past its expiry.
    #[error("runner token has expired")]
    Expired,
    /// A hex-encoded key (see [`SigningKey::to_hex`]) that is not hex.
    #[error("signing key is not hex-encoded")]
    NotHex,
    /// Key too short.
    #[error("signing key has {0} bytes; at least 32 are required")]
    WeakKey(usize),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> SigningKey {
        SigningKey::new(vec![byte; 32]).unwrap()
    }

    fn claims() -> Claims {
        Claims {
            kind: RunKind::Call,
            ns: "team-a".into(),
            id: "price-option-x1".into(),
            owner: Owner { issuer: "apikey".into(), user: "alice".into(), groups: vec!["quants".into()] },
            exp: 2_000,
        }
    }

    #[test]
    fn signed_claims_verify() {
        let token = key(1).sign(&claims());
        assert_eq!(key(1).verify(&token, 1_000).unwrap(), claims());
    }

    #[test]
    fn wrong_key_tampering_and_expiry_are_refused() {
        let token = key(1).sign(&claims());
        assert_eq!(key(2).verify(&token, 1_000), Err(TokenError::BadSignature));
        assert_eq!(key(1).verify(&token, 2_000), Err(TokenError::Expired));

        // Swap in claims for another call, keeping the old signature.
        let mut other = claims();
        other.id = "someone-elses".into();
        let forged_body = B64.encode(serde_json::to_vec(&other).unwrap());
        let sig = token.rsplit('.').next().unwrap();
        let forged = format!("tyr1.{forged_body}.{sig}");
        assert_eq!(key(1).verify(&forged, 1_000), Err(TokenError::BadSignature));

        for junk in ["", "tyr1", "tyr1.a", "tyr1.a.b.c", "jwt.a.b", "tyr1.!!.??"] {
            assert!(key(1).verify(junk, 1_000).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn derived_keys_are_distinct_and_cannot_sign_for_the_parent() {
        let parent = key(1);
        let pool_a = parent.derive("pool/ns/a");
        let token = pool_a.sign(&claims());
        assert!(pool_a.verify(&token, 1_000).is_ok());
        assert_eq!(parent.verify(&token, 1_000), Err(TokenError::BadSignature));
        assert_eq!(parent.derive("pool/ns/b").verify(&token, 1_000), Err(TokenError::BadSignature));
        assert!(key(1).derive("pool/ns/a").verify(&token, 1_000).is_ok(), "derivation is deterministic");
    }

    #[test]
    fn proofs_answer_one_nonce_for_one_key() {
        let k = key(7);
        let proof = k.prove("n-1");
        assert!(k.check_proof("n-1", &proof));
        assert!(k.check_proof("n-1", &format!("{proof}\n")), "the line's newline is ignored");
        assert!(!k.check_proof("n-2", &proof), "another nonce");
        assert!(!key(8).check_proof("n-1", &proof), "another key");
        assert!(!k.check_proof("n-1", "zz"), "not hex");
        assert!(!k.check_proof("n-1", &proof[..10]), "truncated");
    }

    #[test]
    fn hex_form_round_trips_even_when_the_key_ends_in_a_newline_byte() {
        let key = SigningKey(vec![b'\n'; 32]);
        let back = SigningKey::from_hex(&format!("{}\n", key.to_hex())).unwrap();
        assert_eq!(back.0, key.0);
        assert_eq!(SigningKey::from_hex("zz").unwrap_err(), TokenError::NotHex);
        assert_eq!(SigningKey::from_hex("abc").unwrap_err(), TokenError::NotHex);
        assert_eq!(SigningKey::from_hex("ab").unwrap_err(), TokenError::WeakKey(1));
    }

    #[test]
    fn raw_key_bytes_are_kept_whole_even_when_they_end_in_a_newline() {
        let mut bytes = [5u8; MIN_KEY_LEN];
        bytes[MIN_KEY_LEN - 1] = b'\n';
        let raw = SigningKey::from_bytes(bytes);
        assert_eq!(raw.to_hex(), hex::encode(bytes));
        assert_eq!(raw.verify(&raw.sign(&claims()), 1_000).unwrap(), claims());
        // As file contents the same bytes lose their newline and are too short.
        assert_eq!(SigningKey::new(bytes.to_vec()).unwrap_err(), TokenError::WeakKey(MIN_KEY_LEN - 1));
    }

    #[test]
    fn short_keys_are_refused_and_debug_hides_the_key() {
        assert_eq!(SigningKey::new(b"short\n".to_vec()).unwrap_err(), TokenError::WeakKey(5));
        let k = SigningKey::new(b"0123456789abcdef0123456789abcdef\n".to_vec()).unwrap();
        assert_eq!(format!("{k:?}"), "SigningKey(32 bytes)");
    }
}
