//! What a client's notification stream tells it, and how the gateway learns it: changes of
//! the catalog (`notifications/tools/list_changed`, `notifications/prompts/list_changed`) and
//! updates of the resources it subscribed to (`notifications/resources/updated`): task
//! resources, which the gateway watches in storage, and upstream servers' resources, which
//! the replica holding the stream subscribes to on its own connection to the server (once
//! however many of its streams watch one).
//!
//! One feed serves both kinds of stream: a 2026-07-28 client's `subscriptions/listen`
//! request, and a 2025-era client's GET stream of its session ([`super::sessions`]).

use std::collections::HashMap;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use rmcp::model::{
    PromptListChangedNotification, ResourceUpdatedNotification, ResourceUpdatedNotificationParam, ServerNotification,
    ToolListChangedNotification,
};
use serde_json::Value;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;

use super::Scope;
use super::handler::McpHandler;
use super::resources::{TaskResource, Watcher};
use crate::catalog::ResourceSource;
use crate::identity::Identity;

/// Most resources one stream may watch.
pub const MAX_RESOURCE_SUBSCRIPTIONS: usize = 100;

/// Upstream resource updates that may wait for a stream that is slow to send them.
const UPSTREAM_UPDATES: usize = 16;

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
    handler: McpHandler,
    who: Identity,
    scope: Scope,
    wants: Wants,
    catalog: watch::Receiver<u64>,
    prompts: Vec<Value>,
    tasks: Option<watch::Receiver<u64>>,
    watcher: Watcher,
    /// The URIs watched at the last look.
    watched: Vec<String>,
    /// The upstream resources watched, each passing its server's updates of it on.
    upstream: HashMap<String, Watching>,
    upstream_updates: (mpsc::Sender<String>, mpsc::Receiver<String>),
}

/// Passes one upstream resource's updates on while held; unsubscribes when dropped.
struct Watching(JoinHandle<()>);

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Ends one subscription when dropped (with the task that held it).
struct Unsubscribe(Arc<dyn ResourceSource>, String);

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        self.0.unsubscribe(&self.1);
    }
}

impl ChangeFeed {
    /// A feed for `who` through `scope`, from now on; `uris` are the resources watched from
    /// the start.
    pub async fn new(handler: &McpHandler, who: &Identity, scope: Scope, wants: Wants, uris: &[String]) -> Self {
        let state = handler.state();
        let mut catalog = state.catalog.changes();
        catalog.borrow_and_update();
        let prompts = if wants.prompts { prompt_listings(state.catalog.as_ref()) } else { Vec::new() };
        let mut feed = ChangeFeed {
            handler: handler.clone(),
            who: who.clone(),
            scope,
            wants,
            catalog,
            prompts,
            tasks: state.tasks.as_ref().map(|t| t.changes()),
            watcher: Watcher::default(),
            watched: Vec::new(),
            upstream: HashMap::new(),
            upstream_updates: mpsc::channel(UPSTREAM_UPDATES),
        };
        feed.updates(uris).await;
        feed
    }

    /// Waits for the next change and says what to tell the client about it (possibly
    /// nothing); `uris` are the resources watched now (a resource watched for the first time
    /// is only recorded). `None` once the catalog is gone.
    pub async fn next(&mut self, uris: &[String]) -> Option<Vec<ServerNotification>> {
        let watches_tasks = uris.iter().any(|u| TaskResource::parse(u).is_some());
        let task_changed = async {
            match self.tasks.as_mut() {
                Some(rx) if watches_tasks => {
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
                _ => std::future::pending::<()>().await,
            }
        };
        let recheck = async {
            if !watches_tasks {
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
                    let now = prompt_listings(self.handler.state().catalog.as_ref());
                    if now != self.prompts {
                        self.prompts = now;
                        out.push(ServerNotification::PromptListChangedNotification(
                            PromptListChangedNotification::default(),
                        ));
                    }
                }
            }
            Some(uri) = self.upstream_updates.1.recv() => {
                out.push(updated(uri));
                while let Ok(uri) = self.upstream_updates.1.try_recv() {
                    out.push(updated(uri));
                }
            }
            () = task_changed => {}
            () = recheck => {}
        }
        out.extend(self.updates(uris).await);
        Some(out)
    }

    /// The notifications for `uris` as they come, until the catalog is gone or the gateway
    /// stops.
    pub fn into_stream(self, uris: Vec<String>) -> impl Stream<Item = ServerNotification> + Send + 'static {
        let shutdown = self.handler.state().shutdown.clone();
        futures::stream::unfold((self, uris), |(mut feed, uris)| async move {
            let batch = feed.next(&uris).await?;
            Some((futures::stream::iter(batch), (feed, uris)))
        })
        .flatten()
        .take_until(shutdown.cancelled_owned())
    }

    /// The updates of the task resources among `uris` since the last look (a resource watched
    /// for the first time is only recorded, as it is now); when `uris` changed, the upstream
    /// resources among them are watched from now on, and those no longer among them not.
    pub async fn updates(&mut self, uris: &[String]) -> Vec<ServerNotification> {
        if uris != self.watched.as_slice() {
            self.upstream.retain(|uri, _| uris.contains(uri));
            for uri in uris.iter().filter(|u| TaskResource::parse(u).is_none()) {
                if !self.upstream.contains_key(uri)
                    && let Some(watching) = self.watch_upstream(uri).await
                {
                    self.upstream.insert(uri.clone(), watching);
                }
            }
            self.watched = uris.to_vec();
        }
        let state = self.handler.state();
        let changed = self.watcher.changed(state, &self.who.owner_key(), uris).await;
        changed.into_iter().map(updated).collect()
    }

    /// Subscribes to the upstream resource `uri` on the server serving it to the caller, and
    /// passes its updates on. `None` when no server serves it to the caller or the server
    /// refuses.
    async fn watch_upstream(&self, uri: &str) -> Option<Watching> {
        let resource = match self.handler.serving(&self.who, &self.scope, uri).await {
            Ok(Some(resource)) => resource,
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(error = %e.message, "authorizing a resource subscription failed");
                return None;
            }
        };
        let source = resource.source.clone();
        let mut updates = match source.subscribe(uri).await {
            Ok(updates) => updates,
            Err(e) => {
                tracing::info!(error = %e, "a resource subscription was refused by its server");
                return None;
            }
        };
        let (out, uri) = (self.upstream_updates.0.clone(), uri.to_owned());
        Some(Watching(tokio::spawn(async move {
            let _unsubscribe = Unsubscribe(source, uri.clone());
            loop {
                match updates.recv().await {
                    Ok(updated) if updated != uri => continue,
                    // Too far behind: it may have been updated.
                    Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => return,
                }
                if out.send(uri.clone()).await.is_err() {
                    return;
                }
            }
        })))
    }
}

fn updated(uri: String) -> ServerNotification {
    ServerNotification::ResourceUpdatedNotification(ResourceUpdatedNotification::new(
        ResourceUpdatedNotificationParam::new(uri),
    ))
}

/// What a `prompts/list` shows of the catalog's prompts (before authorization): each one's
/// listing, in name order.
fn prompt_listings(catalog: &dyn crate::catalog::ToolCatalog) -> Vec<Value> {
    catalog.prompts().iter().map(|p| p.listing.clone()).collect()
}
