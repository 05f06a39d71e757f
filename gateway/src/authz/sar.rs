//! Kubernetes RBAC through SubjectAccessReview.
//!
//! - list/call a tool: verb `call` on `mcptools.toolyard.dev`, `resourceName` = the
//!   McpTool's object name, in the tool's namespace;
//! - list/call a tool (or list/get a prompt) of an upstream MCP server: verb `call` on
//!   `mcpservers.toolyard.dev` in the McpServer's namespace, `resourceName` = the McpServer's
//!   name (all its tools and prompts) or `<McpServer name>/<the tool's or prompt's name on
//!   that server>` (that one only);
//! - start a coding task: verb `create` on `codingtasks.toolyard.dev` in the namespace;
//! - use a model profile for tasks: verb `use` on `modelprofiles.toolyard.dev`,
//!   `resourceName` = the profile, in the task's namespace (a resource without objects: RBAC
//!   needs none to grant it).
//!
//! For tools, a review without `resourceName` ("all mcptools in this namespace", which a
//! ClusterRoleBinding or a namespace-wide Role grants) comes first, so a broad grant costs
//! one review per subject and namespace per TTL whatever the number of tools. Decisions
//! are cached (allow and deny with their own TTLs) by subject (user + sorted groups) and
//! attributes; concurrent identical questions share one review. Every review has a
//! timeout; a failed review is a deny (logged and counted), never an allow, and is not
//! cached. The gateway's identity needs only `create subjectaccessreviews`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};

use super::metrics::AuthzMetrics;
use super::subject::{Subject, SubjectMapping};
use super::{Authorizer, Decisions};
use crate::auth::cache::TtlCache;
use crate::catalog::{Prompt, ServedResource, Tool};
use crate::identity::Identity;

/// API group of Toolyard's resources.
pub const API_GROUP: &str = "toolyard.dev";
/// Resource whose `call` verb gates tools.
pub const TOOLS_RESOURCE: &str = "mcptools";
/// Resource whose `call` verb gates the tools of upstream MCP servers.
pub const SERVERS_RESOURCE: &str = "mcpservers";
/// Resource whose `call` verb gates declared prompts (McpPrompts).
pub const PROMPTS_RESOURCE: &str = "mcpprompts";
/// Verb to list or call a tool (or list and get a prompt).
pub const CALL_VERB: &str = "call";
/// Resource whose `create` verb gates coding tasks.
pub const TASKS_RESOURCE: &str = "codingtasks";
/// Verb to start a coding task.
pub const CREATE_VERB: &str = "create";
/// Resource whose `use` verb gates model profiles.
pub const MODEL_PROFILES_RESOURCE: &str = "modelprofiles";
/// Verb to use a model profile.
pub const USE_VERB: &str = "use";

/// SubjectAccessReview settings.
#[derive(Clone, Debug)]
pub struct SarSettings {
    /// How long an allow is reused.
    pub allow_ttl: Duration,
    /// How long a deny is reused.
    pub deny_ttl: Duration,
    /// Timeout of each review.
    pub timeout: Duration,
    /// Cache bound.
    pub max_entries: usize,
    /// How identities become review subjects.
    pub subjects: SubjectMapping,
}

impl Default for SarSettings {
    fn default() -> Self {
        Self {
            allow_ttl: Duration::from_secs(30),
            deny_ttl: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            max_entries: 50_000,
            subjects: SubjectMapping::default(),
        }
    }
}

/// One question: may `subject` do `verb` on `resource` (`name`) in `namespace`?
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Question {
    subject: Arc<Subject>,
    verb: &'static str,
    resource: &'static str,
    namespace: String,
    name: Option<String>,
}

/// `Some(allowed)`, or `None` when the review failed.
type Answer = Option<bool>;

/// An answer and until when it holds (`None`: a failed review, which is not kept).
type Held = (Answer, Option<Instant>);

/// Until when two answers both hold.
fn both_hold(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    a.zip(b).map(|(a, b)| a.min(b))
}

struct Inner {
    api: Api<SubjectAccessReview>,
    settings: SarSettings,
    cache: TtlCache<Question, bool>,
    inflight: Mutex<HashMap<Question, Shared<BoxFuture<'static, Held>>>>,
    reviews: AtomicU64,
    metrics: AuthzMetrics,
}

/// Authorizer asking the apiserver.
#[derive(Clone)]
pub struct SarAuthorizer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SarAuthorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SarAuthorizer").field("settings", &self.inner.settings).finish_non_exhaustive()
    }
}

impl SarAuthorizer {
    /// Reviews with `client` (which needs `create subjectaccessreviews`).
    pub fn new(client: kube::Client, settings: SarSettings, metrics: AuthzMetrics) -> Self {
        let cache = TtlCache::new(settings.max_entries);
        Self {
            inner: Arc::new(Inner {
                api: Api::all(client),
                settings,
                cache,
                inflight: Mutex::new(HashMap::new()),
                reviews: AtomicU64::new(0),
                metrics,
            }),
        }
    }

    /// SubjectAccessReviews sent so far (cache hits and shared in-flight reviews send none).
    pub fn reviews_sent(&self) -> u64 {
        self.inner.reviews.load(Ordering::Relaxed)
    }

    async fn ask(&self, question: &Question) -> Held {
        if let Some((allowed, until)) = self.inner.cache.get_with_expiry(question) {
            return (Some(allowed), Some(until));
        }
        let shared = {
            let mut inflight = self.inner.inflight.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(pending) = inflight.get(question) {
                pending.clone()
            } else {
                let inner = Arc::clone(&self.inner);
                let q = question.clone();
                let fut = async move {
                    let answer = inner.review(&q).await;
                    let until = answer.and_then(|allowed| {
                        let ttl = if allowed { inner.settings.allow_ttl } else { inner.settings.deny_ttl };
                        inner.cache.insert(q.clone(), allowed, ttl)
                    });
                    inner.inflight.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&q);
                    (answer, until)
                }
                .boxed()
                .shared();
                inflight.insert(question.clone(), fut.clone());
                fut
            }
        };
        shared.await
    }

    /// Asks `call` on `resource` for each of `names` in turn (the broadest grant first): the
    /// first allow decides; a failed review ends the questions as a deny. The answer holds
    /// while every answer asked for it does (without a question: not to be reused).
    async fn first_allow(
        &self,
        subject: &Arc<Subject>,
        resource: &'static str,
        namespace: &str,
        names: Vec<Option<String>>,
    ) -> Held {
        let (mut answer, mut until) = (Some(false), None);
        for (i, name) in names.into_iter().enumerate() {
            let question =
                Question { subject: subject.clone(), verb: CALL_VERB, resource, namespace: namespace.to_owned(), name };
            let held = self.ask(&question).await;
            answer = held.0;
            until = if i == 0 { held.1 } else { both_hold(until, held.1) };
            if answer != Some(false) {
                break;
            }
        }
        (answer, until)
    }

    fn subject(&self, who: &Identity) -> Arc<Subject> {
        Arc::new(self.inner.settings.subjects.subject(who))
    }

    fn record(&self, action: &'static str, answer: Answer) -> bool {
        let outcome = match answer {
            Some(true) => "allow",
            Some(false) => "deny",
            None => "error",
        };
        self.inner.metrics.decision("sar", action, outcome);
        answer == Some(true)
    }
}

impl Inner {
    async fn review(&self, q: &Question) -> Answer {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(q.subject.user.clone()),
                groups: Some(q.subject.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(API_GROUP.to_owned()),
                    resource: Some(q.resource.to_owned()),
                    verb: Some(q.verb.to_owned()),
                    namespace: (!q.namespace.is_empty()).then(|| q.namespace.clone()),
                    name: q.name.clone(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        self.reviews.fetch_add(1, Ordering::Relaxed);
        self.metrics.reviews.inc();
        let result =
            tokio::time::timeout(self.settings.timeout, self.api.create(&PostParams::default(), &review)).await;
        let error = match result {
            Ok(Ok(answer)) => {
                let status = answer.status.unwrap_or_default();
                if let Some(e) = status.evaluation_error.as_deref().filter(|e| !e.is_empty()) {
                    // RBAC answers with what it could evaluate; the decision stands.
                    tracing::debug!(error = e, "SubjectAccessReview evaluation error");
                }
                return Some(status.allowed && status.denied != Some(true));
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("timed out after {:?}", self.settings.timeout),
        };
        self.metrics.review_errors.inc();
        tracing::error!(
            user = %q.subject.user,
            verb = q.verb,
            resource = q.resource,
            namespace = %q.namespace,
            name = ?q.name,
            error = %error,
            "SubjectAccessReview failed; denying"
        );
        None
    }
}

/// Narrower questions of a batch ([`Authorizer::can_call_each`]) asked at once.
const NARROW_CONCURRENCY: usize = 16;

/// The resource a tool is granted on and the names that grant it, broadest first: a
/// function's McpTool (all of the namespace's, or this one), or an upstream server's tool.
fn grants_of(tool: &Tool) -> (&'static str, Vec<Option<String>>) {
    match &tool.upstream {
        None => (TOOLS_RESOURCE, vec![None, Some(tool.object_name.clone())]),
        Some(upstream) => (SERVERS_RESOURCE, server_names(&tool.object_name, &upstream.tool)),
    }
}

/// The resource a tool is granted on (see [`grants_of`]).
fn resource_of(tool: &Tool) -> &'static str {
    if tool.upstream.is_some() { SERVERS_RESOURCE } else { TOOLS_RESOURCE }
}

/// What an upstream server's tool or prompt `item` is granted by: all McpServers of the
/// namespace, the server, or the server's `item` alone.
fn server_names(server: &str, item: &str) -> Vec<Option<String>> {
    vec![None, Some(server.to_owned()), Some(format!("{server}/{item}"))]
}

#[async_trait]
impl Authorizer for SarAuthorizer {
    async fn can_call(&self, who: &Identity, tool: &Tool) -> crate::Result<bool> {
        let (resource, names) = grants_of(tool);
        let (answer, _) = self.first_allow(&self.subject(who), resource, &tool.namespace, names).await;
        Ok(self.record("call", answer))
    }

    /// One subject for the batch; the broadest question of each namespace (all its tools, or
    /// all its servers) asked once, and the narrower ones only for the tools it does not allow,
    /// [`NARROW_CONCURRENCY`] at a time.
    async fn can_call_each(&self, who: &Identity, tools: &[&Tool]) -> crate::Result<Decisions> {
        let subject = self.subject(who);
        let mut keys: Vec<(&'static str, String)> =
            tools.iter().map(|t| (resource_of(t), t.namespace.clone())).collect();
        keys.sort_unstable();
        keys.dedup();
        // Futures built in a loop, not in a closure over borrowed tools: `async_trait`'s `Send`
        // bound cannot be proven for such closures.
        let mut broad_questions = Vec::with_capacity(keys.len());
        for (resource, namespace) in keys {
            let question = Question { subject: subject.clone(), verb: CALL_VERB, resource, namespace, name: None };
            broad_questions.push(async move {
                let held = self.ask(&question).await;
                ((question.resource, question.namespace), held)
            });
        }
        let mut broad: Vec<((&'static str, String), Held)> =
            futures::stream::iter(broad_questions).buffer_unordered(NARROW_CONCURRENCY).collect().await;
        broad.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut narrow_questions = Vec::with_capacity(tools.len());
        for tool in tools {
            let resource = resource_of(tool);
            let decided: Held = broad
                .binary_search_by(|((r, ns), _)| (*r, ns.as_str()).cmp(&(resource, tool.namespace.as_str())))
                .map_or((None, None), |i| broad[i].1);
            let subject = &subject;
            narrow_questions.push(async move {
                // As in `first_allow`: an allow decides, a failed review denies, and after a
                // deny the narrower grants are asked.
                if decided.0 != Some(false) {
                    return decided;
                }
                let (_, mut names) = grants_of(tool);
                names.retain(Option::is_some);
                let (answer, until) = self.first_allow(subject, resource, &tool.namespace, names).await;
                (answer, both_hold(decided.1, until))
            });
        }
        let answers: Vec<Held> = futures::stream::iter(narrow_questions).buffered(NARROW_CONCURRENCY).collect().await;
        let hold_until = answers.iter().map(|(_, until)| *until).reduce(both_hold).flatten();
        let allowed = answers.into_iter().map(|(answer, _)| self.record("call", answer)).collect();
        Ok(Decisions { allowed, hold_until })
    }

    async fn can_get_prompt(&self, who: &Identity, prompt: &Prompt) -> crate::Result<bool> {
        let (resource, names) = if prompt.declared {
            (PROMPTS_RESOURCE, vec![None, Some(prompt.object_name.clone())])
        } else {
            (SERVERS_RESOURCE, server_names(&prompt.object_name, &prompt.upstream_name))
        };
        let (answer, _) = self.first_allow(&self.subject(who), resource, &prompt.namespace, names).await;
        Ok(self.record("prompt", answer))
    }

    async fn can_read_resource(&self, who: &Identity, resource: &ServedResource) -> crate::Result<bool> {
        let names = vec![None, Some(resource.object_name.clone())];
        let (answer, _) = self.first_allow(&self.subject(who), SERVERS_RESOURCE, &resource.namespace, names).await;
        Ok(self.record("resource", answer))
    }

    async fn can_create_task(&self, who: &Identity, namespace: &str) -> crate::Result<bool> {
        let question = Question {
            subject: self.subject(who),
            verb: CREATE_VERB,
            resource: TASKS_RESOURCE,
            namespace: namespace.to_owned(),
            name: None,
        };
        let (answer, _) = self.ask(&question).await;
        Ok(self.record("task", answer))
    }

    async fn can_use_model(&self, who: &Identity, namespace: &str, profile: &str) -> crate::Result<bool> {
        let question = Question {
            subject: self.subject(who),
            verb: USE_VERB,
            resource: MODEL_PROFILES_RESOURCE,
            namespace: namespace.to_owned(),
            name: Some(profile.to_owned()),
        };
        let (answer, _) = self.ask(&question).await;
        Ok(self.record("model", answer))
    }
}
