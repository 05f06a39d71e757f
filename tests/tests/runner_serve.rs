//! `toolyard-runner serve` as a real process: the pool server's token checks, fresh and
//! reused workers with the real Python runner, worker replacement, and bounded admission.

use std::process::Stdio;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use toolyard_api::Owner;
use toolyard_api::protocol::CallErrorKind;
use toolyard_api::protocol::pool::{self, PoolCallRequest, PoolCallResponse, PoolRefusal, Refused};
use toolyard_api::token::{Claims, RunKind, SigningKey};
use toolyard_tests::local;

fn pool_key() -> SigningKey {
    SigningKey::new(b"runner-serve-test-master-key-0123456789".to_vec())
        .expect("test setup")
        .derive(&pool::key_purpose("", "t"))
}

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("test setup").as_secs() as i64
}

fn token_for(key: &SigningKey, kind: RunKind, id: &str) -> String {
    let owner = Owner { issuer: "local".into(), user: "dev".into(), groups: vec![] };
    key.sign(&Claims { kind, ns: String::new(), id: id.into(), owner, exp: now() + 600 })
}

struct Pool {
    base: String,
    http: reqwest::Client,
    child: tokio::process::Child,
}

impl Drop for Pool {
    /// SIGTERM, as a pod is stopped: the server closes its pool, and its workers' folders go.
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGTERM);
        }
        for _ in 0..100 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Pool {
    async fn start(flags: &[&str], cmd: &[String]) -> Self {
        let mut child = tokio::process::Command::new(local::binary("toolyard-runner"))
            .args(["serve", "--host", "127.0.0.1", "--port", "0"])
            .args(flags)
            .arg("--")
            .args(cmd)
            .env(pool::env::KEY, pool_key().to_hex())
            .env("PYTHONPATH", local::misbehaving_pythonpath())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("the runner starts");
        let mut lines = BufReader::new(child.stdout.take().expect("test setup")).lines();
        let line = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
            .await
            .expect("test setup")
            .expect("test setup")
            .expect("test setup");
        let addr = line.strip_prefix("listening on ").unwrap_or_else(|| panic!("unexpected first line {line:?}"));
        Self { base: format!("http://{addr}"), http: reqwest::Client::new(), child }
    }

    async fn post(&self, token: Option<&str>, body: &Value) -> (StatusCode, reqwest::header::HeaderMap, String) {
        let mut request = self.http.post(format!("{}{}", self.base, pool::CALL_PATH)).json(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.expect("test setup");
        let (status, headers) = (response.status(), response.headers().clone());
        (status, headers, response.text().await.expect("test setup"))
    }

    async fn call(&self, id: &str, arguments: Value, timeout_ms: u64) -> PoolCallResponse {
        let request = PoolCallRequest {
            id: id.into(),
            arguments: arguments.as_object().expect("test setup").clone(),
            timeout_ms,
            traceparent: None,
            caller: None,
        };
        let token = token_for(&pool_key(), RunKind::Call, id);
        let (status, _, body) = self.post(Some(&token), &serde_json::to_value(&request).expect("test setup")).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        serde_json::from_str(&body).expect("test setup")
    }
}

fn tool(function: &str) -> Vec<String> {
    vec![local::python(), "-m".into(), "toolyard.run".into(), format!("misbehaving:{function}")]
}

#[tokio::test]
async fn only_a_call_token_of_this_pool_for_this_call_is_served() {
    let pool = Pool::start(&[], &tool("echo")).await;
    let body = json!({"id": "c1", "arguments": {"value": 1}, "timeoutMs": 10_000});
    let master = SigningKey::new(b"runner-serve-test-master-key-0123456789".to_vec()).unwrap();
    let other_pool = master.derive(&pool::key_purpose("", "other"));
    for (what, token, expect) in [
        ("no token", None, StatusCode::UNAUTHORIZED),
        ("the master key", Some(token_for(&master, RunKind::Call, "c1")), StatusCode::UNAUTHORIZED),
        ("another pool's key", Some(token_for(&other_pool, RunKind::Call, "c1")), StatusCode::UNAUTHORIZED),
        ("another call", Some(token_for(&pool_key(), RunKind::Call, "c2")), StatusCode::FORBIDDEN),
        ("a task token", Some(token_for(&pool_key(), RunKind::Task, "c1")), StatusCode::FORBIDDEN),
    ] {
        let (status, _, text) = pool.post(token.as_deref(), &body).await;
        assert_eq!(status, expect, "{what}: {text}");
        assert!(text.starts_with("{\"error\":"), "{what}: {text}");
    }
    let answer = pool.call("c1", json!({"value": 1}), 10_000).await;
    assert_eq!(answer.result.value, Some(json!({"value": 1})));
}

#[tokio::test]
async fn fresh_processes_keep_the_result_clean_and_return_the_logs() {
    let pool = Pool::start(&["--concurrency", "2"], &tool("noisy")).await;
    let ready = reqwest::get(format!("{}{}", pool.base, pool::READY_PATH)).await.unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
    let answer = pool.call("c-noisy", json!({"n": 3}), 30_000).await;
    assert_eq!(answer.result.value, Some(json!({"n": 3})));
    assert!(answer.stdout.contains("stdout line 2"), "{answer:?}");
    assert!(answer.stderr.contains("\"ready\": true"), "{answer:?}");
}

#[tokio::test]
async fn a_reused_worker_keeps_state_across_calls_and_is_replaced_after_a_hang() {
    let pool = Pool::start(&["--reuse"], &tool("hang")).await;
    let first = pool.call("c-1", json!({"seconds": 0}), 30_000).await;
    assert_eq!(first.result.value, Some(json!({"slept": 0.0})));
    let first_pid = local::hang_pids(&first.stderr).unwrap().0;

    let second = pool.call("c-2", json!({"seconds": 0}), 30_000).await;
    assert_eq!(local::hang_pids(&second.stderr).unwrap().0, first_pid, "the same worker process serves both calls");

    let hung = pool.call("c-3", json!({"seconds": 600}), 1_000).await;
    assert_eq!(hung.result.error.as_ref().map(|e| e.kind), Some(CallErrorKind::TimedOut), "{hung:?}");
    let (pid, child) = local::hang_pids(&hung.stderr).unwrap_or_else(|| panic!("no pids: {hung:?}"));
    assert_eq!(pid, first_pid);
    toolyard_tests::wait_until(Duration::from_secs(10), "the hung worker's group to die", || async {
        Ok(!local::pid_alive(pid) && !local::pid_alive(child))
    })
    .await
    .unwrap();

    let after = pool.call("c-4", json!({"seconds": 0}), 60_000).await;
    assert_eq!(after.result.value, Some(json!({"slept": 0.0})), "{after:?}");
    assert_ne!(local::hang_pids(&after.stderr).unwrap().0, first_pid, "a new worker replaced the hung one");
}

#[tokio::test]
async fn a_worker_that_dies_mid_call_is_a_crash_and_is_replaced() {
    let script = "import sys\n\
        print('{\"ready\": true}', flush=True)\n\
        sys.stdin.readline()\n\
        print('worker going down', file=sys.stderr, flush=True)\n\
        sys.exit(7)\n";
    let pool = Pool::start(&["--reuse"], &[local::python(), "-c".into(), script.into()]).await;
    for id in ["c-1", "c-2"] {
        let answer = pool.call(id, json!({}), 30_000).await;
        let error = answer.result.error.unwrap_or_else(|| panic!("{id} should fail"));
        assert_eq!(error.kind, CallErrorKind::Crashed, "{id}: {error:?}");
        assert!(error.message.contains("exited with status 7"), "{}", error.message);
        assert!(error.message.contains("worker going down"), "{}", error.message);
    }
}

#[tokio::test]
async fn beyond_concurrency_and_queue_the_pool_answers_503_with_retry_after() {
    let pool = std::sync::Arc::new(Pool::start(&["--concurrency", "1", "--queue", "0"], &tool("hang")).await);
    // The long call must hold the only slot. A probe can win the slot first (it finishes at
    // once), and then the long call is refused: it simply tries again until it is admitted.
    let busy_call = tokio::spawn({
        let pool = pool.clone();
        async move {
            let request = json!({"id": "c-long", "arguments": {"seconds": 600}, "timeoutMs": 3_000});
            let token = token_for(&pool_key(), RunKind::Call, "c-long");
            loop {
                let (status, _, body) = pool.post(Some(&token), &request).await;
                if status == StatusCode::OK {
                    return serde_json::from_str::<PoolCallResponse>(&body).expect("a pool answer");
                }
                assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
    let body = json!({"id": "c-2", "arguments": {"seconds": 0}, "timeoutMs": 10_000});
    let token = token_for(&pool_key(), RunKind::Call, "c-2");
    let mut refused = None;
    for _ in 0..300 {
        let (status, headers, text) = pool.post(Some(&token), &body).await;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            refused = Some((headers, text));
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (headers, text) = refused.expect("a call beyond the slot and the queue gets 503");
    assert_eq!(headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    assert_eq!(refusal(&text), Refused::Busy, "{text}");
    let long = busy_call.await.unwrap();
    assert_eq!(long.result.error.map(|e| e.kind), Some(CallErrorKind::TimedOut));
}

/// The reason of a pool's 503 answer.
fn refusal(body: &str) -> Refused {
    serde_json::from_str::<PoolRefusal>(body).expect("a pool's refusal").reason
}

/// A pool is shared by every caller of its tool, so its queue is fair between the calls'
/// owners (the owner the gateway signed into each call's token): a full queue makes room for
/// a caller with fewer waiting calls by refusing the newest waiting call of the caller with
/// the most, and the slot then goes to the waiting owners in turn. Without it, one user's
/// calls filling the queue would get every other user's calls refused as busy.
#[tokio::test]
async fn a_full_queue_makes_room_for_another_owner_and_the_slot_takes_turns() {
    // Each call waits for the file its arguments name (if any), then answers its label.
    let script = "import json, os, sys, time\n\
        args = json.load(sys.stdin)\n\
        while args.get('until') and not os.path.exists(args['until']):\n    time.sleep(0.02)\n\
        open(os.environ['TOOLYARD_RESULT_FILE'], 'w').write(json.dumps({'label': args['label']}))\n";
    let pool = std::sync::Arc::new(
        Pool::start(&["--concurrency", "1", "--queue", "2"], &[local::python(), "-c".into(), script.into()]).await,
    );
    let dir = local::TempDir::new("fair-queue");
    let release = dir.path().join("release");
    let send = |user: &'static str, id: &'static str, arguments: Value| {
        let pool = std::sync::Arc::clone(&pool);
        tokio::spawn(async move {
            let body = json!({"id": id, "arguments": arguments, "timeoutMs": 60_000});
            let owner = Owner { issuer: "https://issuer.example".into(), user: user.into(), groups: vec![] };
            let token = pool_key().sign(&Claims {
                kind: RunKind::Call,
                ns: String::new(),
                id: id.into(),
                owner,
                exp: now() + 600,
            });
            let (status, _, text) = pool.post(Some(&token), &body).await;
            (status, text)
        })
    };
    let load = |running, waiting| local::wait_pool_load(&pool.base, running, waiting);
    let hold = send("alice", "a-hold", json!({"label": "hold", "until": release}));
    load(1, 0).await;
    let a1 = send("alice", "a-1", json!({"label": "a1"}));
    load(1, 1).await;
    let a2 = send("alice", "a-2", json!({"label": "a2"}));
    load(1, 2).await;
    let (status, text) = send("alice", "a-3", json!({"label": "a3"})).await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "alice's own calls do not push each other out: {text}");
    assert_eq!(refusal(&text), Refused::Busy, "{text}");

    let b1 = send("bob", "b-1", json!({"label": "b1"}));
    let (status, text) = tokio::time::timeout(Duration::from_secs(30), a2).await.expect("a2 is answered").unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "alice's newest waiting call gave its place to bob's: {text}");
    assert_eq!(refusal(&text), Refused::PushedOut, "{text}");
    load(1, 2).await;
    let (status, text) = send("bob", "b-2", json!({"label": "b2"})).await.unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "one waiting call each: bob's second is refused: {text}");

    std::fs::write(&release, b"").unwrap();
    for (call, label) in [(hold, "hold"), (a1, "a1"), (b1, "b1")] {
        let (status, text) = call.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{label}: {text}");
        let answer: PoolCallResponse = serde_json::from_str(&text).unwrap();
        assert_eq!(answer.result.value, Some(json!({"label": label})), "{answer:?}");
    }
    load(0, 0).await;
}
