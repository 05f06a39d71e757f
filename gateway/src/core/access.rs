//! The access filter: the one place that decides which tools a caller sees and may use.
//!
//! A tool is usable when it is in the catalog, within the request's [`Selection`] (an MCP
//! endpoint's toolset, a coding task's tool selection) and allowed to the caller by the
//! [`Authorizer`]. A tool failing any of the three is unknown to the caller, whichever the
//! reason: listings leave it out and calls get the same "unknown tool" answer.

use std::sync::Arc;

use toolyard_api::codingtask::ToolSelection;

use crate::authz::Authorizer;
use crate::catalog::{Tool, ToolCatalog};
use crate::identity::Identity;
use crate::metrics::Metrics;

/// Fewest and most entries decided in one batch while filtering a listing.
const MIN_BATCH: usize = 16;
const MAX_BATCH: usize = 256;

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

    /// The tools of `catalog` within the selection, in its order.
    pub fn of<'a>(&'a self, catalog: &'a [Arc<Tool>]) -> impl Iterator<Item = Arc<Tool>> + Send + 'a {
        catalog.iter().filter(|t| self.contains(t)).cloned()
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
        let catalog = self.catalog.tools();
        Ok(self.visible(who, selection.of(&catalog), |t| Some(t.as_ref()), usize::MAX).await?.0)
    }

    /// The first `limit` of `entries` (in their order) that `who` may see, and whether entries
    /// remain after the last one returned. `tool_of` says which tool an entry stands for; an
    /// entry that stands for none (a built-in the caller already may use) is always kept.
    ///
    /// `entries` is walked no further than the page needs, so a page costs what it walks, not
    /// the size of the catalog. Entries are decided a batch at a time
    /// ([`Authorizer::can_call_each`]): the first as large as the page, each next one twice the
    /// last (at least [`MIN_BATCH`], at most [`MAX_BATCH`]), until the page is full.
    pub async fn visible<E, F>(
        &self,
        who: &Identity,
        entries: impl IntoIterator<Item = E>,
        tool_of: F,
        limit: usize,
    ) -> crate::Result<(Vec<E>, bool)>
    where
        F: Fn(&E) -> Option<&Tool>,
    {
        let mut entries = entries.into_iter().peekable();
        let mut page = Vec::new();
        let mut denied = 0;
        let mut more = false;
        let mut size = limit.clamp(MIN_BATCH, MAX_BATCH);
        while page.len() < limit && entries.peek().is_some() {
            let batch: Vec<E> = entries.by_ref().take(size).collect();
            let tools: Vec<&Tool> = batch.iter().filter_map(&tool_of).collect();
            let mut decisions = self.authorizer.can_call_each(who, &tools).await?.into_iter();
            drop(tools);
            for entry in batch {
                let allowed = tool_of(&entry).is_none() || decisions.next().unwrap_or(false);
                if page.len() == limit {
                    more = true;
                    break;
                }
                if allowed {
                    page.push(entry);
                } else {
                    denied += 1;
                }
            }
            size = (size * 2).min(MAX_BATCH);
        }
        if denied > 0 {
            self.metrics.authz_denied("list", denied);
        }
        Ok((page, more || entries.peek().is_some()))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::json;

    use super::*;
    use crate::catalog::{Prompt, ServedResource};

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

    /// Allows the tools whose name ends in 0 and records the batches it is asked.
    #[derive(Default)]
    struct EveryTenth(Mutex<Vec<usize>>);

    #[async_trait::async_trait]
    impl Authorizer for EveryTenth {
        async fn can_call(&self, _: &Identity, tool: &Tool) -> crate::Result<bool> {
            Ok(tool.name().ends_with('0'))
        }
        async fn can_call_each(&self, who: &Identity, tools: &[&Tool]) -> crate::Result<Vec<bool>> {
            self.0.lock().unwrap().push(tools.len());
            let mut allowed = Vec::new();
            for tool in tools {
                allowed.push(self.can_call(who, tool).await?);
            }
            Ok(allowed)
        }
        async fn can_get_prompt(&self, _: &Identity, _: &Prompt) -> crate::Result<bool> {
            Ok(false)
        }
        async fn can_read_resource(&self, _: &Identity, _: &ServedResource) -> crate::Result<bool> {
            Ok(false)
        }
        async fn can_create_task(&self, _: &Identity, _: &str) -> crate::Result<bool> {
            Ok(false)
        }
        async fn can_use_model(&self, _: &Identity, _: &str, _: &str) -> crate::Result<bool> {
            Ok(false)
        }
    }

    struct Fixed(Arc<[Arc<Tool>]>, tokio::sync::watch::Sender<u64>);

    impl ToolCatalog for Fixed {
        fn tools(&self) -> Arc<[Arc<Tool>]> {
            self.0.clone()
        }
        fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
            self.1.subscribe()
        }
        fn is_synced(&self) -> bool {
            true
        }
    }

    #[tokio::test]
    async fn a_page_walks_the_entries_no_further_than_it_needs() {
        let tools: Vec<Arc<Tool>> = (0..1000).map(|k| Arc::new(tool(&format!("tool_{k:04}"), None))).collect();
        let authorizer = Arc::new(EveryTenth::default());
        let catalog: Arc<dyn ToolCatalog> = Arc::new(Fixed(tools.clone().into(), tokio::sync::watch::channel(0).0));
        let access = Access::new(catalog, authorizer.clone(), Arc::new(Metrics::new()));
        let who = Identity { issuer: "apikey".into(), user: "u".into(), groups: vec![], scopes: vec![] };

        let (page, more) = access.visible(&who, tools.iter().cloned(), |t| Some(t.as_ref()), 10).await.unwrap();
        let names: Vec<&str> = page.iter().map(|t| t.name()).collect();
        assert_eq!(names[..3], ["tool_0000", "tool_0010", "tool_0020"]);
        assert_eq!(names.len(), 10);
        assert!(more);
        let asked: usize = authorizer.0.lock().unwrap().iter().sum();
        assert!(asked < 200, "10 allowed in every 100 entries, asked about {asked}");
        assert_eq!(authorizer.0.lock().unwrap()[..3], [16, 32, 64], "batches double from the page size");

        // Entries without a tool (built-ins) are kept undecided; the last page says there is no more.
        let entries = tools[990..].iter().map(|t| Some(t.clone())).chain([None, None]);
        let (page, more) = access.visible(&who, entries, |e| e.as_deref(), 10).await.unwrap();
        assert_eq!(page.len(), 3);
        assert!(!more);
        let all = access.tools(&who, &Selection::all()).await.unwrap();
        assert_eq!(all.len(), 100);
    }
}
