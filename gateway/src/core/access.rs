//! The access filter: the one place that decides which tools a caller sees and may use.
//!
//! A tool is usable when it is in the catalog, within the request's [`Selection`] (an MCP
//! endpoint's toolset, a coding task's tool selection) and allowed to the caller by the
//! [`Authorizer`]. A tool failing any of the three is unknown to the caller, whichever the
//! reason: listings leave it out and calls get the same "unknown tool" answer.

use std::sync::Arc;

use futures::StreamExt;
use toolyard_api::codingtask::ToolSelection;

use crate::authz::Authorizer;
use crate::catalog::{Tool, ToolCatalog};
use crate::identity::Identity;
use crate::metrics::Metrics;

/// Authorization checks run at once while filtering a listing.
const AUTHZ_CONCURRENCY: usize = 16;

/// The part of the catalog a request may reach.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    /// Only the tools of this toolset.
    pub toolset: Option<String>,
    /// Only these tools (empty: no restriction by name). Ignored when `toolset` is set.
    pub names: Vec<String>,
}

impl Selection {
    /// Every tool.
    pub fn all() -> Self {
        Self::default()
    }

    /// The tools of one toolset.
    pub fn toolset(name: impl Into<String>) -> Self {
        Self { toolset: Some(name.into()), names: Vec::new() }
    }

    /// True when `tool` is within the selection.
    pub fn contains(&self, tool: &Tool) -> bool {
        if let Some(toolset) = &self.toolset {
            return tool.spec.toolset.as_deref() == Some(toolset.as_str());
        }
        self.names.is_empty() || self.names.iter().any(|n| n == tool.name())
    }
}

impl From<&ToolSelection> for Selection {
    fn from(s: &ToolSelection) -> Self {
        Self { toolset: s.toolset.clone(), names: s.names.clone() }
    }
}

/// The access filter over a catalog and an authorizer.
#[derive(Clone)]
pub struct Access {
    catalog: Arc<dyn ToolCatalog>,
    authorizer: Arc<dyn Authorizer>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access").finish_non_exhaustive()
    }
}

impl Access {
    /// The filter over `catalog`, deciding with `authorizer`; refusals are counted in `metrics`.
    pub fn new(catalog: Arc<dyn ToolCatalog>, authorizer: Arc<dyn Authorizer>, metrics: Arc<Metrics>) -> Self {
        Self { catalog, authorizer, metrics }
    }

    /// The catalog.
    pub fn catalog(&self) -> &Arc<dyn ToolCatalog> {
        &self.catalog
    }

    /// The authorizer.
    pub fn authorizer(&self) -> &Arc<dyn Authorizer> {
        &self.authorizer
    }

    /// The tool `name` if `who` may use it within `selection`; `None` when it is unknown,
    /// outside the selection or not allowed (the three look the same).
    pub async fn resolve(&self, who: &Identity, selection: &Selection, name: &str) -> crate::Result<Option<Arc<Tool>>> {
        let Some(tool) = self.catalog.get(name).filter(|t| selection.contains(t)) else { return Ok(None) };
        if self.authorizer.can_call(who, &tool).await? {
            Ok(Some(tool))
        } else {
            self.metrics.authz_denied("call", 1);
            Ok(None)
        }
    }

    /// Every tool of the selection `who` may use, sorted by name.
    pub async fn tools(&self, who: &Identity, selection: &Selection) -> crate::Result<Vec<Arc<Tool>>> {
        let mut candidates: Vec<Arc<Tool>> =
            self.catalog.tools().into_iter().filter(|t| selection.contains(t)).collect();
        candidates.sort_by(|a, b| a.name().cmp(b.name()));
        Ok(self.visible(who, candidates, |t| Some(t.as_ref()), usize::MAX).await?.0)
    }

    /// The first `limit` of `entries` (in their order) that `who` may see, and whether entries
    /// remain after the last one returned. `tool_of` says which tool an entry stands for; an
    /// entry that stands for none (a built-in the caller already may use) is always kept.
    /// Checks run concurrently (bounded) and stop once the page is full.
    pub async fn visible<E, F>(
        &self,
        who: &Identity,
        entries: Vec<E>,
        tool_of: F,
        limit: usize,
    ) -> crate::Result<(Vec<E>, bool)>
    where
        F: Fn(&E) -> Option<&Tool>,
    {
        let total = entries.len();
        let tool_of = &tool_of;
        let mut checks = futures::stream::iter(entries)
            .map(|entry| async move {
                let allowed = match tool_of(&entry) {
                    Some(tool) => self.authorizer.can_call(who, tool).await,
                    None => Ok(true),
                };
                (entry, allowed)
            })
            .buffered(AUTHZ_CONCURRENCY);
        let mut page = Vec::new();
        let mut seen = 0;
        let mut denied = 0;
        while page.len() < limit {
            let Some((entry, allowed)) = checks.next().await else { break };
            seen += 1;
            if allowed? {
                page.push(entry);
            } else {
                denied += 1;
            }
        }
        if denied > 0 {
            self.metrics.authz_denied("list", denied);
        }
        Ok((page, seen < total))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn tool(name: &str, toolset: Option<&str>) -> Tool {
        let spec = serde_json::from_value(json!({
            "name": name, "description": "d", "inputSchema": {"type": "object"}, "toolset": toolset,
            "runtime": {"image": "i", "command": ["x"]},
        }))
        .unwrap();
        Tool::new(String::new(), name.replace('_', "-"), 1, spec).unwrap()
    }

    #[test]
    fn selections_by_name_or_toolset() {
        let price = tool("price_option", Some("pricing"));
        let fail = tool("fail", None);
        let all = Selection::all();
        assert!(all.contains(&price) && all.contains(&fail));
        let names = Selection { names: vec!["fail".into()], toolset: None };
        assert!(!names.contains(&price) && names.contains(&fail));
        let set = Selection::toolset("pricing");
        assert!(set.contains(&price) && !set.contains(&fail));
        let from_task = Selection::from(&ToolSelection { names: vec![], toolset: Some("pricing".into()) });
        assert_eq!(from_task, set);
    }
}
