//! [`ArtifactStore`] on a local folder (embedded mode, single-replica deployments).
//!
//! Keys map to files under the root (`<root>/owners/<owner>/...`). Writes are atomic: a
//! temporary file in the same folder, flushed, then renamed over the target, so a reader
//! never sees half a file. Symbolic links are never followed below the root: every
//! component of a path is checked with `lstat`, and a link anywhere is refused, so nothing
//! can read or write outside the root through a planted link.

use std::io::{ErrorKind, SeekFrom};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWriteExt};
use toolyard_api::OwnerKey;

use super::{ArtifactStore, Chunk, ObjectInfo, owner_key_path};
use crate::{Error, Result};

/// Prefix of temporary files (hidden from listings).
const TMP_PREFIX: &str = ".tmp-";

/// A store on a local folder.
#[derive(Clone, Debug)]
pub struct FsStore {
    root: PathBuf,
}

impl FsStore {
    /// A store rooted at `root`, creating the folder if needed. The root itself may be a
    /// symbolic link (it is resolved once, here); nothing below it may.
    pub fn new(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref();
        std::fs::create_dir_all(root).map_err(|e| io_error("creating the storage folder", root, e))?;
        let root = root.canonicalize().map_err(|e| io_error("resolving the storage folder", root, e))?;
        Ok(Self { root })
    }

    /// The resolved root folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file of `key` (already checked by [`owner_key_path`]) after refusing symbolic
    /// links in every existing component below the root.
    async fn checked_path(&self, key: &str) -> Result<PathBuf> {
        let mut path = self.root.clone();
        for segment in key.trim_end_matches('/').split('/') {
            path.push(segment);
            match tokio::fs::symlink_metadata(&path).await {
                Ok(meta) if meta.file_type().is_symlink() => {
                    tracing::warn!(key, "refused a symbolic link inside the storage folder");
                    return Err(Error::InvalidRequest(format!("invalid storage path {key:?}")));
                }
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => break,
                Err(e) => return Err(io_error("checking", &path, e)),
            }
        }
        Ok(self.root.join(key.trim_end_matches('/')))
    }
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Storage(format!("{what} {}: {e}", path.display()))
}

#[async_trait]
impl ArtifactStore for FsStore {
    async fn put(&self, owner: &OwnerKey, path: &str, bytes: Bytes) -> Result<()> {
        let key = owner_key_path(owner, path)?;
        if key.ends_with('/') {
            return Err(Error::InvalidRequest(format!("invalid storage path {path:?}")));
        }
        let target = self.checked_path(&key).await?;
        let parent = target.parent().ok_or_else(|| Error::Internal("storage key without a parent".into()))?;
        tokio::fs::create_dir_all(parent).await.map_err(|e| io_error("creating", parent, e))?;
        // The folders may have been created just now: check again that none is a link.
        self.checked_path(&key).await?;
        let tmp = parent.join(format!("{TMP_PREFIX}{}", uuid::Uuid::new_v4().simple()));
        let write = async {
            let mut file = tokio::fs::OpenOptions::new().write(true).create_new(true).open(&tmp).await?;
            file.write_all(&bytes).await?;
            file.sync_data().await?;
            tokio::fs::rename(&tmp, &target).await
        };
        if let Err(e) = write.await {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(io_error("writing", &target, e));
        }
        Ok(())
    }

    async fn get(&self, owner: &OwnerKey, path: &str) -> Result<Option<Bytes>> {
        let key = owner_key_path(owner, path)?;
        let file = self.checked_path(&key).await?;
        match tokio::fs::read(&file).await {
            Ok(bytes) => Ok(Some(Bytes::from(bytes))),
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::IsADirectory | ErrorKind::NotADirectory) => {
                Ok(None)
            }
            Err(e) => Err(io_error("reading", &file, e)),
        }
    }

    async fn get_range(&self, owner: &OwnerKey, path: &str, offset: u64, len: u64) -> Result<Option<Chunk>> {
        let key = owner_key_path(owner, path)?;
        let path = self.checked_path(&key).await?;
        let mut file = match tokio::fs::File::open(&path).await {
            Ok(f) => f,
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => return Ok(None),
            Err(e) => return Err(io_error("opening", &path, e)),
        };
        let meta = file.metadata().await.map_err(|e| io_error("reading", &path, e))?;
        if !meta.is_file() {
            return Ok(None);
        }
        let total = meta.len();
        if offset >= total || len == 0 {
            return Ok(Some(Chunk { bytes: Bytes::new(), total }));
        }
        let want = len.min(total - offset);
        file.seek(SeekFrom::Start(offset)).await.map_err(|e| io_error("seeking", &path, e))?;
        let mut buf = Vec::with_capacity(usize::try_from(want).unwrap_or(usize::MAX));
        file.take(want).read_to_end(&mut buf).await.map_err(|e| io_error("reading", &path, e))?;
        Ok(Some(Chunk { bytes: Bytes::from(buf), total }))
    }

    async fn list(&self, owner: &OwnerKey, folder: &str) -> Result<Vec<ObjectInfo>> {
        let key = owner_key_path(owner, folder)?;
        let owner_prefix = toolyard_api::storage::owner_prefix(owner);
        let start = self.checked_path(&key).await?;
        let mut out = Vec::new();
        let mut pending = vec![start];
        while let Some(dir) = pending.pop() {
            let mut entries = match tokio::fs::read_dir(&dir).await {
                Ok(e) => e,
                Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => continue,
                Err(e) => return Err(io_error("listing", &dir, e)),
            };
            while let Some(entry) = entries.next_entry().await.map_err(|e| io_error("listing", &dir, e))? {
                let name = entry.file_name();
                let Some(name) = name.to_str() else { continue };
                if name.starts_with(TMP_PREFIX) {
                    continue;
                }
                // `file_type` does not follow links: links are skipped, never entered.
                let kind = entry.file_type().await.map_err(|e| io_error("listing", &entry.path(), e))?;
                if kind.is_dir() {
                    pending.push(entry.path());
                } else if kind.is_file() {
                    let full = entry.path();
                    let Ok(rel) = full.strip_prefix(self.root.join(&owner_prefix)) else { continue };
                    let Some(rel) = rel.to_str() else { continue };
                    let size = entry.metadata().await.map(|m| m.len()).unwrap_or(0);
                    out.push(ObjectInfo { path: rel.to_owned(), size });
                }
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }

    async fn health(&self) -> Result<()> {
        let meta = tokio::fs::metadata(&self.root).await.map_err(|e| io_error("checking", &self.root, e))?;
        if !meta.is_dir() {
            return Err(Error::Storage(format!("{} is not a folder", self.root.display())));
        }
        Ok(())
    }
}
