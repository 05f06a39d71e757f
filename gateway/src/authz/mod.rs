//! Authorization: may this identity call this tool, or start a coding task?
//!
//! Kubernetes: SubjectAccessReview (verb `call` on `mcptools`, verb `create` on
//! `codingtasks`). Embedded mode: a static policy file with the same meaning. Default deny.

use async_trait::async_trait;

use crate::catalog::Tool;
use crate::identity::Identity;

/// Authorization decisions.
#[async_trait]
pub trait Authorizer: Send + Sync + 'static {
    /// May `who` list and call `tool`?
    async fn can_call(&self, who: &Identity, tool: &Tool) -> crate::Result<bool>;
    /// May `who` start a coding task in `namespace` (empty in embedded mode)?
    async fn can_create_task(&self, who: &Identity, namespace: &str) -> crate::Result<bool>;
}
