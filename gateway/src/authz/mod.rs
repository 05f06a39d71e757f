//! Authorization: may this identity call this tool, start a coding task, or use a model
//! profile for its tasks?
//!
//! Kubernetes: SubjectAccessReview (verb `call` on `mcptools`, verb `create` on
//! `codingtasks`, verb `use` on `modelprofiles`), see [`sar`]. Embedded mode: a static policy file with the same meaning,
//! see [`policy`]. Default deny. [`config::AuthzArgs`] picks one from flags.

use std::time::Instant;

use async_trait::async_trait;

use crate::catalog::{Prompt, ServedResource, Tool};
use crate::identity::Identity;

pub mod config;
pub mod metrics;
pub mod policy;
pub mod sar;
pub mod subject;

pub use config::{AuthzArgs, AuthzMode};
pub use metrics::AuthzMetrics;
pub use policy::PolicyAuthorizer;
pub use sar::{SarAuthorizer, SarSettings};
pub use subject::SubjectMapping;

/// The answers of [`Authorizer::can_call_each`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decisions {
    /// Whether each tool is allowed, in the order asked.
    pub allowed: Vec<bool>,
    /// Until when every answer holds, so that a caller may reuse it instead of asking again:
    /// the earliest expiry of the decisions it came from. `None`: not to be reused (a review
    /// failed, or the authorizer keeps no decisions).
    pub hold_until: Option<Instant>,
}

/// Authorization decisions.
#[async_trait]
pub trait Authorizer: Send + Sync + 'static {
    /// May `who` list and call `tool`?
    async fn can_call(&self, who: &Identity, tool: &Tool) -> crate::Result<bool>;
    /// [`Authorizer::can_call`] for each of `tools`, in order. Listings ask this way, so that
    /// an authorizer can share the work of one caller's decisions (by default: one by one,
    /// not to be reused).
    async fn can_call_each(&self, who: &Identity, tools: &[&Tool]) -> crate::Result<Decisions> {
        let mut allowed = Vec::with_capacity(tools.len());
        for tool in tools {
            allowed.push(self.can_call(who, tool).await?);
        }
        Ok(Decisions { allowed, hold_until: None })
    }
    /// May `who` list and get `prompt` (an upstream server's, decided like its tools; a
    /// declared one by `call` on its McpPrompt)?
    async fn can_get_prompt(&self, who: &Identity, prompt: &Prompt) -> crate::Result<bool>;
    /// May `who` list and read `resource` (of an upstream server: whoever may use the whole
    /// server)?
    async fn can_read_resource(&self, who: &Identity, resource: &ServedResource) -> crate::Result<bool>;
    /// May `who` start a coding task in `namespace` (empty in embedded mode)?
    async fn can_create_task(&self, who: &Identity, namespace: &str) -> crate::Result<bool>;
    /// May `who`'s coding tasks in `namespace` use the model profile `profile`?
    async fn can_use_model(&self, who: &Identity, namespace: &str, profile: &str) -> crate::Result<bool>;
}
