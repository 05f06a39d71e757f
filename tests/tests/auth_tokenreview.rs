//! Kubernetes token authentication by TokenReview against the real apiserver, made by a
//! client (the gateway's user) that may only `create tokenreviews` and read the cluster's
//! ServiceAccount keys (`/openid/v1/jwks`), with which JWTs are checked before any review.

use crate::auth_support;

use std::time::Duration;

use base64::Engine;

use auth_support::rbac;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, ObjectMeta, PostParams};
use toolyard_gateway::auth::tokenreview::{TokenReviewAuthenticator, TokenReviewSettings};
use toolyard_gateway::auth::{Authenticator, reason};
use toolyard_tests::{TestEnv, User};

async fn authenticator() -> TokenReviewAuthenticator {
    authenticator_with(false).await
}

async fn authenticator_with(other_jwts: bool) -> TokenReviewAuthenticator {
    rbac::grant_gateway("toolyard-test-gateway-tokenreview", "authentication.k8s.io", "tokenreviews", "create").await;
    rbac::grant_gateway_url("toolyard-test-gateway-jwks", "/openid/v1/jwks").await;
    // The test cluster's users hold static (opaque) tokens; ServiceAccount tokens are JWTs.
    let settings = TokenReviewSettings {
        positive_ttl: Duration::from_secs(300),
        opaque_tokens: true,
        other_jwts,
        ..TokenReviewSettings::default()
    };
    TokenReviewAuthenticator::new(TestEnv::get().client(User::Gateway).await, settings)
}

async fn service_account_token(namespace: &str, name: &str, audience: &str) -> String {
    let client = TestEnv::get().client(User::Admin).await;
    let sas: Api<ServiceAccount> = Api::namespaced(client, namespace);
    let sa = ServiceAccount {
        metadata: ObjectMeta { name: Some(name.to_owned()), ..Default::default() },
        ..Default::default()
    };
    if sas.get_opt(name).await.expect("get sa").is_none() {
        sas.create(&PostParams::default(), &sa).await.expect("create sa");
    }
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience.to_owned()],
            expiration_seconds: Some(600),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = sas.create_token_request(name, &PostParams::default(), &request).await.expect("token request");
    answer.status.expect("token status").token
}

#[tokio::test]
async fn a_static_user_token_is_authenticated_with_its_groups() {
    let env = TestEnv::get();
    let auth = authenticator().await;
    let id = auth.authenticate(env.token(User::Alice)).await.expect("accepted").expect("identity");
    assert_eq!(id.issuer, "kubernetes");
    assert_eq!(id.user, "alice");
    for group in ["quants", "viewers", "system:authenticated"] {
        assert!(id.groups.iter().any(|g| g == group), "{group} missing from {:?}", id.groups);
    }
    assert!(id.scopes.is_empty());
}

#[tokio::test]
async fn a_garbage_token_is_refused_and_the_refusal_is_cached() {
    let auth = authenticator().await;
    let e = auth.authenticate("not-a-real-token-0123456789").await.expect_err("refused");
    assert_eq!(e.reason, reason::INVALID);
    let sent = auth.reviews_sent();
    let again = auth.authenticate("not-a-real-token-0123456789").await.expect_err("refused");
    assert_eq!(again.reason, reason::INVALID);
    assert_eq!(auth.reviews_sent(), sent, "the negative answer came from the cache");
}

#[tokio::test]
async fn an_accepted_token_is_reviewed_once_while_cached() {
    let env = TestEnv::get();
    let auth = authenticator().await;
    let before = auth.reviews_sent();
    for _ in 0..3 {
        let id = auth.authenticate(env.token(User::Bob)).await.expect("accepted").expect("identity");
        assert_eq!(id.user, "bob");
    }
    assert_eq!(auth.reviews_sent(), before + 1);
}

#[tokio::test]
async fn service_account_tokens_need_the_gateway_audience() {
    let env = TestEnv::get();
    let ns = env.namespace("authtr").await.expect("namespace");
    let auth = authenticator().await;

    let token = service_account_token(&ns, "agent", "toolyard").await;
    let id = auth.authenticate(&token).await.expect("accepted").expect("identity");
    assert_eq!(id.user, format!("system:serviceaccount:{ns}:agent"));
    assert!(id.groups.iter().any(|g| *g == format!("system:serviceaccounts:{ns}")), "{:?}", id.groups);

    let other = service_account_token(&ns, "agent", "some-other-service").await;
    let e = auth.authenticate(&other).await.expect_err("wrong audience refused");
    assert!(e.reason == reason::INVALID || e.reason == reason::AUDIENCE, "{e}");
}

#[tokio::test]
async fn a_reviewer_without_permission_is_unavailable_not_an_identity() {
    // bob may not create TokenReviews: the apiserver answers 403, which must not become an
    // identity nor a cached refusal of the token.
    let env = TestEnv::get();
    let settings = TokenReviewSettings { opaque_tokens: true, ..TokenReviewSettings::default() };
    let auth = TokenReviewAuthenticator::new(env.client(User::Bob).await, settings);
    let e = auth.authenticate(env.token(User::Alice)).await.expect_err("no identity");
    assert_eq!(e.reason, reason::UNAVAILABLE);
    let _ = auth.authenticate(env.token(User::Alice)).await;
    assert_eq!(auth.reviews_sent(), 2, "failures are not cached");
}

#[tokio::test]
async fn jwts_the_cluster_did_not_sign_never_reach_the_apiserver() {
    let env = TestEnv::get();
    let ns = env.namespace("authsig").await.expect("namespace");
    let auth = authenticator().await;
    let real = service_account_token(&ns, "agent", "toolyard").await;
    assert!(auth.authenticate(&real).await.expect("accepted").is_some());
    let reviews = auth.reviews_sent();

    // The real token's header and claims, re-signed with a key of our own under the cluster
    // key's kid; the same with a kid the cluster never had; HS256 "signed" with garbage; and a
    // hundred made-up tokens: each refused here, none reviewed. (An `alg: none` token has no
    // signature, so it is no JWT: with opaque tokens on, as here, it is reviewed like any.)
    let part = |i: usize| -> serde_json::Value {
        let segment = real.split('.').nth(i).expect("a JWT");
        serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(segment).expect("base64"))
            .expect("JSON")
    };
    let (header, mut claims) = (part(0), part(1));
    let cluster_kid = header["kid"].as_str().expect("a kid").to_owned();
    let ours = auth_support::SigningKey::rsa("attacker");
    let mut forged = vec![
        ours.sign_as(&cluster_kid, &claims),
        ours.sign(&claims),
        auth_support::hs256(&cluster_kid, b"guess", &claims),
    ];
    for i in 0..100 {
        claims["sub"] = format!("system:serviceaccount:{ns}:made-up-{i}").into();
        forged.push(ours.sign_as(&cluster_kid, &claims));
    }
    for token in &forged {
        let refused = auth.authenticate(token).await.expect_err("refused");
        assert_eq!(refused.reason, reason::INVALID, "{refused}");
    }
    assert_eq!(auth.reviews_sent(), reviews, "no forged token was sent to TokenReview");

    // A cluster whose apiserver accepts other JWTs too: they are reviewed (and refused there).
    let lenient = authenticator_with(true).await;
    assert!(lenient.authenticate(&forged[0]).await.is_err());
    assert_eq!(lenient.reviews_sent(), 1, "reviewed by the apiserver");
}
