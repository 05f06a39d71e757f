//! [`ArtifactStore`] on a local folder (embedded mode, single-replica deployments).
//!
//! Keys map to files under the root (`<root>/owners/<owner>/...`). Writes are atomic: a
//! temporary file in the same folder, written, then renamed over the target, so a reader
//! never sees half a file. With [`Durability::Synced`] (the default, and what `serve
//! --storage-dir` uses) the file's data is flushed to the disk before the rename, so a
//! stored file survives a machine crash; [`Durability::Buffered`] (the embedded local mode)
//! leaves the flush to the operating system: a file survives the gateway's own crash, not
//! the machine's, and a write costs microseconds instead of a disk flush.
//!
//! Folders are created with mode 0700 and files with mode 0600: only the gateway's user reads
//! them.
//!
//! Symbolic links are never followed below the root: every component of a path is checked
//! with `lstat`, and a link anywhere is refused, so nothing can read or write outside the
//! root through a planted link.
//!
//! Each operation runs as one blocking task (plain `std::fs` calls in sequence), not as a
//! chain of asynchronous file operations that each hop to the blocking pool.

use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use toolyard_api::OwnerKey;

use super::{ArtifactStore, Chunk, ObjectInfo, owner_key_path};
use crate::{Error, Result};

/// Prefix of temporary files (hidden from listings).
const TMP_PREFIX: &str = ".tmp-";

/// Whether a write reaches the disk before `put` returns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Durability {
    /// The file's data is flushed (`fdatasync`) before it is renamed into place.
    #[default]
    Synced,
    /// Written and renamed into place; the operating system flushes it later.
    Buffered,
}

/// A store on a local folder.
#[derive(Clone, Debug)]
pub struct FsStore {
    inner: Arc<Inner>,
}

/// How [`Inner::write_file`] treats a file already at the target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WriteMode {
    /// Replace it.
    Replace,
    /// Keep it and write nothing.
    CreateOnly,
}

#[derive(Debug)]
struct Inner {
    root: PathBuf,
    durability: Durability,
}

impl FsStore {
    /// A store rooted at `root`, creating the folder if needed, with [`Durability::Synced`].
    /// The root itself may be a symbolic link (it is resolved once, here); nothing below it may.
    pub fn new(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref();
        create_private_dirs(root).map_err(|e| io_error("creating the storage folder", root, e))?;
        let root = root.canonicalize().map_err(|e| io_error("resolving the storage folder", root, e))?;
        Ok(Self { inner: Arc::new(Inner { root, durability: Durability::Synced }) })
    }

    /// The same store with another durability.
    pub fn with_durability(self, durability: Durability) -> Self {
        Self { inner: Arc::new(Inner { root: self.inner.root.clone(), durability }) }
    }

    /// The resolved root folder.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// The durability of writes.
    pub fn durability(&self) -> Durability {
        self.inner.durability
    }

    /// Runs `op` on the blocking pool with this store's state.
    async fn blocking<T: Send + 'static>(&self, op: impl FnOnce(&Inner) -> Result<T> + Send + 'static) -> Result<T> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || op(&inner))
            .await
            .map_err(|e| Error::Internal(format!("a storage task failed: {e}")))?
    }
}

impl Inner {
    /// The file of `key` (already checked by [`owner_key_path`]) after refusing symbolic
    /// links in every existing component below the root.
    fn checked_path(&self, key: &str) -> Result<PathBuf> {
        let mut path = self.root.clone();
        for segment in key.trim_end_matches('/').split('/') {
            path.push(segment);
            if !exists_unlinked(&path, key)? {
                break;
            }
        }
        Ok(self.root.join(key.trim_end_matches('/')))
    }

    fn put(&self, key: &str, bytes: &[u8]) -> Result<()> {
        let target = self.prepared_target(key)?;
        self.write_file(&target, bytes, WriteMode::Replace).map(drop)
    }

    /// Writes `key` unless it exists; `false` when it did.
    fn create(&self, key: &str, bytes: &[u8]) -> Result<bool> {
        let target = self.prepared_target(key)?;
        self.write_file(&target, bytes, WriteMode::CreateOnly)
    }

    /// Writes several files in order, stopping at the first failure. Files in the folder of
    /// the one before them skip the folder's checks (done once, for the first); a file in a
    /// subfolder of it has only that subfolder checked (and created).
    fn put_all(&self, files: &[(String, Bytes)]) -> Result<()> {
        let mut checked_folder: Option<PathBuf> = None;
        for (key, bytes) in files {
            let target = self.root.join(key.trim_end_matches('/'));
            let parent = target.parent();
            let same_folder = checked_folder.as_deref().is_some_and(|f| parent == Some(f));
            let in_subfolder = checked_folder.as_deref().is_some_and(|f| parent.and_then(Path::parent) == Some(f));
            let target = if same_folder {
                // The folder is checked; the file itself must not be a link.
                exists_unlinked(&target, key)?;
                target
            } else if let (true, Some(subfolder)) = (in_subfolder, parent) {
                if !exists_unlinked(subfolder, key)? {
                    match std::fs::DirBuilder::new().mode(0o700).create(subfolder) {
                        Err(e) if e.kind() != ErrorKind::AlreadyExists => {
                            return Err(io_error("creating", subfolder, e));
                        }
                        _ => {}
                    }
                    // Created just now (or by another writer): check again that it is no link.
                    exists_unlinked(subfolder, key)?;
                }
                exists_unlinked(&target, key)?;
                target
            } else {
                self.prepared_target(key)?
            };
            self.write_file(&target, bytes, WriteMode::Replace)?;
            checked_folder = target.parent().map(Path::to_path_buf);
        }
        Ok(())
    }

    /// The checked file of `key`, its folder created (and checked again once created).
    fn prepared_target(&self, key: &str) -> Result<PathBuf> {
        let target = self.checked_path(key)?;
        let parent = target.parent().ok_or_else(|| Error::Internal("storage key without a parent".into()))?;
        if !parent.is_dir() {
            create_private_dirs(parent).map_err(|e| io_error("creating", parent, e))?;
            // The folders were created just now: check again that none is a link.
            self.checked_path(key)?;
        }
        Ok(target)
    }

    /// Writes `bytes` to a temporary file beside `target` and moves it into place: renamed
    /// over any file there, or, create-only, linked (which fails if `target` exists: then
    /// `false`).
    fn write_file(&self, target: &Path, bytes: &[u8], how: WriteMode) -> Result<bool> {
        let parent = target.parent().ok_or_else(|| Error::Internal("storage key without a parent".into()))?;
        let tmp = parent.join(format!("{TMP_PREFIX}{}", uuid::Uuid::new_v4().simple()));
        let write = || {
            let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
            file.write_all(bytes)?;
            if self.durability == Durability::Synced {
                file.sync_data()?;
            }
            drop(file);
            match how {
                WriteMode::Replace => std::fs::rename(&tmp, target).map(|()| true),
                WriteMode::CreateOnly => {
                    let linked = match std::fs::hard_link(&tmp, target) {
                        Ok(()) => Ok(true),
                        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
                        Err(e) => Err(e),
                    };
                    std::fs::remove_file(&tmp)?;
                    linked
                }
            }
        };
        match write() {
            Ok(written) => Ok(written),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(io_error("writing", target, e))
            }
        }
    }

    fn get(&self, key: &str) -> Result<Option<Bytes>> {
        let file = self.checked_path(key)?;
        match std::fs::read(&file) {
            Ok(bytes) => Ok(Some(Bytes::from(bytes))),
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::IsADirectory | ErrorKind::NotADirectory) => {
                Ok(None)
            }
            Err(e) => Err(io_error("reading", &file, e)),
        }
    }

    fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Option<Chunk>> {
        let path = self.checked_path(key)?;
        let mut file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => return Ok(None),
            Err(e) => return Err(io_error("opening", &path, e)),
        };
        let meta = file.metadata().map_err(|e| io_error("reading", &path, e))?;
        if !meta.is_file() {
            return Ok(None);
        }
        let total = meta.len();
        if offset >= total || len == 0 {
            return Ok(Some(Chunk { bytes: Bytes::new(), total }));
        }
        let want = len.min(total - offset);
        file.seek(SeekFrom::Start(offset)).map_err(|e| io_error("seeking", &path, e))?;
        let mut buf = Vec::with_capacity(usize::try_from(want).unwrap_or(usize::MAX));
        file.take(want).read_to_end(&mut buf).map_err(|e| io_error("reading", &path, e))?;
        Ok(Some(Chunk { bytes: Bytes::from(buf), total }))
    }

    fn list(&self, key: &str, owner_prefix: &str) -> Result<Vec<ObjectInfo>> {
        let start = self.checked_path(key)?;
        let base = self.root.join(owner_prefix);
        let mut out = Vec::new();
        let mut pending = vec![start];
        while let Some(dir) = pending.pop() {
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => continue,
                Err(e) => return Err(io_error("listing", &dir, e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| io_error("listing", &dir, e))?;
                let name = entry.file_name();
                let Some(name) = name.to_str() else { continue };
                if name.starts_with(TMP_PREFIX) {
                    continue;
                }
                // `file_type` does not follow links: links are skipped, never entered.
                let kind = entry.file_type().map_err(|e| io_error("listing", &entry.path(), e))?;
                if kind.is_dir() {
                    pending.push(entry.path());
                } else if kind.is_file() {
                    let full = entry.path();
                    let Ok(rel) = full.strip_prefix(&base) else { continue };
                    let Some(rel) = rel.to_str() else { continue };
                    let size = entry.metadata().map(|m| m.len()).unwrap_or(0);
                    out.push(ObjectInfo { path: rel.to_owned(), size });
                }
            }
        }
        out.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(out)
    }
}

impl Inner {
    /// Removes every owner's files (and stale temporary files) last written before `cutoff`,
    /// then the folders that leaves empty; links are removed, never followed. Returns how many
    /// files it removed.
    fn expire(&self, cutoff: std::time::SystemTime) -> Result<usize> {
        let owners = self.root.join("owners");
        let mut removed = 0;
        let mut folders = Vec::new();
        let mut pending = vec![owners.clone()];
        while let Some(dir) = pending.pop() {
            let entries = match std::fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(io_error("listing", &dir, e)),
            };
            for entry in entries.flatten() {
                let Ok(meta) = entry.path().symlink_metadata() else { continue };
                if meta.is_dir() {
                    pending.push(entry.path());
                    folders.push(entry.path());
                } else if meta.modified().is_ok_and(|m| m < cutoff) {
                    match std::fs::remove_file(entry.path()) {
                        Ok(()) => removed += 1,
                        Err(e) if e.kind() == ErrorKind::NotFound => {}
                        Err(e) => return Err(io_error("deleting", &entry.path(), e)),
                    }
                }
            }
        }
        // Deepest first; a folder with anything left in it stays (remove_dir fails).
        folders.sort_by_key(|f| std::cmp::Reverse(f.components().count()));
        for folder in folders {
            let _ = std::fs::remove_dir(folder);
        }
        Ok(removed)
    }

    /// Removes the folder `key` and everything in it (links inside are removed, never
    /// followed); returns how many files it held.
    fn delete_folder(&self, key: &str, owner_prefix: &str) -> Result<usize> {
        let files = self.list(key, owner_prefix)?.len();
        let path = self.checked_path(key)?;
        match std::fs::remove_dir_all(&path) {
            Ok(()) => Ok(files),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(0),
            Err(e) => Err(io_error("deleting", &path, e)),
        }
    }
}

/// Creates `dir` and its missing parents with mode 0700.
pub(crate) fn create_private_dirs(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Whether `path` exists, refusing a symbolic link there (`key` names it in the error).
fn exists_unlinked(path: &Path, key: &str) -> Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => {
            tracing::warn!(key, "refused a symbolic link inside the storage folder");
            Err(Error::InvalidRequest(format!("invalid storage path {key:?}")))
        }
        Ok(_) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_error("checking", path, e)),
    }
}

/// The storage key of a file (not a folder) at `path` of `owner`.
fn file_key(owner: &OwnerKey, path: &str) -> Result<String> {
    let key = owner_key_path(owner, path)?;
    if key.ends_with('/') {
        return Err(Error::InvalidRequest(format!("invalid storage path {path:?}")));
    }
    Ok(key)
}

fn io_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Storage(format!("{what} {}: {e}", path.display()))
}

#[async_trait]
impl ArtifactStore for FsStore {
    async fn put(&self, owner: &OwnerKey, path: &str, bytes: Bytes) -> Result<()> {
        let key = file_key(owner, path)?;
        self.blocking(move |inner| inner.put(&key, &bytes)).await
    }

    async fn create(&self, owner: &OwnerKey, path: &str, bytes: Bytes) -> Result<bool> {
        let key = file_key(owner, path)?;
        self.blocking(move |inner| inner.create(&key, &bytes)).await
    }

    /// All files in one blocking task, the shared folder checked once.
    async fn put_all(&self, owner: &OwnerKey, files: Vec<(String, Bytes)>) -> Result<()> {
        let keyed =
            files.into_iter().map(|(path, bytes)| Ok((file_key(owner, &path)?, bytes))).collect::<Result<Vec<_>>>()?;
        self.blocking(move |inner| inner.put_all(&keyed)).await
    }

    async fn get(&self, owner: &OwnerKey, path: &str) -> Result<Option<Bytes>> {
        let key = owner_key_path(owner, path)?;
        self.blocking(move |inner| inner.get(&key)).await
    }

    async fn get_range(&self, owner: &OwnerKey, path: &str, offset: u64, len: u64) -> Result<Option<Chunk>> {
        let key = owner_key_path(owner, path)?;
        self.blocking(move |inner| inner.get_range(&key, offset, len)).await
    }

    async fn list(&self, owner: &OwnerKey, folder: &str) -> Result<Vec<ObjectInfo>> {
        let key = owner_key_path(owner, folder)?;
        let owner_prefix = toolyard_api::storage::owner_prefix(owner);
        self.blocking(move |inner| inner.list(&key, &owner_prefix)).await
    }

    async fn delete_folder(&self, owner: &OwnerKey, folder: &str) -> Result<usize> {
        let key = owner_key_path(owner, folder)?;
        if !key.ends_with('/') {
            return Err(Error::InvalidRequest(format!("not a folder: {folder:?}")));
        }
        let owner_prefix = toolyard_api::storage::owner_prefix(owner);
        self.blocking(move |inner| inner.delete_folder(&key, &owner_prefix)).await
    }

    async fn expire(&self, before: jiff::Timestamp) -> Result<usize> {
        let cutoff = std::time::SystemTime::UNIX_EPOCH
            + std::time::Duration::from_millis(u64::try_from(before.as_millisecond()).unwrap_or(0));
        self.blocking(move |inner| inner.expire(cutoff)).await
    }

    async fn health(&self) -> Result<()> {
        let root = self.inner.root.clone();
        let meta = tokio::fs::metadata(&root).await.map_err(|e| io_error("checking", &root, e))?;
        if !meta.is_dir() {
            return Err(Error::Storage(format!("{} is not a folder", root.display())));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn both_durabilities_store_atomically_and_read_back() {
        let dir = std::env::temp_dir().join(format!("toolyard-fs-durability-{}", std::process::id()));
        let owner = OwnerKey::derive("local", "dev");
        for durability in [Durability::Synced, Durability::Buffered] {
            let store = FsStore::new(dir.join(format!("{durability:?}"))).unwrap().with_durability(durability);
            assert_eq!(store.durability(), durability);
            store.put(&owner, "calls/c1/input.json", Bytes::from_static(b"{}")).await.unwrap();
            store.put(&owner, "calls/c1/input.json", Bytes::from_static(b"{\"a\":1}")).await.unwrap();
            assert_eq!(store.get(&owner, "calls/c1/input.json").await.unwrap().as_deref(), Some(&b"{\"a\":1}"[..]));
            let names: Vec<_> = std::fs::read_dir(store.root().join(format!("owners/{owner}/calls/c1")))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            assert_eq!(names, ["input.json"], "no temporary file is left behind");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn folders_and_files_are_private_to_the_gateways_user() {
        use std::os::unix::fs::MetadataExt;

        let dir = std::env::temp_dir().join(format!("toolyard-fs-modes-{}", std::process::id()));
        let store = FsStore::new(dir.join("root")).unwrap();
        let owner = OwnerKey::derive("local", "dev");
        store.put(&owner, "calls/c1/input.json", Bytes::from_static(b"{}")).await.unwrap();
        store.put_all(&owner, vec![("tasks/t1/result.json".into(), Bytes::from_static(b"{}"))]).await.unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        let root = store.root();
        assert_eq!(mode(root), 0o700);
        for folder in ["owners", &format!("owners/{owner}"), &format!("owners/{owner}/calls/c1")] {
            assert_eq!(mode(&root.join(folder)), 0o700, "{folder}");
        }
        for file in ["calls/c1/input.json", "tasks/t1/result.json"] {
            assert_eq!(mode(&root.join(format!("owners/{owner}/{file}"))), 0o600, "{file}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
