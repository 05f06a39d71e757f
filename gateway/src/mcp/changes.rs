//! What a client's notification stream tells it, and how the gateway learns it: changes of
//! the catalog (`notifications/tools/list_changed`, `notifications/prompts/list_changed`) and
//! updates of the task resources it subscribed to (`notifications/resources/updated`).
//!
//! One feed serves both kinds of stream: a 2026-07-28 client's `subscriptions/listen`
//! request, and a 2025-era client's GET stream of its session ([`super::sessions`]).

use rmcp::model::{
    PromptListChangedNotification, ResourceUpdatedNotification, ResourceUpdatedNotificationParam, ServerNotification,
    ToolListChangedNotification,
};
use serde_json::Value;
use tokio::sync::watch;
use toolyard_api::OwnerKey;

use super::resources::Watcher;
use crate::state::AppState;

/// Most resources one stream may watch.
pub const MAX_RESOURCE_SUBSCRIPTIONS: usize = 100;

/// What a stream asked to be told.
#[derive(Clone, Copy, Debug, Default)]
pub struct Wants {
    /// Tool list changes.
    pub tools: bool,
    /// Prompt list changes.
    pub prompts: bool,
}

/// One stream's view of the changes.
pub struct ChangeFeed {
    wants: Wants,
    catalog: watch::Receiver<u64>,
    prompts: Vec<Value>,
    tasks: Option<watch::Receiver<u64>>,
    watcher: Watcher,
    owner: OwnerKey,
}

impl ChangeFeed {
    /// A feed for `owner`, from now on; `uris` are the resources watched from the start.
    pub async fn new(state: &AppState, owner: OwnerKey, wants: Wants, uris: &[String]) -> Self {
        let mut catalog = state.catalog.changes();
        catalog.borrow_and_update();
        let prompts = if wants.prompts { prompt_listings(state.catalog.as_ref()) } else { Vec::new() };
        let mut feed = ChangeFeed {
            wants,
            catalog,
            prompts,
            tasks: state.tasks.as_ref().map(|t| t.changes()),
            watcher: Watcher::default(),
            owner,
        };
        feed.updates(state, uris).await;
        feed
    }

    /// Waits for the next change and says what to tell the client about it (possibly
    /// nothing); `uris` are the resources watched now (a resource watched for the first time
    /// is only recorded). `None` once the catalog is gone.
    pub async fn next(&mut self, state: &AppState, uris: &[String]) -> Option<Vec<ServerNotification>> {
        let task_changed = async {
            match self.tasks.as_mut() {
                Some(rx) if !uris.is_empty() => {
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                _ => std::future::pending::<()>().await,
            }
        };
        let recheck = async {
            if uris.is_empty() {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(crate::tasks::RECHECK).await;
        };
        let mut out = Vec::new();
        tokio::select! {
            changed = self.catalog.changed() => {
                changed.ok()?;
                if self.wants.tools {
                    out.push(ServerNotification::ToolListChangedNotification(ToolListChangedNotification::default()));
                }
                // Prompts change less often than tools: told only when they did.
                if self.wants.prompts {
                    let now = prompt_listings(state.catalog.as_ref());
                    if now != self.prompts {
                        self.prompts = now;
                        out.push(ServerNotification::PromptListChangedNotification(
                            PromptListChangedNotification::default(),
                        ));
                    }
                }
            }
            () = task_changed => {}
            () = recheck => {}
        }
        out.extend(self.updates(state, uris).await);
        Some(out)
    }

    /// The updates of the resources `uris` since the last look; a resource watched for the
    /// first time is only recorded (as it is now).
    pub async fn updates(&mut self, state: &AppState, uris: &[String]) -> Vec<ServerNotification> {
        let changed = self.watcher.changed(state, &self.owner, uris).await;
        changed
            .into_iter()
            .map(|uri| {
                ServerNotification::ResourceUpdatedNotification(ResourceUpdatedNotification::new(
                    ResourceUpdatedNotificationParam::new(uri),
                ))
            })
            .collect()
    }
}

/// What a `prompts/list` shows of the catalog's prompts (before authorization): each one's
/// listing, in name order.
fn prompt_listings(catalog: &dyn crate::catalog::ToolCatalog) -> Vec<Value> {
    catalog.prompts().iter().map(|p| p.listing.clone()).collect()
}
