//! Artifact storage: an S3 bucket or a local folder, always addressed through an owner.
//!
//! Every method takes the [`OwnerKey`] (derived from an identity or a runner token's claims,
//! never from client input) and a path relative to that owner's prefix. Implementations
//! build keys with [`owner_key_path`], which refuses traversal, so no call can reach
//! outside the owner's prefix.

use async_trait::async_trait;
use bytes::Bytes;
use toolyard_api::OwnerKey;

pub mod events;
pub mod fs;
pub mod retention;
pub mod s3;

/// Metadata of a stored object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectInfo {
    /// Path relative to the owner's prefix.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
}

/// A byte range read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// The bytes read (may be shorter than asked at the end of the object).
    pub bytes: Bytes,
    /// Total size of the object.
    pub total: u64,
}

/// Storage of call and task files.
#[async_trait]
pub trait ArtifactStore: Send + Sync + 'static {
    /// Writes (replaces) an object.
    async fn put(&self, owner: &OwnerKey, path: &str, bytes: Bytes) -> crate::Result<()>;

    /// Writes `path` only if nothing is there yet (atomically: of two replicas creating the
    /// same path, one wins); `false` when something was.
    async fn create(&self, owner: &OwnerKey, path: &str, bytes: Bytes) -> crate::Result<bool>;
    /// Writes several objects of one owner in order, stopping at the first failure (whose
    /// error it returns); a path that is not valid fails the batch before anything is
    /// written. Stores override it when a batch is cheaper than single writes.
    async fn put_all(&self, owner: &OwnerKey, files: Vec<(String, Bytes)>) -> crate::Result<()> {
        for (path, _) in &files {
            owner_key_path(owner, path)?;
        }
        for (path, bytes) in files {
            self.put(owner, &path, bytes).await?;
        }
        Ok(())
    }
    /// Reads a whole object; `None` when it does not exist.
    async fn get(&self, owner: &OwnerKey, path: &str) -> crate::Result<Option<Bytes>>;
    /// Reads `len` bytes from `offset`; `None` when the object does not exist.
    async fn get_range(&self, owner: &OwnerKey, path: &str, offset: u64, len: u64) -> crate::Result<Option<Chunk>>;
    /// Lists objects under a folder (relative to the owner's prefix, ending in '/').
    async fn list(&self, owner: &OwnerKey, folder: &str) -> crate::Result<Vec<ObjectInfo>>;
    /// Deletes every object under a folder (relative to the owner's prefix, ending in '/');
    /// returns how many there were. Nothing there is not an error.
    async fn delete_folder(&self, owner: &OwnerKey, folder: &str) -> crate::Result<usize>;
    /// Deletes the files at `paths` (relative to the owner's prefix), without listing
    /// anything: exact on any server, whatever else is written or deleted meanwhile. A path
    /// with nothing there is not an error; a path that is not valid fails the call before
    /// anything is deleted. A folder a deleted file leaves empty goes too, where the store has
    /// folders.
    async fn delete(&self, owner: &OwnerKey, paths: &[String]) -> crate::Result<()>;
    /// Has the store itself delete every owner's files `days` after they were written (an S3
    /// lifecycle rule); `Ok(false)` when it cannot, and the gateway deletes them with
    /// [`ArtifactStore::expire`] instead (see [`retention`]).
    async fn expire_after(&self, days: u32) -> crate::Result<bool> {
        let _ = days;
        Ok(false)
    }
    /// Deletes every owner's files last written before `before`; returns how many.
    async fn expire(&self, before: jiff::Timestamp) -> crate::Result<usize>;
    /// Checks that the store is reachable (for `/readyz`).
    async fn health(&self) -> crate::Result<()>;
}

/// Full key `owners/<owner>/<path>` after checking `path`: relative, '/'-separated,
/// no empty, '.' or '..' segments, no backslashes or control characters.
pub fn owner_key_path(owner: &OwnerKey, path: &str) -> crate::Result<String> {
    let folder = path.strip_suffix('/').unwrap_or(path);
    let ok = !folder.is_empty()
        && !folder.starts_with('/')
        && folder.split('/').all(|s| !s.is_empty() && s != "." && s != "..")
        && !folder.chars().any(|c| c.is_control() || c == '\\');
    if !ok {
        return Err(crate::Error::InvalidRequest(format!("invalid storage path {path:?}")));
    }
    Ok(format!("{}{path}", toolyard_api::storage::owner_prefix(owner)))
}

/// The storage key of a file (not a folder) at `path` of `owner` (see [`owner_key_path`]).
pub fn file_key(owner: &OwnerKey, path: &str) -> crate::Result<String> {
    let key = owner_key_path(owner, path)?;
    if key.ends_with('/') {
        return Err(crate::Error::InvalidRequest(format!("invalid storage path {path:?}")));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_under_the_owner_prefix() {
        let owner = OwnerKey::derive("local", "dev");
        assert_eq!(
            owner_key_path(&owner, "calls/c1/input.json").unwrap(),
            format!("owners/{owner}/calls/c1/input.json")
        );
        assert_eq!(owner_key_path(&owner, "tasks/").unwrap(), format!("owners/{owner}/tasks/"));
        for bad in ["", "/", "../x", "calls/../../other", "/abs", "a//b", "a\\b", "a\u{1}b", "./a"] {
            assert!(owner_key_path(&owner, bad).is_err(), "{bad:?}");
        }
    }
}
