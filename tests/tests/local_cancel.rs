//! Cancelling a call of the local executor stops its processes: the runner, the tool and the
//! tool's own child all end, long before the tool's one-hour deadline, and the call answers
//! `cancelled`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use toolyard_api::protocol::CallErrorKind;
use toolyard_api::storage::RunId;
use toolyard_api::token::SigningKey;
use toolyard_gateway::Identity;
use toolyard_gateway::catalog::ToolCatalog;
use toolyard_gateway::catalog::local::LocalCatalog;
use toolyard_gateway::executor::local::{LaunchSettings, LocalExecutor, LocalResults};
use toolyard_gateway::executor::{CallRequest, Executor};
use toolyard_gateway::internal::{self, InternalState};
use toolyard_gateway::local::workers::WarmPools;
use toolyard_gateway::store::fs::FsStore;
use toolyard_tests::local::{self, TempDir};
use toolyard_tests::{repo_path, wait_until};

/// The `hang` fixture with a one-hour deadline, so only cancellation can stop it.
fn write_hang_manifest(dir: &std::path::Path) {
    let text = std::fs::read_to_string(repo_path("tests/fixtures/misbehaving/tools.yaml")).expect("fixture manifests");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("fixture manifests parse");
    let mut hang = docs.into_iter().find(|d| d["spec"]["name"] == "hang").expect("the hang fixture");
    hang["spec"]["execution"]["timeoutSeconds"] = json!(3600);
    hang["spec"]["runtime"]["workingDir"] = json!(repo_path("tests/fixtures/misbehaving"));
    std::fs::write(dir.join("tools.yaml"), hang.to_string()).expect("write the manifest");
}

/// runner -> tool -> the tool's `sleep`, among this test process's children.
fn hang_tree() -> Option<(i32, i32, i32)> {
    for runner in local::children_of(std::process::id() as i32) {
        for tool in local::children_of(runner) {
            if let Some(&sleep) = local::children_of(tool).first() {
                return Some((runner, tool, sleep));
            }
        }
    }
    None
}

#[test]
fn a_cancelled_call_stops_the_runner_the_tool_and_its_child() {
    // The folder outlives the runtime: the executor writes the cancelled call's files in the
    // background after the call answers, and the runtime's shutdown is what ends that.
    let dir = TempDir::new("local-cancel");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    runtime.block_on(cancel_a_call(&dir));
    drop(runtime);
}

async fn cancel_a_call(dir: &TempDir) {
    let tools = dir.path().join("tools");
    std::fs::create_dir_all(&tools).expect("tools folder");
    write_hang_manifest(&tools);
    let catalog = LocalCatalog::load(&tools).expect("the manifest loads");
    let tool = catalog.get("hang").expect("the hang tool");

    // The executor's parts as the local mode wires them: store, internal API, results.
    let store = Arc::new(FsStore::new(dir.path().join("data")).expect("store"));
    let key = SigningKey::new(vec![7; 32]).expect("key");
    let results = Arc::new(LocalResults::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let internal_url = format!("http://{}", listener.local_addr().expect("addr"));
    let router = internal::router(InternalState::new(store.clone(), key.clone()).with_recorder(results.clone()));
    tokio::spawn(async move { axum::serve(listener, router).await });
    let settings = LaunchSettings {
        runner: local::binary("toolyard-runner"),
        internal_url,
        tools_dir: tools.clone(),
        python_package: Some(repo_path("worker-image/python")),
        interpreters: HashMap::from([("python3".to_owned(), PathBuf::from(local::python()))]),
        kill_grace: Duration::from_millis(500),
    };
    let executor =
        LocalExecutor::new(settings, key, store, results, Arc::new(WarmPools::default()), 2).expect("executor");

    let cancel = CancellationToken::new();
    let identity = Identity { issuer: "local".into(), user: "dev".into(), groups: vec![], scopes: vec![] };
    let request = CallRequest {
        id: RunId::parse("hang-cancel-1").expect("id"),
        tool,
        caller: identity,
        arguments: json!({"seconds": 3600}).as_object().cloned().unwrap_or_default(),
        traceparent: None,
        parent_task: None,
        cancel: cancel.clone(),
        cancel_key: None,
        progress: None,
        logs: None,
        asker: None,
        accepted_at: k8s_openapi::jiff::Timestamp::now(),
        task_started: None,
    };
    let call = tokio::spawn(async move { executor.call(request).await });
    let mut tree = None;
    for _ in 0..600 {
        tree = hang_tree();
        if tree.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (runner, tool_pid, sleep) = tree.expect("the runner, the tool and its child start");
    cancel.cancel();

    let result = call.await.expect("the call task").expect("a call result");
    assert_eq!(result.error.map(|e| e.kind), Some(CallErrorKind::Cancelled));
    wait_until(Duration::from_secs(60), "the cancelled call's processes to end", || async {
        Ok([runner, tool_pid, sleep].iter().all(|p| !local::pid_alive(*p)))
    })
    .await
    .expect("runner, tool and the tool's child are gone");
}
