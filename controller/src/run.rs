//! What ToolCalls and CodingTasks share: a run is a Job with a scoped token, a `Succeeded`
//! condition, a deadline counted from creation, cancellation and retention.
//!
//! The pure parts ([`next_status`], [`token_secret`], [`run_job`], deadlines) are unit-tested;
//! [`RunCtx`] holds the reconcile steps that talk to the API server.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodTemplateSpec, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use toolyard_api::conditions::{self, reason, status};
use toolyard_api::token::{Claims, RunKind as TokenKind};
use toolyard_api::{CONTROLLER_MANAGER, Owner};
use tracing::{debug, info};

use crate::config::Config;
use crate::context::{Shared, controller_owner_ref, namespaced_name, reference};
use crate::error::{Error, Result};
use crate::labels;
use crate::metrics::{KindLabels, RunLabels};
use crate::outcome::{self, Finish, Observed};

/// Tokens stay valid this long after the run's deadline (uploads of a timed-out result).
pub const TOKEN_GRACE_SECONDS: i64 = 300;
/// Key of the token in the run's token Secret.
pub const TOKEN_KEY: &str = "token";
/// The controller ends a run itself this long after its deadline if the Job has not.
pub const DEADLINE_SLACK: Duration = Duration::from_secs(30);
/// Label the Job controller puts on a Job's pods.
const JOB_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";

/// Which kind of run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunKind {
    /// A ToolCall.
    Call,
    /// A CodingTask.
    Task,
}

impl RunKind {
    /// Kubernetes kind.
    pub fn kind(self) -> &'static str {
        match self {
            RunKind::Call => "ToolCall",
            RunKind::Task => "CodingTask",
        }
    }
    /// What runs in the main container, for messages.
    pub fn noun(self) -> &'static str {
        match self {
            RunKind::Call => "tool",
            RunKind::Task => "agent",
        }
    }
    /// Name of the main container.
    pub fn container(self) -> &'static str {
        self.noun()
    }
    /// Label naming the run on its Job and pod.
    pub fn label(self) -> &'static str {
        match self {
            RunKind::Call => labels::CALL,
            RunKind::Task => labels::TASK,
        }
    }
    /// Kind claim of its token.
    pub fn token_kind(self) -> TokenKind {
        match self {
            RunKind::Call => TokenKind::Call,
            RunKind::Task => TokenKind::Task,
        }
    }
}

/// A ToolCall or CodingTask, as the shared run logic sees it.
pub trait Run:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + DeserializeOwned
    + Serialize
    + Send
    + Sync
    + 'static
{
    /// Which kind.
    const RUN: RunKind;
    /// The controller-owned part of the status.
    fn run_status(&self) -> RunStatus;
    /// The owner asked to stop.
    fn cancel_requested(&self) -> bool;
    /// Seconds from creation to the hard deadline.
    fn timeout_seconds(&self) -> i64;
    /// Identity the run acts as.
    fn owner(&self) -> &Owner;
    /// How long a finished run is kept.
    fn retention(config: &Config) -> Option<Duration>;
}

impl Run for toolyard_api::ToolCall {
    const RUN: RunKind = RunKind::Call;
    fn run_status(&self) -> RunStatus {
        let s = self.status.clone().unwrap_or_default();
        RunStatus::new(&s.conditions, s.job_name, s.start_time, s.completion_time)
    }
    fn cancel_requested(&self) -> bool {
        self.spec.cancel_requested
    }
    fn timeout_seconds(&self) -> i64 {
        self.spec.timeout_seconds.into()
    }
    fn owner(&self) -> &Owner {
        &self.spec.owner
    }
    fn retention(config: &Config) -> Option<Duration> {
        Some(Duration::from_secs(config.timing.toolcall_retention_seconds))
    }
}

impl Run for toolyard_api::CodingTask {
    const RUN: RunKind = RunKind::Task;
    fn run_status(&self) -> RunStatus {
        let s = self.status.clone().unwrap_or_default();
        RunStatus::new(&s.conditions, s.job_name, s.start_time, s.completion_time)
    }
    fn cancel_requested(&self) -> bool {
        self.spec.cancel_requested
    }
    fn timeout_seconds(&self) -> i64 {
        self.spec.budgets.timeout_seconds.into()
    }
    fn owner(&self) -> &Owner {
        &self.spec.owner
    }
    fn retention(config: &Config) -> Option<Duration> {
        config.timing.codingtask_retention_seconds.map(Duration::from_secs)
    }
}

/// The status fields the controller owns (field manager `toolyard-controller`). Applied as a
/// whole every time, so server-side apply never drops one of them.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RunStatus {
    /// Only `Succeeded`.
    pub conditions: Vec<Condition>,
    /// The run's Job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// When the main container started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When the run finished.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
}

impl RunStatus {
    /// The controller-owned fields of a status.
    pub fn new(
        conditions: &[Condition],
        job_name: Option<String>,
        start_time: Option<Time>,
        completion_time: Option<Time>,
    ) -> Self {
        let conditions = conditions.iter().filter(|c| c.type_ == conditions::SUCCEEDED).cloned().collect();
        Self { conditions, job_name, start_time, completion_time }
    }

    /// The `Succeeded` condition.
    pub fn succeeded(&self) -> Option<&Condition> {
        conditions::find(&self.conditions, conditions::SUCCEEDED)
    }

    /// Its reason.
    pub fn reason(&self) -> Option<&str> {
        self.succeeded().map(|c| c.reason.as_str())
    }

    /// The status without `lastTransitionTime`s: what "the same status" means when deciding
    /// whether to write.
    pub fn fingerprint(&self) -> serde_json::Value {
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(list) = value.get_mut("conditions").and_then(serde_json::Value::as_array_mut) {
            for c in list.iter_mut().filter_map(serde_json::Value::as_object_mut) {
                c.remove("lastTransitionTime");
            }
        }
        value
    }

    /// When the run finished, if it did.
    pub fn finished_at(&self) -> Option<Timestamp> {
        let c = self.succeeded().filter(|c| c.status != status::UNKNOWN)?;
        Some(self.completion_time.as_ref().map(|t| t.0).unwrap_or(c.last_transition_time.0))
    }
}

/// What the reconciler decided about a run in this pass.
#[derive(Clone, Debug, PartialEq)]
pub enum Phase {
    /// Waiting (for a Job, a pod, a node, a pool result).
    Pending {
        /// Why.
        message: String,
    },
    /// The main process runs.
    Running {
        /// Since when.
        started: Timestamp,
        /// For the condition.
        message: String,
    },
    /// Done.
    Finished(Finish),
}

/// The next controller-owned status of a run. Pure: `lastTransitionTime` moves only when the
/// condition's status changes; `startTime` is set once; `completionTime` when it finishes.
pub fn next_status(current: &RunStatus, phase: &Phase, job_name: Option<&str>, generation: Option<i64>) -> RunStatus {
    let mut next = current.clone();
    if let Some(job) = job_name {
        next.job_name = Some(job.to_owned());
    }
    let condition = match phase {
        Phase::Pending { message } => conditions::running(reason::PENDING, message.as_str(), generation),
        Phase::Running { started, message } => {
            next.start_time.get_or_insert(Time(*started));
            conditions::running(reason::RUNNING, message.as_str(), generation)
        }
        Phase::Finished(f) => {
            if let Some(started) = f.started {
                next.start_time.get_or_insert(Time(started));
            }
            next.completion_time = Some(Time(f.finished));
            if f.succeeded() {
                conditions::succeeded(f.message.as_str(), generation)
            } else {
                conditions::failed(f.reason, f.message.as_str(), generation)
            }
        }
    };
    conditions::upsert(&mut next.conditions, condition);
    next
}

/// The hard deadline of a run created at `created`.
pub fn deadline(created: Timestamp, timeout_seconds: i64) -> Timestamp {
    created.saturating_add(SignedDuration::from_secs(timeout_seconds)).unwrap_or(created)
}

/// Whole seconds from `now` to `deadline`, at least 1 (for `activeDeadlineSeconds`).
pub fn remaining_seconds(deadline: Timestamp, now: Timestamp) -> i64 {
    let left = deadline.duration_since(now);
    let secs = left.as_secs() + i64::from(left.subsec_nanos() > 0);
    secs.max(1)
}

/// Name of a run's token Secret.
pub fn token_secret_name(run: &str) -> String {
    format!("{run}-token")
}

/// The run's token claims: this run, this owner, valid until shortly after the deadline.
pub fn claims(kind: RunKind, ns: &str, name: &str, owner: &Owner, deadline: Timestamp) -> Claims {
    Claims {
        kind: kind.token_kind(),
        ns: ns.to_owned(),
        id: name.to_owned(),
        owner: owner.clone(),
        exp: deadline.as_second() + TOKEN_GRACE_SECONDS,
    }
}

/// The Secret holding a run's token, owned by the run (garbage-collected with it).
pub fn token_secret(
    run: &str,
    ns: &str,
    owner: OwnerReference,
    labels: BTreeMap<String, String>,
    token: String,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(token_secret_name(run)),
            namespace: Some(ns.to_owned()),
            labels: Some(labels),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(TOKEN_KEY.to_owned(), ByteString(token.into_bytes()))])),
        ..Default::default()
    }
}

/// Labels of a run's Job, pod and Secret.
pub fn run_labels(kind: RunKind, run: &str, owner: &Owner, extra: &[(&str, String)]) -> BTreeMap<String, String> {
    let mut l = labels::base();
    l.insert(kind.label().to_owned(), labels::value(run));
    l.insert(labels::OWNER.to_owned(), owner.key().to_string());
    for (k, v) in extra {
        l.insert((*k).to_owned(), v.clone());
    }
    l
}

/// A run's Job: one pod, never retried, hard deadline, cleaned up after `ttl` seconds.
pub fn run_job(
    name: &str,
    ns: &str,
    owner: OwnerReference,
    labels: BTreeMap<String, String>,
    pod: PodSpec,
    active_deadline_seconds: i64,
    ttl_seconds_after_finished: i32,
) -> Job {
    Job {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(ns.to_owned()),
            labels: Some(labels.clone()),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(JobSpec {
            backoff_limit: Some(0),
            completions: Some(1),
            parallelism: Some(1),
            active_deadline_seconds: Some(active_deadline_seconds),
            ttl_seconds_after_finished: Some(ttl_seconds_after_finished),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta { labels: Some(labels), ..Default::default() }),
                spec: Some(pod),
            },
            ..Default::default()
        }),
        status: None,
    }
}

/// Where a run's Job stands.
#[derive(Clone, Debug)]
pub enum JobState {
    /// It exists.
    Exists(Box<Job>),
    /// The status names it but it is gone (deleted by someone else).
    Lost,
    /// Not created yet.
    NotCreated,
}

/// The Jobs and pods of one kind of run, cached from watches.
#[derive(Clone)]
pub struct RunStores {
    /// Jobs labelled with the run kind's label.
    pub jobs: Store<Job>,
    /// Their pods.
    pub pods: Store<Pod>,
    /// The pods' names by run.
    pub pods_by_run: crate::pod_index::PodsByRun,
}

/// One reconcile pass over one run.
pub struct RunCtx<'a, K: Run> {
    obj: &'a K,
    /// Namespace.
    pub ns: String,
    /// Object name (= run id = Job name).
    pub name: String,
    api: Api<K>,
    /// The controller-owned status as it is now.
    pub current: RunStatus,
    /// This pass's clock.
    pub now: Timestamp,
    /// When the object was created.
    pub created: Timestamp,
    /// The hard deadline.
    pub deadline: Timestamp,
}

impl<'a, K: Run> RunCtx<'a, K> {
    /// Starts a pass over `obj`.
    pub fn new(obj: &'a K, shared: &Shared) -> Result<Self> {
        let kind = K::RUN.kind();
        let (ns, name) = namespaced_name(obj, kind)?;
        let created = obj
            .meta()
            .creation_timestamp
            .as_ref()
            .map(|t| t.0)
            .ok_or(Error::MissingField { kind, field: "metadata.creationTimestamp" })?;
        Ok(Self {
            obj,
            api: Api::namespaced(shared.client.clone(), &ns),
            ns,
            name,
            current: obj.run_status(),
            now: Timestamp::now(),
            created,
            deadline: deadline(created, obj.timeout_seconds()),
        })
    }

    /// The run's token claims.
    pub fn claims(&self) -> Claims {
        claims(K::RUN, &self.ns, &self.name, self.obj.owner(), self.deadline)
    }

    /// Handles runs that need no Job work: finished ones (retention) and cancelled or
    /// deleted ones. `Some(action)` ends the pass.
    pub async fn settle(&self, shared: &Shared, stores: &RunStores) -> Result<Option<Action>> {
        if let Some(finished) = self.current.finished_at() {
            let cached = stores.jobs.get(&ObjectRef::new(&self.name).within(&self.ns));
            if cached.is_some_and(|j| !job_finished(&j)) {
                // The run ended without its Job (cancelled, pod never started, deadline): the
                // final status is written first, then the Job is stopped, here if need be.
                self.delete_job(shared).await?;
            }
            return self.retention(shared, finished).await.map(Some);
        }
        let deleting = self.obj.meta().deletion_timestamp.is_some();
        if deleting || self.obj.cancel_requested() {
            let message = if deleting {
                format!("the {} is being deleted", K::RUN.kind())
            } else {
                "cancelled on request".to_owned()
            };
            let finish =
                Finish { reason: reason::CANCELLED, message, started: None, finished: self.now, stop_job: true };
            return self.finish(shared, finish).await.map(Some);
        }
        Ok(None)
    }

    /// Ends the run: writes the final status, deletes the Job when it must stop (a later pass
    /// retries that, see [`RunCtx::settle`]), emits an Event and counts the outcome.
    pub async fn finish(&self, shared: &Shared, finish: Finish) -> Result<Action> {
        let next = next_status(&self.current, &Phase::Finished(finish.clone()), None, self.obj.meta().generation);
        let wrote = self.write(shared, &next).await?;
        if finish.stop_job {
            self.delete_job(shared).await?;
        }
        if wrote {
            let warning = !finish.succeeded() && finish.reason != reason::CANCELLED;
            info!(kind = K::RUN.kind(), namespace = %self.ns, name = %self.name, reason = finish.reason, "run finished");
            shared.publish(&reference(self.obj), warning, finish.reason, "Finish", finish.message.clone()).await;
            shared.metrics.runs.get_or_create(&RunLabels { kind: K::RUN.kind(), outcome: finish.reason }).inc();
        }
        let finished = next.finished_at().unwrap_or(self.now);
        self.retention(shared, finished).await
    }

    /// Rejects the run before anything starts (`Succeeded=False/Rejected`).
    pub async fn reject(&self, shared: &Shared, message: String) -> Result<Action> {
        let finish = Finish { reason: reason::REJECTED, message, started: None, finished: self.now, stop_job: false };
        self.finish(shared, finish).await
    }

    /// Writes `next` if it differs from the current status. Returns whether it wrote.
    pub async fn write(&self, shared: &Shared, next: &RunStatus) -> Result<bool> {
        let uid = self.obj.meta().uid.clone().unwrap_or_default();
        let next_value = next.fingerprint();
        let current_value = self.current.fingerprint();
        if shared.written.unseen(&uid, &current_value, &next_value) || *next == self.current {
            return Ok(false);
        }
        let body = serde_json::json!({
            "apiVersion": toolyard_api::API_VERSION,
            "kind": K::RUN.kind(),
            "metadata": {"name": self.name},
            "status": next,
        });
        self.api
            .patch_status(&self.name, &PatchParams::apply(CONTROLLER_MANAGER).force(), &Patch::Apply(&body))
            .await?;
        shared.written.wrote(&uid, next_value);
        shared.metrics.status_writes.get_or_create(&KindLabels { kind: K::RUN.kind() }).inc();
        debug!(kind = K::RUN.kind(), namespace = %self.ns, name = %self.name, reason = next.reason().unwrap_or_default(), "status written");
        Ok(true)
    }

    /// Deletes a finished run once its retention has passed; otherwise waits for that moment.
    async fn retention(&self, shared: &Shared, finished: Timestamp) -> Result<Action> {
        let Some(keep) = K::retention(&shared.config) else { return Ok(Action::await_change()) };
        let age = outcome::elapsed(finished, self.now);
        if age < keep {
            return Ok(Action::requeue(keep - age + Duration::from_millis(100)));
        }
        match self.api.delete(&self.name, &DeleteParams::background()).await {
            Ok(_) => {
                shared.written.forget(self.obj.meta().uid.as_deref().unwrap_or_default());
                info!(kind = K::RUN.kind(), namespace = %self.ns, name = %self.name, "deleted after retention");
                Ok(Action::await_change())
            }
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(Action::await_change()),
            Err(e) => Err(e.into()),
        }
    }

    /// The run's Job from the cache; when the cache misses a Job the status names, from the API.
    pub async fn job(&self, shared: &Shared, stores: &RunStores) -> Result<Option<Job>> {
        if let Some(job) = stores.jobs.get(&ObjectRef::new(&self.name).within(&self.ns)) {
            return Ok(Some((*job).clone()));
        }
        if self.current.job_name.is_none() {
            return Ok(None);
        }
        Ok(Api::<Job>::namespaced(shared.client.clone(), &self.ns).get_opt(&self.name).await?)
    }

    /// Deletes the run's Job (and so its pod); a missing Job is fine.
    pub async fn delete_job(&self, shared: &Shared) -> Result<()> {
        let jobs = Api::<Job>::namespaced(shared.client.clone(), &self.ns);
        match jobs.delete(&self.name, &DeleteParams::background()).await {
            Ok(_) => {
                info!(kind = K::RUN.kind(), namespace = %self.ns, name = %self.name, "job deleted");
                Ok(())
            }
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Where the run's Job stands. A Job the status names but that is gone ends the run.
    pub async fn job_state(&self, shared: &Shared, stores: &RunStores) -> Result<JobState> {
        Ok(match self.job(shared, stores).await? {
            Some(job) => JobState::Exists(Box::new(job)),
            None if self.current.job_name.is_some() => JobState::Lost,
            None => JobState::NotCreated,
        })
    }

    /// Ends a run whose Job the status names but which is gone; otherwise `None`.
    pub async fn end_if_job_lost(&self, shared: &Shared, state: &JobState) -> Result<Option<Action>> {
        if !matches!(state, JobState::Lost) {
            return Ok(None);
        }
        let message = format!("the Job was deleted before the {} finished", K::RUN.noun());
        let finish = Finish { reason: reason::FAILED, message, started: None, finished: self.now, stop_job: false };
        self.finish(shared, finish).await.map(Some)
    }

    /// Maps the Job's and its pod's state to the run's status.
    pub async fn observe_job(&self, shared: &Shared, stores: &RunStores, job: &Job) -> Result<Action> {
        let noun = K::RUN.noun();
        let generation = self.obj.meta().generation;
        let uid = job.metadata.uid.clone().unwrap_or_default();
        let pods: Vec<Arc<Pod>> = stores
            .pods_by_run
            .pods_of(&self.ns, &self.name)
            .iter()
            .filter_map(|name| stores.pods.get(&ObjectRef::new(name).within(&self.ns)))
            .collect();
        let pod =
            outcome::newest(pods.iter().map(|p| p.as_ref()).filter(|p| p.labels().get(JOB_UID_LABEL) == Some(&uid)));
        let observed = outcome::observe(job, pod, K::RUN.container(), noun, self.now, &shared.config.timing.graces());
        let (phase, recheck) = match observed {
            Observed::Finished(finish) => return self.finish(shared, finish).await,
            Observed::Pending { message, recheck_after } => (Phase::Pending { message }, recheck_after),
            Observed::Running { started } => {
                (Phase::Running { started, message: format!("the {noun} is running") }, None)
            }
        };
        if self.overdue() {
            let message = format!("the {noun} did not finish before its deadline");
            let finish =
                Finish { reason: reason::TIMED_OUT, message, started: None, finished: self.now, stop_job: true };
            return self.finish(shared, finish).await;
        }
        let next = next_status(&self.current, &phase, Some(&self.name), generation);
        let became_running = matches!(phase, Phase::Running { .. }) && self.current.reason() != Some(reason::RUNNING);
        if self.write(shared, &next).await? && became_running {
            if let Some(created) = job.metadata.creation_timestamp.as_ref() {
                let latency = outcome::elapsed(created.0, self.now).as_secs_f64();
                shared.metrics.job_start_latency.get_or_create(&KindLabels { kind: K::RUN.kind() }).observe(latency);
            }
            shared.publish(&reference(self.obj), false, reason::RUNNING, "Run", format!("the {noun} is running")).await;
        }
        Ok(self.requeue(recheck))
    }

    /// Creates the run's token Secret, then its Job (server-side apply), and records `Pending`;
    /// past the deadline, ends the run as `TimedOut` instead.
    pub async fn create_job(&self, shared: &Shared, job: &Job, secret: &Secret) -> Result<Action> {
        if self.now >= self.deadline {
            // E.g. the controller was down: starting now would only be killed at once.
            let message = format!("the deadline passed before the {}'s Job was created", K::RUN.noun());
            let finish =
                Finish { reason: reason::TIMED_OUT, message, started: None, finished: self.now, stop_job: false };
            return self.finish(shared, finish).await;
        }
        let params = PatchParams::apply(CONTROLLER_MANAGER).force();
        create_secret(shared, &self.ns, secret).await?;
        Api::<Job>::namespaced(shared.client.clone(), &self.ns).patch(&self.name, &params, &Patch::Apply(job)).await?;
        let latency = outcome::elapsed(self.created, Timestamp::now()).as_secs_f64();
        shared.metrics.job_creation_latency.get_or_create(&KindLabels { kind: K::RUN.kind() }).observe(latency);
        info!(kind = K::RUN.kind(), namespace = %self.ns, name = %self.name, "job created");
        let phase = Phase::Pending { message: outcome::WAITING.to_owned() };
        let next = next_status(&self.current, &phase, Some(&self.name), self.obj.meta().generation);
        // The Event and the status write are independent: one round trip instead of two.
        let reference = reference(self.obj);
        let event = shared.publish(&reference, false, "JobCreated", "CreateJob", format!("created Job {}", self.name));
        let (written, ()) = futures::join!(self.write(shared, &next), event);
        written?;
        Ok(self.requeue(None))
    }

    /// Waits for a pool or gateway to finish the run: `Succeeded` from `result` when it comes,
    /// `TimedOut` when the deadline passes without one.
    pub async fn await_result(&self, shared: &Shared, result: Option<Finish>, pending: &str) -> Result<Action> {
        if let Some(finish) = result {
            return self.finish(shared, finish).await;
        }
        if self.now >= self.deadline {
            let message = format!("no result arrived before the deadline of {}s", self.obj.timeout_seconds());
            let finish =
                Finish { reason: reason::TIMED_OUT, message, started: None, finished: self.now, stop_job: false };
            return self.finish(shared, finish).await;
        }
        let next = next_status(
            &self.current,
            &Phase::Pending { message: pending.to_owned() },
            None,
            self.obj.meta().generation,
        );
        self.write(shared, &next).await?;
        let left = outcome::elapsed(self.now, self.deadline);
        Ok(Action::requeue(left + Duration::from_millis(100)))
    }

    fn overdue(&self) -> bool {
        self.now > self.deadline && outcome::elapsed(self.deadline, self.now) > DEADLINE_SLACK
    }

    /// Next look: when a grace ends, or shortly after the deadline as a safety net.
    fn requeue(&self, recheck: Option<Duration>) -> Action {
        let safety = outcome::elapsed(self.now, self.deadline) + DEADLINE_SLACK + Duration::from_secs(1);
        Action::requeue(recheck.map(|r| r + Duration::from_millis(100)).unwrap_or(safety).min(safety))
    }

    /// Owner reference to the run, for its children.
    pub fn owner_ref(&self) -> Result<OwnerReference> {
        controller_owner_ref(self.obj, K::RUN.kind())
    }
}

/// Creates a Secret the controller owns; one that exists already is left as it is.
///
/// Create-only on purpose: the controller's role has no Secret verb whose answer contains
/// another Secret's data (get, list, watch, patch, update, delete), so it cannot read any.
/// The Secrets it makes are deterministic (same key, same claims, same token).
pub async fn create_secret(shared: &Shared, ns: &str, secret: &Secret) -> Result<()> {
    let secrets = Api::<Secret>::namespaced(shared.client.clone(), ns);
    let params = kube::api::PostParams { field_manager: Some(CONTROLLER_MANAGER.to_owned()), ..Default::default() };
    match secrets.create(&params, secret).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The Job controller has decided the Job's outcome (it may still be cleaning up its pods).
fn job_finished(job: &Job) -> bool {
    const DECIDED: [&str; 4] = ["Complete", "SuccessCriteriaMet", "Failed", "FailureTarget"];
    job.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| DECIDED.contains(&c.type_.as_str()) && c.status == "True"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending() -> Phase {
        Phase::Pending { message: "waiting".into() }
    }

    #[test]
    fn first_visit_sets_pending_with_job_name() {
        let next = next_status(&RunStatus::default(), &pending(), Some("c1"), Some(1));
        let c = next.succeeded().unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("Unknown", "Pending"));
        assert_eq!(c.observed_generation, Some(1));
        assert_eq!(next.job_name.as_deref(), Some("c1"));
        assert!(next.start_time.is_none() && next.completion_time.is_none());
        assert_eq!(next.finished_at(), None);
    }

    #[test]
    fn same_phase_twice_is_no_change() {
        let first = next_status(&RunStatus::default(), &pending(), Some("c1"), Some(1));
        std::thread::sleep(Duration::from_millis(2));
        assert_eq!(next_status(&first, &pending(), Some("c1"), Some(1)), first);
    }

    #[test]
    fn running_then_finished_sets_times_once() {
        let t0: Timestamp = "2026-12-01T10:00:05Z".parse().unwrap();
        let t1: Timestamp = "2026-12-01T10:00:09Z".parse().unwrap();
        let pending = next_status(&RunStatus::default(), &pending(), Some("c1"), Some(1));
        let running = next_status(
            &pending,
            &Phase::Running { started: t0, message: "the tool is running".into() },
            None,
            Some(1),
        );
        assert_eq!(running.start_time, Some(Time(t0)));
        assert_eq!(running.reason(), Some("Running"));
        assert_eq!(
            running.succeeded().unwrap().last_transition_time,
            pending.succeeded().unwrap().last_transition_time,
            "Unknown -> Unknown keeps the transition time"
        );
        let later: Timestamp = "2026-12-01T10:00:07Z".parse().unwrap();
        let finish = Finish {
            reason: reason::FAILED,
            message: "boom".into(),
            started: Some(later),
            finished: t1,
            stop_job: false,
        };
        let done = next_status(&running, &Phase::Finished(finish), None, Some(1));
        assert_eq!(done.start_time, Some(Time(t0)), "startTime is set once");
        assert_eq!(done.completion_time, Some(Time(t1)));
        let c = done.succeeded().unwrap();
        assert_eq!((c.status.as_str(), c.reason.as_str(), c.message.as_str()), ("False", "Failed", "boom"));
        assert_eq!(done.finished_at(), Some(t1));
        assert_eq!(done.job_name.as_deref(), Some("c1"));
    }

    #[test]
    fn fingerprint_ignores_transition_times_only() {
        let a = next_status(&RunStatus::default(), &pending(), Some("c1"), Some(1));
        std::thread::sleep(Duration::from_millis(2));
        let b = next_status(&RunStatus::default(), &pending(), Some("c1"), Some(1));
        assert_ne!(a, b, "fresh conditions get fresh transition times");
        assert_eq!(a.fingerprint(), b.fingerprint());
        let c = next_status(&RunStatus::default(), &Phase::Pending { message: "other".into() }, Some("c1"), Some(1));
        assert_ne!(a.fingerprint(), c.fingerprint());
    }

    #[test]
    fn success_is_true() {
        let t: Timestamp = "2026-12-01T10:00:09Z".parse().unwrap();
        let finish =
            Finish { reason: reason::SUCCEEDED, message: "ok".into(), started: None, finished: t, stop_job: false };
        let done = next_status(&RunStatus::default(), &Phase::Finished(finish), None, None);
        assert!(conditions::is_true(&done.conditions, conditions::SUCCEEDED));
    }

    #[test]
    fn only_the_succeeded_condition_is_owned() {
        let other = Condition { type_: "Other".into(), ..conditions::ready("True", "x", "", None) };
        let s = RunStatus::new(&[other, conditions::running("Pending", "w", None)], None, None, None);
        assert_eq!(s.conditions.len(), 1);
        assert_eq!(s.conditions[0].type_, "Succeeded");
    }

    #[test]
    fn deadlines_count_from_creation_and_never_reach_zero() {
        let created: Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        let d = deadline(created, 30);
        assert_eq!(d, "2026-12-01T10:00:30Z".parse::<Timestamp>().unwrap());
        assert_eq!(remaining_seconds(d, "2026-12-01T10:00:10Z".parse().unwrap()), 20);
        assert_eq!(remaining_seconds(d, "2026-12-01T10:00:10.5Z".parse().unwrap()), 20, "rounded up");
        assert_eq!(remaining_seconds(d, "2026-12-01T10:01:00Z".parse().unwrap()), 1);
    }

    #[test]
    fn token_secret_is_owned_and_holds_the_token() {
        let owner = OwnerReference {
            api_version: "toolyard.dev/v1alpha1".into(),
            kind: "ToolCall".into(),
            name: "c1".into(),
            uid: "u1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        let s = token_secret("c1", "ns", owner.clone(), labels::base(), "tyr1.a.b".into());
        assert_eq!(s.metadata.name.as_deref(), Some("c1-token"));
        assert_eq!(s.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(s.metadata.owner_references, Some(vec![owner]));
        assert_eq!(s.data.unwrap()["token"], ByteString(b"tyr1.a.b".to_vec()));
    }

    #[test]
    fn claims_expire_after_the_deadline_grace() {
        let owner = Owner { issuer: "apikey".into(), user: "alice".into(), groups: vec![] };
        let d: Timestamp = "2026-12-01T10:00:30Z".parse().unwrap();
        let c = claims(RunKind::Task, "ns", "t1", &owner, d);
        assert_eq!(c.kind, TokenKind::Task);
        assert_eq!(c.exp, d.as_second() + 300);
        assert_eq!((c.ns.as_str(), c.id.as_str()), ("ns", "t1"));
    }
}
