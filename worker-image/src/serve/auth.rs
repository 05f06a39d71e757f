//! Call tokens of a pool server: signed with the pool's derived key, one call each.

use std::path::Path;

use axum::http::{HeaderMap, StatusCode, header};
use toolyard_api::token::{Claims, RunKind, SigningKey};

/// Loads the pool key: from `file` when given, else from the hex text in `env_value`.
pub fn load_key(file: Option<&Path>, env_value: Option<&str>) -> Result<SigningKey, String> {
    let text = match (file, env_value) {
        (Some(path), _) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the pool key file {}: {e}", path.display()))?,
        (None, Some(text)) => text.to_owned(),
        (None, None) => {
            return Err(format!(
                "no pool key: set {} (a file) or {} (hex text)",
                toolyard_api::protocol::pool::env::KEY_FILE,
                toolyard_api::protocol::pool::env::KEY
            ));
        }
    };
    SigningKey::from_hex(&text).map_err(|e| format!("the pool key is not usable: {e}"))
}

/// Checks the bearer call token of a request for call `call_id`.
pub fn check(key: &SigningKey, headers: &HeaderMap, call_id: &str, now: i64) -> Result<Claims, (StatusCode, String)> {
    let unauthorized = |m: &str| (StatusCode::UNAUTHORIZED, m.to_owned());
    let value = headers.get(header::AUTHORIZATION).ok_or_else(|| unauthorized("missing bearer token"))?;
    let token = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .ok_or_else(|| unauthorized("the Authorization header is not a bearer token"))?;
    let claims = key.verify(token.trim(), now).map_err(|e| unauthorized(&e.to_string()))?;
    if claims.kind != RunKind::Call {
        return Err((StatusCode::FORBIDDEN, "the token is not a call token".into()));
    }
    if claims.id != call_id {
        return Err((StatusCode::FORBIDDEN, "the token is for another call".into()));
    }
    Ok(claims)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;
    use toolyard_api::Owner;

    use super::*;

    fn key() -> SigningKey {
        SigningKey::new(vec![7; 32]).unwrap().derive("pool/ns/echo")
    }

    fn headers(token: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {token}")).unwrap());
        h
    }

    fn claims(kind: RunKind, id: &str) -> Claims {
        Claims {
            kind,
            ns: "ns".into(),
            id: id.into(),
            owner: Owner { issuer: "local".into(), user: "u".into(), groups: vec![] },
            exp: 100,
        }
    }

    #[test]
    fn only_an_unexpired_call_token_for_this_call_and_this_pool_passes() {
        let good = key().sign(&claims(RunKind::Call, "c1"));
        assert_eq!(check(&key(), &headers(&good), "c1", 50).unwrap().id, "c1");
        assert_eq!(check(&key(), &headers(&good), "c2", 50).unwrap_err().0, StatusCode::FORBIDDEN);
        assert_eq!(check(&key(), &headers(&good), "c1", 100).unwrap_err().0, StatusCode::UNAUTHORIZED);
        let task = key().sign(&claims(RunKind::Task, "c1"));
        assert_eq!(check(&key(), &headers(&task), "c1", 50).unwrap_err().0, StatusCode::FORBIDDEN);
        // Signed with the master key instead of the pool's derived key.
        let master = SigningKey::new(vec![7; 32]).unwrap().sign(&claims(RunKind::Call, "c1"));
        assert_eq!(check(&key(), &headers(&master), "c1", 50).unwrap_err().0, StatusCode::UNAUTHORIZED);
        assert_eq!(check(&key(), &HeaderMap::new(), "c1", 50).unwrap_err().0, StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn keys_load_from_hex_text_or_file() {
        let hex = key().to_hex();
        assert!(load_key(None, Some(&hex)).is_ok());
        assert!(load_key(None, Some("not hex")).unwrap_err().contains("not usable"));
        assert!(load_key(None, None).unwrap_err().contains("TOOLYARD_POOL_KEY"));
        assert!(load_key(Some(Path::new("/nonexistent/key")), Some(&hex)).unwrap_err().contains("/nonexistent/key"));
    }
}
