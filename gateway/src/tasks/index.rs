//! The watched CodingTasks of each owner, ordered by creation, so that a page of an owner's
//! tasks costs what it returns and not what the namespace holds.
//!
//! Kept beside the reflector's store, from the same watch events: an object's owner label
//! and creation time never change, so an entry is added on `Apply`, dropped on `Delete`, and
//! the whole index is rebuilt from a relist (`Init` … `InitDone`) and swapped in at its end,
//! as the store does. An owner's unfinished tasks are also kept apart, so counting them is
//! one lookup and a page of them walks past no finished one.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use kube::runtime::watcher::Event;
use toolyard_api::CodingTask;

use super::kube::phase_of;
use super::{Position, Subset};
use crate::executor::kube::OWNER_LABEL;

/// One owner's tasks.
#[derive(Debug, Default)]
struct OwnerTasks {
    /// Finished or not, by position.
    tasks: BTreeMap<Position, bool>,
    /// The positions of those not finished.
    unfinished: BTreeSet<Position>,
}

impl OwnerTasks {
    fn insert(&mut self, at: Position, finished: bool) {
        if finished {
            self.unfinished.remove(&at);
        } else {
            self.unfinished.insert(at.clone());
        }
        self.tasks.insert(at, finished);
    }

    fn remove(&mut self, at: &Position) {
        self.tasks.remove(at);
        self.unfinished.remove(at);
    }
}

type Owners = HashMap<String, OwnerTasks>;

/// Tasks by owner key, shared by the watch that fills it and the requests that read it.
#[derive(Clone, Debug, Default)]
pub struct OwnerIndex {
    owners: Arc<RwLock<Owners>>,
}

/// The index's writer: the watch task's side, holding the relist buffer.
#[derive(Debug)]
pub struct IndexWriter {
    index: OwnerIndex,
    relist: Option<Owners>,
}

/// The owner key, position and finished flag of a watched task.
fn entry(task: &CodingTask) -> Option<(String, Position, bool)> {
    let owner = task.metadata.labels.as_ref()?.get(OWNER_LABEL)?.clone();
    let name = task.metadata.name.clone()?;
    let created = task.metadata.creation_timestamp.as_ref().map(|t| t.0.as_millisecond()).unwrap_or_default();
    let finished = task.status.as_ref().is_some_and(|s| phase_of(&s.conditions).is_finished());
    Some((owner, (created, name), finished))
}

fn add(owners: &mut Owners, task: &CodingTask) {
    if let Some((owner, at, finished)) = entry(task) {
        owners.entry(owner).or_default().insert(at, finished);
    }
}

impl OwnerIndex {
    /// An empty index and its writer.
    pub fn new() -> (Self, IndexWriter) {
        let index = Self::default();
        (index.clone(), IndexWriter { index, relist: None })
    }

    /// Up to `limit` positions of `owner`'s tasks (of `subset`) older than `before` (from the
    /// newest when `None`), newest first.
    pub fn newest(&self, owner: &str, subset: Subset, before: Option<&Position>, limit: usize) -> Vec<Position> {
        let owners = self.owners.read().unwrap_or_else(|e| e.into_inner());
        let Some(tasks) = owners.get(owner) else { return Vec::new() };
        let take = |it: &mut dyn DoubleEndedIterator<Item = &Position>| it.rev().take(limit).cloned().collect();
        match (subset, before) {
            (Subset::All, Some(at)) => take(&mut tasks.tasks.range(..at.clone()).map(|(p, _)| p)),
            (Subset::All, None) => take(&mut tasks.tasks.keys()),
            (Subset::Unfinished, Some(at)) => take(&mut tasks.unfinished.range(..at.clone())),
            (Subset::Unfinished, None) => take(&mut tasks.unfinished.iter()),
        }
    }

    /// How many of `owner`'s tasks have not finished.
    pub fn unfinished(&self, owner: &str) -> usize {
        self.owners.read().unwrap_or_else(|e| e.into_inner()).get(owner).map_or(0, |t| t.unfinished.len())
    }
}

impl IndexWriter {
    /// Applies one watch event (after the reflector's store has).
    pub fn apply(&mut self, event: &Event<CodingTask>) {
        match event {
            Event::Apply(task) => add(&mut self.index.owners.write().unwrap_or_else(|e| e.into_inner()), task),
            Event::Delete(task) => {
                if let Some((owner, at, _)) = entry(task) {
                    let mut owners = self.index.owners.write().unwrap_or_else(|e| e.into_inner());
                    if let Some(tasks) = owners.get_mut(&owner) {
                        tasks.remove(&at);
                        if tasks.tasks.is_empty() {
                            owners.remove(&owner);
                        }
                    }
                }
            }
            Event::Init => self.relist = Some(Owners::new()),
            Event::InitApply(task) => add(self.relist.get_or_insert_with(Owners::new), task),
            Event::InitDone => {
                let fresh = self.relist.take().unwrap_or_default();
                *self.index.owners.write().unwrap_or_else(|e| e.into_inner()) = fresh;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use kube::api::ObjectMeta;
    use toolyard_api::CodingTaskStatus;
    use toolyard_api::conditions;

    use super::*;

    fn task(owner: &str, name: &str, created_s: i64, finished: bool) -> CodingTask {
        let conditions = if finished { vec![conditions::succeeded("done", None)] } else { Vec::new() };
        CodingTask {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some([(OWNER_LABEL.to_owned(), owner.to_owned())].into()),
                creation_timestamp: Some(Time(jiff::Timestamp::from_second(created_s).unwrap())),
                ..ObjectMeta::default()
            },
            spec: serde_json::from_value(serde_json::json!({"prompt": "p", "owner": {"issuer": "i", "user": owner}}))
                .expect("spec"),
            status: Some(CodingTaskStatus { conditions, ..CodingTaskStatus::default() }),
        }
    }

    fn names(positions: Vec<Position>) -> Vec<String> {
        positions.into_iter().map(|(_, n)| n).collect()
    }

    #[test]
    fn pages_come_newest_first_per_owner_and_counts_follow_the_events() {
        let (index, mut writer) = OwnerIndex::new();
        writer.apply(&Event::Init);
        for (i, owner) in ["a", "b", "a", "a"].iter().enumerate() {
            writer.apply(&Event::InitApply(task(owner, &format!("t{i}"), i as i64, false)));
        }
        assert!(index.newest("a", Subset::All, None, 10).is_empty(), "a relist shows nothing before it is done");
        writer.apply(&Event::InitDone);
        assert_eq!(names(index.newest("a", Subset::All, None, 10)), ["t3", "t2", "t0"]);
        assert_eq!(names(index.newest("a", Subset::All, None, 2)), ["t3", "t2"]);
        assert_eq!(names(index.newest("a", Subset::All, Some(&(2_000, "t2".into())), 10)), ["t0"]);
        assert_eq!(names(index.newest("b", Subset::All, None, 10)), ["t1"]);
        assert!(index.newest("nobody", Subset::All, None, 10).is_empty());
        assert_eq!(index.unfinished("a"), 3);

        // A status change finishes one (applied twice: counted once); a deletion drops one.
        writer.apply(&Event::Apply(task("a", "t2", 2, true)));
        writer.apply(&Event::Apply(task("a", "t2", 2, true)));
        assert_eq!(index.unfinished("a"), 2);
        assert_eq!(names(index.newest("a", Subset::Unfinished, None, 10)), ["t3", "t0"]);
        assert_eq!(names(index.newest("a", Subset::Unfinished, Some(&(3_000, "t3".into())), 10)), ["t0"]);
        writer.apply(&Event::Delete(task("a", "t3", 3, false)));
        assert_eq!(
            (names(index.newest("a", Subset::All, None, 10)), index.unfinished("a")),
            (vec!["t2".into(), "t0".into()], 1)
        );
        writer.apply(&Event::Delete(task("b", "t1", 1, false)));
        assert_eq!(index.unfinished("b"), 0);

        // A relist replaces everything at its end.
        writer.apply(&Event::Init);
        writer.apply(&Event::InitApply(task("c", "t9", 9, false)));
        writer.apply(&Event::InitDone);
        assert!(index.newest("a", Subset::All, None, 10).is_empty());
        assert_eq!(names(index.newest("c", Subset::All, None, 10)), ["t9"]);
    }
}
