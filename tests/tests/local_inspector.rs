//! MCP Inspector (its CLI, from npm) against the local mode: with the token it lists and calls
//! the tools; without one it signs in through the local mode's own OAuth authorization
//! server, where the user allows it with the local token; kept from interactive OAuth, it is
//! told that authentication is required. The authorization server's refusals are checked
//! request by request.

use crate::local_support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};
use sha2::Digest;
use toolyard_tests::local::TempDir;
use toolyard_tests::upstream::{free_port, inspector_cli, inspector_command};

const TOKEN: &str = "ty_local-inspector-token-0001";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_inspector_lists_and_calls_with_the_token_and_is_refused_without_it() {
    let data = TempDir::new("inspector-data");
    let gateway = local_support::start("examples/pricing", &data, TOKEN, 2).await;
    let url = gateway.mcp_url();
    let home = TempDir::new("inspector-home");
    let header = format!("Authorization: Bearer {TOKEN}");

    let (code, out, err) = tokio::task::block_in_place(|| {
        inspector_cli(home.path(), &[&url, "--method", "tools/list", "--header", &header])
    });
    assert_eq!(code, 0, "{out}\n{err}");
    let listed: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let names: Vec<&str> =
        listed["tools"].as_array().expect("tools").iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(names.contains(&"price_option"), "{names:?}");

    let (code, out, err) = tokio::task::block_in_place(|| {
        inspector_cli(
            home.path(),
            &[
                &url,
                "--method",
                "tools/call",
                "--tool-name",
                "price_option",
                "--tool-arg",
                "spot=100",
                "strike=100",
                "time_to_expiry=1",
                "volatility=0.2",
                "rate=0.05",
                "--header",
                &header,
            ],
        )
    });
    assert_eq!(code, 0, "{out}\n{err}");
    let called: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let price = called["structuredContent"]["price"].as_f64().unwrap_or_default();
    assert!((price - 10.45).abs() < 0.01, "{called}");

    // Without a token and kept from interactive OAuth: "authentication required" (exit 3).
    let (code, out, err) = tokio::task::block_in_place(|| {
        inspector_cli(home.path(), &[&url, "--method", "tools/list", "--stored-auth-only"])
    });
    assert_eq!(code, 3, "{out}\n{err}");
    assert!(out.contains("auth_required") || err.contains("auth_required"), "{out}\n{err}");
}

/// Without a token the Inspector finds the local mode's authorization server, registers,
/// and sends the user to the sign-in page (its "browser" here is a script noting the URL);
/// a wrong token is refused there, the local token sends the browser back to the
/// Inspector's callback with a code, and the Inspector lists the tools with the access
/// token it gets for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_inspector_signs_in_through_the_local_authorization_server() {
    let data = TempDir::new("inspector-oauth-data");
    let gateway = local_support::start("examples/pricing", &data, TOKEN, 2).await;
    let url = gateway.mcp_url();
    let home = TempDir::new("inspector-oauth-home");
    let opened = home.path().join("opened-urls");
    let browser = home.path().join("browser.sh");
    std::fs::write(&browser, format!("#!/bin/sh\nprintf '%s\\n' \"$1\" >> '{}'\n", opened.display())).expect("browser");
    std::fs::set_permissions(&browser, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let callback = format!("http://127.0.0.1:{}/oauth/callback", free_port());
    let command = inspector_command(home.path(), &[&url, "--method", "tools/list", "--callback-url", &callback]);
    let inspector = tokio::process::Command::from(command)
        .env("MCP_AUTO_OPEN_ENABLED", "true")
        .env("BROWSER", &browser)
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("MCP Inspector starts");

    let deadline = Instant::now() + Duration::from_secs(60);
    let authorize = loop {
        if let Some(first) = std::fs::read_to_string(&opened).ok().and_then(|t| t.lines().next().map(str::to_owned)) {
            break first;
        }
        assert!(Instant::now() < deadline, "the Inspector never opened the sign-in page");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let base = format!("http://{}", gateway.addr);
    assert!(authorize.starts_with(&format!("{base}/oauth/authorize?")), "{authorize}");

    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");
    let page = http.get(&authorize).send().await.expect("page");
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-security-policy"].to_str().unwrap().contains("frame-ancestors 'none'"));
    let html = page.text().await.expect("html");
    assert!(html.contains("<b>MCP Inspector</b> asks to call your tools as <b>local</b>"), "{html}");

    let mut fields: Vec<(String, String)> =
        reqwest::Url::parse(&authorize).expect("url").query_pairs().into_owned().collect();
    fields.push(("decision".into(), "allow".into()));
    let mut wrong = fields.clone();
    wrong.push(("token".into(), "ty_not-the-local-token-0000".into()));
    let refused = http.post(format!("{base}/oauth/authorize")).form(&wrong).send().await.expect("post");
    assert_eq!(refused.status(), 403);
    assert!(refused.headers().get("location").is_none());
    assert!(refused.text().await.expect("html").contains("That is not the local token."));

    fields.push(("token".into(), TOKEN.into()));
    let allowed = http.post(format!("{base}/oauth/authorize")).form(&fields).send().await.expect("post");
    assert_eq!(allowed.status(), 303);
    let back = allowed.headers()["location"].to_str().expect("location").to_owned();
    assert!(back.starts_with(&format!("{callback}?code=")), "{back}");
    assert!(back.contains(&format!("iss={}", base.replace(':', "%3A").replace('/', "%2F"))), "{back}");
    let received = http.get(&back).send().await.expect("the Inspector's callback");
    assert!(received.status().is_success(), "{}", received.text().await.unwrap_or_default());

    let out = tokio::time::timeout(Duration::from_secs(60), inspector.wait_with_output())
        .await
        .expect("the Inspector finishes")
        .expect("output");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let listed: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    let names: Vec<&str> =
        listed["tools"].as_array().expect("tools").iter().filter_map(|t| t["name"].as_str()).collect();
    assert!(names.contains(&"price_option"), "{names:?}");
}

/// The authorization server's refusals, request by request: hosts it does not serve,
/// registrations with unsafe redirect URIs, authorization requests it cannot trust (shown,
/// never redirected), requests without PKCE S256 (sent back), a denial, codes that are
/// reused, exchanged by another client or with the wrong verifier, and tokens it never issued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_authorization_server_refuses_what_it_cannot_trust() {
    let data = TempDir::new("local-oauth-data");
    let gateway = local_support::start("examples/pricing", &data, TOKEN, 2).await;
    let base = format!("http://{}", gateway.addr);
    let http = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().expect("client");

    let resource: Value = http
        .get(format!("{base}/.well-known/oauth-protected-resource/mcp"))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(resource["authorization_servers"], json!([base]), "{resource}");
    let server: Value = http
        .get(format!("{base}/.well-known/oauth-authorization-server"))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert_eq!(server["issuer"], base);
    assert_eq!(server["code_challenge_methods_supported"], json!(["S256"]));
    let foreign = http
        .get(format!("{base}/.well-known/oauth-authorization-server"))
        .header("host", "rebound.attacker.example")
        .send()
        .await
        .expect("get");
    assert_eq!(foreign.status(), 400, "no document for a host it does not serve");

    let register = |body: Value| {
        let http = http.clone();
        let base = base.clone();
        async move {
            let answer = http.post(format!("{base}/oauth/register")).json(&body).send().await.expect("register");
            (answer.status().as_u16(), answer.json::<Value>().await.expect("json"))
        }
    };
    for (body, error) in [
        (json!({"client_name": "no uris"}), "invalid_redirect_uri"),
        (json!({"redirect_uris": ["http://attacker.example/cb"]}), "invalid_redirect_uri"),
        (json!({"redirect_uris": ["javascript:alert(1)"]}), "invalid_redirect_uri"),
        (json!({"redirect_uris": ["https://app.example/cb#x"]}), "invalid_redirect_uri"),
        (
            json!({"redirect_uris": ["https://app.example/cb"], "grant_types": ["client_credentials"]}),
            "invalid_client_metadata",
        ),
        (json!([1, 2]), "invalid_client_metadata"),
    ] {
        let (status, answer) = register(body.clone()).await;
        assert_eq!((status, answer["error"].as_str()), (400, Some(error)), "{body} -> {answer}");
    }
    let redirect = "http://127.0.0.1:9/cb";
    let (status, client) =
        register(json!({"redirect_uris": [redirect], "client_name": "<script>alert(1)</script>"})).await;
    assert_eq!(status, 201, "{client}");
    assert_eq!(client["token_endpoint_auth_method"], "none");
    let client_id = client["client_id"].as_str().expect("client_id").to_owned();

    let verifier = "a-verifier-of-at-least-forty-three-characters-0123456789";
    let challenge = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(verifier));
    let request = |changes: &[(&str, Option<&str>)]| {
        let mut fields: Vec<(String, String)> = [
            ("response_type", "code"),
            ("client_id", client_id.as_str()),
            ("redirect_uri", redirect),
            ("code_challenge", challenge.as_str()),
            ("code_challenge_method", "S256"),
            ("state", "s-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        for (name, value) in changes {
            fields.retain(|(k, _)| k != name);
            if let Some(value) = value {
                fields.push(((*name).to_owned(), (*value).to_owned()));
            }
        }
        fields
    };
    let page = http.get(format!("{base}/oauth/authorize")).query(&request(&[])).send().await.expect("page");
    let html = page.text().await.expect("html");
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;") && !html.contains("<script>"), "{html}");

    // Not trusted: shown on the page, nothing sent to any redirect URI.
    for changes in [
        vec![("client_id", Some("tyc_unknown"))],
        vec![("redirect_uri", Some("http://127.0.0.1:9/other"))],
        vec![("client_id", None)],
    ] {
        let answer = http.get(format!("{base}/oauth/authorize")).query(&request(&changes)).send().await.expect("get");
        assert_eq!(answer.status(), 400, "{changes:?}");
        assert!(answer.headers().get("location").is_none(), "{changes:?}");
    }
    // The client's own mistakes go back to it, with its state.
    for (changes, error) in [
        (vec![("code_challenge", None)], "invalid_request"),
        (vec![("code_challenge_method", Some("plain"))], "invalid_request"),
        (vec![("response_type", Some("token"))], "unsupported_response_type"),
        (vec![("resource", Some("http://elsewhere.example/mcp"))], "invalid_target"),
    ] {
        let answer = http.get(format!("{base}/oauth/authorize")).query(&request(&changes)).send().await.expect("get");
        assert_eq!(answer.status(), 303, "{changes:?}");
        let location = answer.headers()["location"].to_str().expect("location").to_owned();
        assert!(location.starts_with(&format!("{redirect}?error={error}&")), "{changes:?} -> {location}");
        assert!(location.contains("state=s-1"), "{location}");
    }

    let sign_in = |decision: &str| {
        let mut fields = request(&[]);
        fields.push(("decision".into(), decision.into()));
        fields.push(("token".into(), TOKEN.into()));
        let http = http.clone();
        let base = base.clone();
        async move {
            let answer = http.post(format!("{base}/oauth/authorize")).form(&fields).send().await.expect("post");
            assert_eq!(answer.status(), 303);
            let location = reqwest::Url::parse(answer.headers()["location"].to_str().expect("location")).expect("url");
            location.query_pairs().into_owned().collect::<std::collections::HashMap<String, String>>()
        }
    };
    assert_eq!(sign_in("deny").await["error"], "access_denied");

    let exchange = |code: String, client: &str, verifier: &str| {
        let fields = [
            ("grant_type", "authorization_code".to_owned()),
            ("code", code),
            ("client_id", client.to_owned()),
            ("redirect_uri", redirect.to_owned()),
            ("code_verifier", verifier.to_owned()),
        ];
        let http = http.clone();
        let base = base.clone();
        async move {
            let answer = http.post(format!("{base}/oauth/token")).form(&fields).send().await.expect("token");
            (answer.status().as_u16(), answer.json::<Value>().await.expect("json"))
        }
    };
    let code = sign_in("allow").await["code"].clone();
    let (status, answer) = exchange(code.clone(), &client_id, "not-the-verifier-but-long-enough-to-be-one-0123").await;
    assert_eq!((status, answer["error"].as_str()), (400, Some("invalid_grant")), "{answer}");
    let (status, answer) = exchange(code, &client_id, verifier).await;
    assert_eq!(
        (status, answer["error"].as_str()),
        (400, Some("invalid_grant")),
        "a failed exchange used the code up: {answer}"
    );
    let code = sign_in("allow").await["code"].clone();
    let (status, answer) = exchange(code, "tyc_another-client", verifier).await;
    assert_eq!((status, answer["error"].as_str()), (400, Some("invalid_grant")), "{answer}");
    let unsupported =
        http.post(format!("{base}/oauth/token")).form(&[("grant_type", "password")]).send().await.expect("token");
    assert_eq!(unsupported.json::<Value>().await.expect("json")["error"], "unsupported_grant_type");

    let code = sign_in("allow").await["code"].clone();
    let (status, answer) = exchange(code.clone(), &client_id, verifier).await;
    assert_eq!(status, 200, "{answer}");
    let access = answer["access_token"].as_str().expect("access_token").to_owned();
    assert!(access.starts_with("tyo_"), "{access}");
    let (status, _) = exchange(code, &client_id, verifier).await;
    assert_eq!(status, 400, "a code works once");

    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
    let call = |token: String| {
        let http = http.clone();
        let url = gateway.mcp_url();
        let list = list.clone();
        async move {
            http.post(url)
                .bearer_auth(token)
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2025-11-25")
                .json(&list)
                .send()
                .await
                .expect("post")
                .status()
                .as_u16()
        }
    };
    assert_eq!(call(access).await, 200, "the access token acts as the local user");
    assert_eq!(call("tyo_never-issued-by-this-gateway-000000000000".into()).await, 401);
}
