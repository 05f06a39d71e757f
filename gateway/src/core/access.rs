//! The access filter: the one place that decides which tools a caller sees and may use.
//!
//! A tool is usable when it is in the catalog, within the request's [`Selection`] (an MCP
//! endpoint's toolset, a coding task's tool selection) and allowed to the caller by the
//! [`Authorizer`]. A tool failing any of the three is unknown to the caller, whichever the
//! reason: listings leave it out and calls get the same "unknown tool" answer.
//!
//! Listings keep what they learn: for each caller, the decisions made over the current
//! catalog snapshot, by position, for as long as the authorizer says all of them hold
//! ([`Decisions::hold_until`]: the earliest expiry of the decisions they came from). A
//! listing walks the catalog testing a bit per tool, and asks the authorizer only about the
//! tools not decided yet. A new catalog snapshot starts over.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Instant;

use toolyard_api::codingtask::ToolSelection;

use crate::auth::cache::TtlCache;
use crate::authz::{Authorizer, Decisions};
use crate::catalog::{Tool, ToolCatalog};
use crate::identity::Identity;
use crate::metrics::Metrics;

/// Fewest and most entries decided in one batch while filtering a listing.
const MIN_BATCH: usize = 16;
const MAX_BATCH: usize = 256;
/// Callers whose decisions are kept at once (each: two bits per catalog tool). Beyond it the
/// kept decisions are dropped and asked again, from the authorizer's own cache.
const MAX_KEPT_CALLERS: usize = 4_096;

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
    pub fn of<'a>(&'a self, catalog: &'a [Arc<Tool>]) -> impl Iterator<Item = &'a Arc<Tool>> + Send + 'a {
        catalog.iter().filter(|t| self.contains(t))
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

/// One caller's decisions over one catalog snapshot, by position in it.
struct Kept {
    /// The snapshot (its identity only: this does not keep it).
    catalog: Weak<[Arc<Tool>]>,
    /// Bit `i`: the tool at position `i` is decided.
    decided: Vec<u64>,
    /// Bit `i`: the tool at position `i` is allowed.
    allowed: Vec<u64>,
    /// When the first of the decisions kept expires.
    until: Instant,
}

impl Kept {
    fn new(catalog: &Arc<[Arc<Tool>]>, until: Instant) -> Self {
        let words = catalog.len().div_ceil(64);
        Self { catalog: Arc::downgrade(catalog), decided: vec![0; words], allowed: vec![0; words], until }
    }

    /// True while these decisions are about `catalog` and all of them hold.
    fn holds_for(&self, catalog: &Arc<[Arc<Tool>]>, now: Instant) -> bool {
        std::ptr::addr_eq(self.catalog.as_ptr(), Arc::as_ptr(catalog)) && self.until > now
    }

    fn get(&self, i: usize) -> Option<bool> {
        let (word, bit) = (i / 64, 1u64 << (i % 64));
        (self.decided[word] & bit != 0).then_some(self.allowed[word] & bit != 0)
    }

    fn set(&mut self, i: usize, allowed: bool) {
        let (word, bit) = (i / 64, 1u64 << (i % 64));
        self.decided[word] |= bit;
        if allowed {
            self.allowed[word] |= bit;
        } else {
            self.allowed[word] &= !bit;
        }
    }
}

type SharedKept = Arc<Mutex<Kept>>;

fn lock(kept: &SharedKept) -> std::sync::MutexGuard<'_, Kept> {
    // Bits only: a panic while holding the lock leaves nothing half-done that matters.
    kept.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where `tool` (that very object) is in `catalog`, looked for at `hint` first: a walk in the
/// catalog's order finds each next tool there or a little after.
fn position(catalog: &[Arc<Tool>], tool: &Tool, hint: &mut usize) -> Option<usize> {
    let is_at = |i: usize| catalog.get(i).is_some_and(|t| std::ptr::eq(t.as_ref(), tool));
    let i = if is_at(*hint) {
        *hint
    } else {
        catalog.binary_search_by(|t| t.name().cmp(tool.name())).ok().filter(|&i| is_at(i))?
    };
    *hint = i + 1;
    Some(i)
}

/// The access filter over a catalog and an authorizer.
#[derive(Clone)]
pub struct Access {
    catalog: Arc<dyn ToolCatalog>,
    authorizer: Arc<dyn Authorizer>,
    metrics: Arc<Metrics>,
    /// Each caller's decisions kept by listings (see the module docs).
    kept: Arc<TtlCache<Identity, SharedKept>>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access").finish_non_exhaustive()
    }
}

impl Access {
    /// The filter over `catalog`, deciding with `authorizer`; refusals are counted in `metrics`.
    pub fn new(catalog: Arc<dyn ToolCatalog>, authorizer: Arc<dyn Authorizer>, metrics: Arc<Metrics>) -> Self {
        Self { catalog, authorizer, metrics, kept: Arc::new(TtlCache::new(MAX_KEPT_CALLERS)) }
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
        let (visible, _) = self.visible(who, selection.of(&catalog), |t| Some(t.as_ref()), usize::MAX).await?;
        Ok(visible.into_iter().cloned().collect())
    }

    /// The first `limit` of `entries` (in their order) that `who` may see, and whether entries
    /// remain after the last one returned. `tool_of` says which tool an entry stands for; an
    /// entry that stands for none (a built-in the caller already may use) is always kept.
    ///
    /// `entries` is walked no further than the page needs, so a page costs what it walks, not
    /// the size of the catalog. A tool decided by an earlier listing of `who` over the same
    /// catalog snapshot is not asked again while that decision holds (see the module docs).
    /// The others are decided a batch at a time ([`Authorizer::can_call_each`]): the first as
    /// large as the page, each next one twice the last (at least [`MIN_BATCH`], at most
    /// [`MAX_BATCH`]), until the page is full.
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
        let catalog = self.catalog.tools();
        let mut kept = self.kept.get(who).filter(|k| lock(k).holds_for(&catalog, Instant::now()));
        let mut hint = 0;
        let mut entries = entries.into_iter().peekable();
        let mut page = Vec::new();
        let mut denied = 0;
        let mut more = false;
        let mut size = limit.clamp(MIN_BATCH, MAX_BATCH);
        while page.len() < limit && entries.peek().is_some() {
            let batch: Vec<E> = entries.by_ref().take(size).collect();
            // Each entry's decision where it is known; the tools to ask about, with their
            // positions in the snapshot (`None`: not in it, so not to be kept).
            let mut known = Vec::with_capacity(batch.len());
            let (mut ask, mut ask_at) = (Vec::new(), Vec::new());
            {
                let kept = kept.as_ref().map(lock);
                for entry in &batch {
                    let Some(tool) = tool_of(entry) else {
                        known.push(Some(true));
                        continue;
                    };
                    let at = position(&catalog, tool, &mut hint);
                    let decided = at.zip(kept.as_ref()).and_then(|(i, kept)| kept.get(i));
                    known.push(decided);
                    if decided.is_none() {
                        ask.push(tool);
                        ask_at.push(at);
                    }
                }
            }
            let mut answers = Vec::new().into_iter();
            if !ask.is_empty() {
                let decisions = self.authorizer.can_call_each(who, &ask).await?;
                drop(ask);
                self.keep(who, &catalog, &mut kept, &ask_at, &decisions);
                answers = decisions.allowed.into_iter();
            }
            for (entry, decided) in batch.into_iter().zip(known) {
                let allowed = decided.or_else(|| answers.next()).unwrap_or(false);
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

    /// Keeps `decisions` of the tools at `positions` of `catalog` for `who`, in `kept` (made
    /// when there is none yet), while they hold.
    fn keep(
        &self,
        who: &Identity,
        catalog: &Arc<[Arc<Tool>]>,
        kept: &mut Option<SharedKept>,
        positions: &[Option<usize>],
        decisions: &Decisions,
    ) {
        let now = Instant::now();
        let Some(until) = decisions.hold_until.filter(|until| *until > now) else { return };
        let kept = kept.get_or_insert_with(|| {
            let new = Arc::new(Mutex::new(Kept::new(catalog, until)));
            self.kept.insert(who.clone(), new.clone(), until - now);
            new
        });
        let mut kept = lock(kept);
        kept.until = kept.until.min(until);
        for (at, allowed) in positions.iter().zip(&decisions.allowed) {
            if let Some(i) = at {
                kept.set(*i, *allowed);
            }
        }
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

    /// Allows the tools whose name ends in 0 and records the batches it is asked; its
    /// answers hold for `.1` (`None`: not to be reused).
    #[derive(Default)]
    struct EveryTenth(Mutex<Vec<usize>>, Option<std::time::Duration>);

    impl EveryTenth {
        fn asked(&self) -> usize {
            self.0.lock().unwrap().iter().sum()
        }
    }

    #[async_trait::async_trait]
    impl Authorizer for EveryTenth {
        async fn can_call(&self, _: &Identity, tool: &Tool) -> crate::Result<bool> {
            Ok(tool.name().ends_with('0'))
        }
        async fn can_call_each(&self, who: &Identity, tools: &[&Tool]) -> crate::Result<Decisions> {
            self.0.lock().unwrap().push(tools.len());
            let mut allowed = Vec::new();
            for tool in tools {
                allowed.push(self.can_call(who, tool).await?);
            }
            Ok(Decisions { allowed, hold_until: self.1.map(|hold| Instant::now() + hold) })
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

    struct Fixed(Mutex<Arc<[Arc<Tool>]>>, tokio::sync::watch::Sender<u64>);

    impl Fixed {
        fn new(tools: &[Arc<Tool>]) -> Self {
            Self(Mutex::new(tools.into()), tokio::sync::watch::channel(0).0)
        }
    }

    impl ToolCatalog for Fixed {
        fn tools(&self) -> Arc<[Arc<Tool>]> {
            self.0.lock().unwrap().clone()
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
        let catalog: Arc<dyn ToolCatalog> = Arc::new(Fixed::new(&tools));
        let access = Access::new(catalog, authorizer.clone(), Arc::new(Metrics::new()));
        let who = Identity { issuer: "apikey".into(), user: "u".into(), groups: vec![], scopes: vec![] };

        let (page, more) = access.visible(&who, tools.iter().cloned(), |t| Some(t.as_ref()), 10).await.unwrap();
        let names: Vec<&str> = page.iter().map(|t| t.name()).collect();
        assert_eq!(names[..3], ["tool_0000", "tool_0010", "tool_0020"]);
        assert_eq!(names.len(), 10);
        assert!(more);
        let asked = authorizer.asked();
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

    fn tools(n: usize) -> Vec<Arc<Tool>> {
        (0..n).map(|k| Arc::new(tool(&format!("tool_{k:04}"), None))).collect()
    }

    #[tokio::test]
    async fn listings_reuse_a_callers_decisions_while_they_hold_and_not_across_catalogs() {
        let tools = tools(1000);
        let authorizer = Arc::new(EveryTenth(Mutex::default(), Some(std::time::Duration::from_secs(60))));
        let catalog = Arc::new(Fixed::new(&tools));
        let access = Access::new(catalog.clone(), authorizer.clone(), Arc::new(Metrics::new()));
        let alice = Identity { issuer: "apikey".into(), user: "alice".into(), groups: vec![], scopes: vec![] };
        let page = |who: Identity, after: usize, limit| {
            let (access, tools) = (access.clone(), tools.clone());
            async move {
                let (page, _) =
                    access.visible(&who, tools[after..].iter().cloned(), |t| Some(t.as_ref()), limit).await.unwrap();
                page.iter().map(|t| t.name().to_owned()).collect::<Vec<_>>()
            }
        };

        let first = page(alice.clone(), 0, 10).await;
        assert_eq!(first.len(), 10);
        // Batches of 16, 32 and 64: tools 0 to 111.
        assert_eq!(authorizer.asked(), 112);
        assert_eq!(page(alice.clone(), 0, 10).await, first);
        assert_eq!(authorizer.asked(), 112, "the same page again asks nothing");
        // A page from tool 50 walks batches of 20, 40, 80 and 160 (tools 50 to 349) and asks
        // only about the tools not decided yet: 112 to 349.
        let second = page(alice.clone(), 50, 20).await;
        assert_eq!(second[..2], ["tool_0050", "tool_0060"]);
        assert_eq!(second.len(), 20);
        assert_eq!(authorizer.asked(), 350, "each tool asked about once");
        // Everything decided once, then listed for nothing.
        let all = access.tools(&alice, &Selection::all()).await.unwrap();
        assert_eq!(all.len(), 100);
        let asked = authorizer.asked();
        assert_eq!(asked, 1000, "each tool asked about once");
        assert_eq!(access.tools(&alice, &Selection::all()).await.unwrap().len(), 100);
        assert_eq!(authorizer.asked(), asked);

        // Another caller has decisions of their own.
        let bob = Identity { user: "bob".into(), ..alice.clone() };
        assert_eq!(page(bob, 0, 10).await, first);
        assert!(authorizer.asked() > asked, "bob is asked about");

        // A new catalog snapshot (the same tools) starts over.
        *catalog.0.lock().unwrap() = tools.clone().into();
        let asked = authorizer.asked();
        assert_eq!(page(alice.clone(), 0, 10).await, first);
        assert!(authorizer.asked() > asked, "asked again after the catalog changed");
    }

    #[tokio::test]
    async fn decisions_that_do_not_hold_are_asked_again() {
        let tools = tools(100);
        let who = Identity { issuer: "apikey".into(), user: "alice".into(), groups: vec![], scopes: vec![] };
        for hold in [None, Some(std::time::Duration::ZERO), Some(std::time::Duration::from_millis(20))] {
            let authorizer = Arc::new(EveryTenth(Mutex::default(), hold));
            let access = Access::new(Arc::new(Fixed::new(&tools)), authorizer.clone(), Arc::new(Metrics::new()));
            let list = || access.visible(&who, tools.iter().cloned(), |t| Some(t.as_ref()), 5);
            let first = list().await.unwrap().0.len();
            let asked = authorizer.asked();
            if hold.is_some_and(|h| !h.is_zero()) {
                tokio::time::sleep(std::time::Duration::from_millis(30)).await;
            }
            assert_eq!(list().await.unwrap().0.len(), first);
            assert_eq!(authorizer.asked(), 2 * asked, "{hold:?}: asked again");
        }
    }
}
