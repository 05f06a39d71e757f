//! OIDC/OAuth JWT authentication against a local identity provider (discovery + JWKS
//! served over HTTP on 127.0.0.1 by the test): valid tokens, every kind of bad token,
//! key rotation with refresh on an unknown `kid`, and the refresh rate limit.

use crate::auth_support;

use std::sync::Arc;
use std::time::Duration;

use auth_support::{Idp, SigningKey, hs256, now, unsigned};
use serde_json::Value;
use toolyard_gateway::auth::jwks::JwksTiming;
use toolyard_gateway::auth::jwt::{JwtAuthenticator, JwtIssuerConfig, JwtSettings};
use toolyard_gateway::auth::{AuthChain, Authenticator, reason};

const AUD: &str = "toolyard";

fn settings(min_refresh: Duration) -> JwtSettings {
    JwtSettings {
        clock_skew: Duration::from_secs(5),
        jwks: JwksTiming { ttl: Duration::from_secs(300), min_refresh_interval: min_refresh },
        http_timeout: Duration::from_secs(5),
    }
}

fn authenticator(idp: &Idp, min_refresh: Duration) -> JwtAuthenticator {
    JwtAuthenticator::new(vec![JwtIssuerConfig::new(&idp.issuer, vec![AUD.into()])], settings(min_refresh))
        .expect("authenticator")
}

async fn reason_of(auth: &JwtAuthenticator, token: &str) -> &'static str {
    match auth.authenticate(token).await {
        Ok(Some(id)) => panic!("token accepted as {id:?}"),
        Ok(None) => "not-mine",
        Err(e) => e.reason,
    }
}

fn with(mut claims: Value, key: &str, value: Value) -> Value {
    claims[key] = value;
    claims
}

#[tokio::test]
async fn valid_rs256_and_es256_tokens_give_user_groups_and_scopes() {
    let idp = Idp::start().await;
    let rsa = SigningKey::rsa("rsa-1");
    let ec = SigningKey::ec("ec-1");
    idp.set_keys(&[&rsa, &ec]);
    let auth = authenticator(&idp, Duration::from_secs(10));

    let id = auth.authenticate(&rsa.sign(&idp.claims("alice", AUD))).await.expect("ok").expect("accepted");
    assert_eq!(id.issuer, idp.issuer);
    assert_eq!(id.user, "alice");
    assert_eq!(id.groups, vec!["quants", "viewers"]);
    assert_eq!(id.scopes, vec!["mcp:tools", "profile"]);

    let claims = with(idp.claims("bob", AUD), "aud", serde_json::json!(["other", AUD]));
    let id = auth.authenticate(&ec.sign(&claims)).await.expect("ok").expect("accepted");
    assert_eq!(id.user, "bob");
    assert_eq!(idp.jwks_fetches(), 1, "the second token used the cached keys");
}

#[tokio::test]
async fn configured_claims_name_the_user_and_groups() {
    let idp = Idp::start().await;
    let key = SigningKey::ec("k");
    idp.set_keys(&[&key]);
    let mut config = JwtIssuerConfig::new(&idp.issuer, vec![AUD.into()]);
    config.username_claim = "email".into();
    config.groups_claim = "realm_access.roles".into();
    let auth = JwtAuthenticator::new(vec![config], settings(Duration::from_secs(10))).expect("authenticator");
    let claims = with(idp.claims("u-123", AUD), "email", "carol@example.com".into());
    let claims = with(claims, "realm_access", serde_json::json!({"roles": ["analysts"]}));
    let id = auth.authenticate(&key.sign(&claims)).await.expect("ok").expect("accepted");
    assert_eq!((id.user.as_str(), id.groups.clone()), ("carol@example.com", vec!["analysts".to_owned()]));
    let no_email = key.sign(&idp.claims("u-123", AUD));
    assert_eq!(reason_of(&auth, &no_email).await, reason::CLAIMS);
}

#[tokio::test]
async fn expired_immature_and_foreign_audience_tokens_are_refused() {
    let idp = Idp::start().await;
    let key = SigningKey::rsa("k1");
    idp.set_keys(&[&key]);
    let auth = authenticator(&idp, Duration::from_secs(10));
    let base = idp.claims("alice", AUD);

    let expired = key.sign(&with(base.clone(), "exp", (now() - 600).into()));
    assert_eq!(reason_of(&auth, &expired).await, reason::EXPIRED);
    let not_yet = key.sign(&with(base.clone(), "nbf", (now() + 600).into()));
    assert_eq!(reason_of(&auth, &not_yet).await, reason::NOT_YET_VALID);
    let other_aud = key.sign(&with(base.clone(), "aud", "someone-else".into()));
    assert_eq!(reason_of(&auth, &other_aud).await, reason::AUDIENCE);
    let mut no_aud = base.clone();
    no_aud.as_object_mut().expect("claims").remove("aud");
    assert_eq!(reason_of(&auth, &key.sign(&no_aud)).await, reason::CLAIMS);
    let mut no_exp = base.clone();
    no_exp.as_object_mut().expect("claims").remove("exp");
    assert_eq!(reason_of(&auth, &key.sign(&no_exp)).await, reason::CLAIMS);

    // Within the configured skew (5 s) both are still fine.
    let just_expired = key.sign(&with(base.clone(), "exp", (now() - 1).into()));
    assert!(auth.authenticate(&just_expired).await.expect("ok").is_some());
    let almost_valid = key.sign(&with(base, "nbf", (now() + 1).into()));
    assert!(auth.authenticate(&almost_valid).await.expect("ok").is_some());
}

#[tokio::test]
async fn tokens_of_other_issuers_are_not_accepted() {
    let idp = Idp::start().await;
    let other = Idp::start().await;
    let key = SigningKey::rsa("k1");
    let other_key = SigningKey::rsa("k1");
    idp.set_keys(&[&key]);
    other.set_keys(&[&other_key]);
    let auth = Arc::new(authenticator(&idp, Duration::ZERO));

    // An issuer that is not configured: not this authenticator's token, and a chain with
    // nothing else refuses it.
    let foreign = other_key.sign(&other.claims("mallory", AUD));
    assert_eq!(reason_of(&auth, &foreign).await, "not-mine");
    let chain = AuthChain::new(vec![auth.clone()]);
    assert_eq!(chain.authenticate(Some(&foreign)).await.expect_err("refused").reason, reason::UNRECOGNIZED);

    // Claiming the trusted issuer but signed by another key with the same kid.
    let forged = other_key.sign(&idp.claims("mallory", AUD));
    assert_eq!(reason_of(&auth, &forged).await, reason::SIGNATURE);
    assert_eq!(other.jwks_fetches(), 0, "the foreign issuer's keys are never fetched");
}

#[tokio::test]
async fn alg_none_and_hs256_with_the_public_key_are_refused_before_any_key_lookup() {
    let idp = Idp::start().await;
    let rsa = SigningKey::rsa("rsa-1");
    let ec = SigningKey::ec("ec-1");
    idp.set_keys(&[&rsa, &ec]);
    let auth = authenticator(&idp, Duration::ZERO);
    let claims = idp.claims("mallory", AUD);

    assert_eq!(reason_of(&auth, &unsigned("rsa-1", &claims)).await, reason::ALGORITHM);
    assert_eq!(reason_of(&auth, &hs256("rsa-1", &rsa.public_pem, &claims)).await, reason::ALGORITHM);
    assert_eq!(reason_of(&auth, &hs256("ec-1", &ec.public_pem, &claims)).await, reason::ALGORITHM);
    assert_eq!(idp.jwks_fetches(), 0, "refused on alg alone");

    // An ES256 token naming the RSA key's kid: the alg must fit the key.
    assert_eq!(reason_of(&auth, &ec.sign_as("rsa-1", &claims)).await, reason::ALGORITHM);
}

#[tokio::test]
async fn unknown_kid_refreshes_the_jwks_and_a_rotated_key_is_picked_up() {
    let idp = Idp::start().await;
    let old = SigningKey::rsa("2026-01");
    let new = SigningKey::ec("2026-02");
    idp.set_keys(&[&old]);
    let auth = authenticator(&idp, Duration::ZERO);

    let by_old = old.sign(&idp.claims("alice", AUD));
    let by_new = new.sign(&idp.claims("alice", AUD));
    assert!(auth.authenticate(&by_old).await.expect("ok").is_some());
    assert_eq!(idp.jwks_fetches(), 1);

    // The new key is not published yet: a refresh is tried, the kid stays unknown.
    assert_eq!(reason_of(&auth, &by_new).await, reason::UNKNOWN_KEY);
    assert_eq!(idp.jwks_fetches(), 2);

    // The provider rotates: the unknown kid triggers a refresh that finds it.
    idp.set_keys(&[&new]);
    let id = auth.authenticate(&by_new).await.expect("ok").expect("accepted after rotation");
    assert_eq!(id.user, "alice");
    assert_eq!(idp.jwks_fetches(), 3);

    // The old key was dropped from the JWKS: its tokens are refused now.
    assert_eq!(reason_of(&auth, &by_old).await, reason::UNKNOWN_KEY);
}

#[tokio::test]
async fn unknown_kids_cannot_make_the_gateway_hammer_the_jwks_endpoint() {
    let idp = Idp::start().await;
    let key = SigningKey::rsa("k1");
    idp.set_keys(&[&key]);
    let auth = authenticator(&idp, Duration::from_secs(3600));
    assert!(auth.authenticate(&key.sign(&idp.claims("alice", AUD))).await.expect("ok").is_some());
    assert_eq!(idp.jwks_fetches(), 1);
    for i in 0..20 {
        let token = key.sign_as(&format!("random-{i}"), &idp.claims("mallory", AUD));
        assert_eq!(reason_of(&auth, &token).await, reason::UNKNOWN_KEY);
    }
    assert_eq!(idp.jwks_fetches(), 1, "refreshes are rate limited");
}

#[tokio::test]
async fn an_unreachable_identity_provider_is_unavailable_not_invalid() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let issuer = format!("http://{}", listener.local_addr().expect("addr"));
    drop(listener);
    let auth = JwtAuthenticator::new(vec![JwtIssuerConfig::new(&issuer, vec![AUD.into()])], settings(Duration::ZERO))
        .expect("authenticator");
    let key = SigningKey::ec("k");
    let claims = serde_json::json!({"iss": issuer, "aud": AUD, "sub": "alice", "exp": now() + 60});
    let e = auth.authenticate(&key.sign(&claims)).await.expect_err("refused");
    assert_eq!(e.reason, reason::UNAVAILABLE);
    assert!(e.is_unavailable());
}
