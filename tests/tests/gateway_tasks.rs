//! The Kubernetes task backend's owner index on the real apiserver: an owner's CodingTasks are
//! walked newest first from the watch, page after page, without another owner's or an
//! unwatched object; running tasks are counted from the same index, and a status change or a
//! deletion shows in both.

use crate::gateway_support;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use toolyard_api::{CodingTask, Owner, OwnerKey, conditions};
use toolyard_gateway::store::fs::FsStore;
use toolyard_gateway::tasks::kube::KubeTasks;
use toolyard_gateway::tasks::{Position, Subset, TaskBackend, TaskRecord, new_task_id};
use toolyard_tests::local::TempDir;
use toolyard_tests::{TestEnv, User, wait_until};

fn owner(user: &str) -> Owner {
    Owner { issuer: "apikey".into(), user: user.into(), groups: vec![] }
}

/// A CodingTask of `user` as the gateway creates them (`watched`: with its managed-by label).
fn task(user: &str, watched: bool) -> CodingTask {
    let owner = owner(user);
    let mut labels = json!({"toolyard.dev/owner": owner.key().as_str()});
    if watched {
        labels["app.kubernetes.io/managed-by"] = json!("toolyard-gateway");
    }
    serde_json::from_value(json!({
        "apiVersion": "toolyard.dev/v1alpha1",
        "kind": "CodingTask",
        "metadata": {"name": new_task_id().as_str(), "labels": labels},
        "spec": {"prompt": format!("a task of {user}"), "owner": owner},
    }))
    .expect("CodingTask")
}

async fn create(api: &Api<CodingTask>, user: &str, watched: bool) -> String {
    api.create(&PostParams::default(), &task(user, watched)).await.expect("create").metadata.name.expect("name")
}

/// Walks `owner`'s tasks of `subset` from `before`, at most `limit` of them.
async fn walk_of(
    tasks: &KubeTasks,
    owner: &OwnerKey,
    subset: Subset,
    before: Option<&Position>,
    limit: usize,
) -> Vec<TaskRecord> {
    let mut seen = Vec::new();
    let visit = &mut |r: TaskRecord| {
        seen.push(r);
        if seen.len() == limit { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    };
    tasks.walk(owner, subset, before, visit).await.expect("walk");
    seen
}

/// Walks all of `owner`'s tasks from `before`, at most `limit` of them.
async fn walk(tasks: &KubeTasks, owner: &OwnerKey, before: Option<&Position>, limit: usize) -> Vec<TaskRecord> {
    walk_of(tasks, owner, Subset::All, before, limit).await
}

fn names(records: &[TaskRecord]) -> Vec<String> {
    records.iter().map(|r| r.id.to_string()).collect()
}

#[tokio::test]
async fn an_owners_tasks_are_walked_newest_first_from_the_watch_and_counted_as_they_change() {
    let env = TestEnv::get();
    env.install_crds().await.expect("CRDs");
    let ns = env.namespace("tasks-index").await.expect("namespace");
    gateway_support::grant_platform(&ns).await;
    let api: Api<CodingTask> = Api::namespaced(env.client(User::Admin).await, &ns);
    let (alice, bob) = (owner("alice").key(), owner("bob").key());

    // Some exist before the watch starts (its first list), the rest come as watch events.
    let mut alices = Vec::new();
    for _ in 0..4 {
        alices.push(create(&api, "alice", true).await);
    }
    let data = TempDir::new("tasks-index");
    let store = Arc::new(FsStore::new(data.path()).expect("store"));
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let tasks = KubeTasks::start(env.client(User::Gateway).await, &ns, store, Duration::from_secs(10), stop);
    for _ in 0..3 {
        alices.push(create(&api, "alice", true).await);
    }
    for _ in 0..3 {
        create(&api, "bob", true).await;
    }
    let unwatched = create(&api, "alice", false).await;
    wait_until(Duration::from_secs(30), "the watch to show every task", || {
        let tasks = tasks.clone();
        let (alice, bob) = (alice.clone(), bob.clone());
        async move { Ok(walk(&tasks, &alice, None, 100).await.len() == 7 && walk(&tasks, &bob, None, 100).await.len() == 3) }
    })
    .await
    .expect("listed");

    // Newest first, by creation time then name, as the objects say.
    let objects = api.list(&Default::default()).await.expect("list").items;
    let mut expected: Vec<(i64, String)> = objects
        .iter()
        .filter(|o| alices.contains(o.metadata.name.as_ref().expect("name")))
        .map(|o| {
            (
                o.metadata.creation_timestamp.as_ref().expect("created").0.as_millisecond(),
                o.metadata.name.clone().unwrap(),
            )
        })
        .collect();
    expected.sort();
    expected.reverse();
    let expected: Vec<String> = expected.into_iter().map(|(_, n)| n).collect();
    let all = walk(&tasks, &alice, None, 100).await;
    assert_eq!(names(&all), expected);
    assert!(!names(&all).contains(&unwatched), "an object the gateway did not create is not its task");
    assert!(all.iter().all(|r| r.owned_by(&alice)));
    assert!(walk(&tasks, &bob, None, 100).await.iter().all(|r| r.owned_by(&bob)));

    // Page by page: each continues after the last one seen, and together they are the whole.
    let mut pages = Vec::new();
    let mut before: Option<Position> = None;
    loop {
        let page = walk(&tasks, &alice, before.as_ref(), 3).await;
        let Some(last) = page.last() else { break };
        before = Some(last.position());
        pages.extend(names(&page));
    }
    assert_eq!(pages, expected);

    // Running tasks are counted from the index; finishing one and deleting one show in it.
    assert_eq!(tasks.running_of(&alice).await.expect("running"), 7);
    let done = json!({"status": {"conditions": [conditions::succeeded("done", None)]}});
    api.patch_status(&expected[0], &PatchParams::default(), &Patch::Merge(&done)).await.expect("finish one");
    api.delete(&expected[1], &DeleteParams::default()).await.expect("delete one");
    wait_until(Duration::from_secs(30), "the watch to show the change", || {
        let tasks = tasks.clone();
        let alice = alice.clone();
        async move { Ok(tasks.running_of(&alice).await? == 5) }
    })
    .await
    .expect("counted");
    let after = walk(&tasks, &alice, None, 100).await;
    assert_eq!(names(&after), [&expected[..1], &expected[2..]].concat());
    assert!(after[0].phase.is_finished(), "{:?}", after[0].phase);
    // The unfinished ones alone, page by page.
    let unfinished = walk_of(&tasks, &alice, Subset::Unfinished, None, 100).await;
    assert_eq!(names(&unfinished), expected[2..]);
    let rest = walk_of(&tasks, &alice, Subset::Unfinished, Some(&unfinished[1].position()), 100).await;
    assert_eq!(names(&rest), expected[4..]);
    assert_eq!(tasks.running_of(&bob).await.expect("running"), 3);
}
