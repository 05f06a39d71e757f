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
//! Symbolic links are never followed below the root. The root is opened once; a file is
//! reached from it one component at a time, each opened relative to the one before with
//! `O_NOFOLLOW` (`openat`), and files are created, renamed and linked relative to their open
//! folder. A link anywhere is refused, so nothing can read or write outside the root through
//! a planted link, and nothing planted between a check and a write is followed. Listings and
//! deletions check their folder that way, then walk it without following links.
//!
//! Each operation runs as one blocking task (plain `std::fs` calls in sequence), not as a
//! chain of asynchronous file operations that each hop to the blocking pool.

use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat, renameat};
use nix::sys::stat::{Mode, SFlag, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, linkat, unlinkat};
use toolyard_api::OwnerKey;

use super::{ArtifactStore, Chunk, ObjectInfo, file_key, owner_key_path};
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

/// Whether [`Inner::open_dir`] creates missing folders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Missing {
    /// Answer `None`.
    Absent,
    /// Create them (mode 0700).
    Create,
}

#[derive(Debug)]
struct Inner {
    root: PathBuf,
    /// The root folder, open: files are reached from it one component at a time.
    root_dir: Arc<OwnedFd>,
    durability: Durability,
}

impl FsStore {
    /// A store rooted at `root`, creating the folder if needed, with [`Durability::Synced`].
    /// The root itself may be a symbolic link (it is resolved once, here); nothing below it may.
    pub fn new(root: impl AsRef<Path>) -> Result<Self> {
        let root = root.as_ref();
        create_private_dirs(root).map_err(|e| io_error("creating the storage folder", root, e))?;
        let root = root.canonicalize().map_err(|e| io_error("resolving the storage folder", root, e))?;
        let root_dir = std::fs::File::open(&root).map_err(|e| io_error("opening the storage folder", &root, e))?;
        let root_dir = Arc::new(OwnedFd::from(root_dir));
        Ok(Self { inner: Arc::new(Inner { root, root_dir, durability: Durability::Synced }) })
    }

    /// The same store with another durability.
    pub fn with_durability(self, durability: Durability) -> Self {
        let Inner { root, root_dir, .. } = self.inner.as_ref();
        Self { inner: Arc::new(Inner { root: root.clone(), root_dir: Arc::clone(root_dir), durability }) }
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
    /// The folder `rel` below `start` (segments separated by `/`, checked by
    /// [`owner_key_path`]), reached one component at a time: each is opened relative to the one
    /// before it, never following a link, so nothing planted inside the root leads out of it.
    /// `None` when a folder on the way does not exist and `missing` does not create it, or a
    /// file stands where a folder should. A link on the way is refused (`key` names it).
    fn open_dir(&self, start: BorrowedFd<'_>, rel: &str, key: &str, missing: Missing) -> Result<Option<OwnedFd>> {
        let mut dir: Option<OwnedFd> = None;
        for segment in rel.split('/').filter(|s| !s.is_empty()) {
            let at = dir.as_ref().map_or(start, AsFd::as_fd);
            let next = match open_subdir(at, segment) {
                Err(Errno::ENOENT) if missing == Missing::Create => {
                    match mkdirat(at, segment, Mode::S_IRWXU) {
                        Ok(()) | Err(Errno::EEXIST) => {}
                        Err(e) => return Err(io_error("creating", &self.root.join(key), e.into())),
                    }
                    open_subdir(at, segment)
                }
                other => other,
            };
            dir = Some(match next {
                Ok(next) => next,
                Err(Errno::ENOENT) => return Ok(None),
                Err(Errno::ENOTDIR) => {
                    // A link (refused) or a file where a folder should be.
                    exists_unlinked(at, segment, key)?;
                    return match missing {
                        Missing::Absent => Ok(None),
                        Missing::Create => Err(Error::Storage(format!("{key:?}: {segment:?} is not a folder"))),
                    };
                }
                Err(e) => return Err(io_error("opening", &self.root.join(key), e.into())),
            });
        }
        match dir {
            Some(dir) => Ok(Some(dir)),
            None => start.try_clone_to_owned().map(Some).map_err(|e| io_error("opening", &self.root.join(key), e)),
        }
    }

    /// The folder `rel` below the root (see [`Inner::open_dir`]).
    fn open_folder(&self, rel: &str, key: &str, missing: Missing) -> Result<Option<OwnedFd>> {
        self.open_dir(self.root_dir.as_fd(), rel, key, missing)
    }

    /// The file `key`, opened without following links: `None` when it (or its folder) does
    /// not exist or is no file; a link is refused. Opened non-blocking, so that a FIFO planted
    /// in its place cannot hold the read (it is no file: `None`).
    fn open_file(&self, key: &str) -> Result<Option<std::fs::File>> {
        let (folder, name) = split_key(key)?;
        let Some(dir) = self.open_folder(folder, key, Missing::Absent)? else { return Ok(None) };
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let file = match openat(dir.as_fd(), name, flags, Mode::empty()) {
            Ok(fd) => std::fs::File::from(fd),
            Err(Errno::ENOENT) => return Ok(None),
            Err(Errno::ELOOP) => return Err(refused_link(key)),
            Err(e) => return Err(io_error("opening", &self.root.join(key), e.into())),
        };
        let meta = file.metadata().map_err(|e| io_error("reading", &self.root.join(key), e))?;
        Ok(meta.is_file().then_some(file))
    }

    /// The folder `key` as a path, after checking that no component of it is a link (for
    /// listings and deletions, which walk it without following links).
    fn checked_folder(&self, key: &str) -> Result<Option<PathBuf>> {
        let key = key.trim_end_matches('/');
        Ok(self.open_folder(key, key, Missing::Absent)?.map(|_| self.root.join(key)))
    }

    fn put(&self, key: &str, bytes: &[u8]) -> Result<()> {
        self.write(key, bytes, WriteMode::Replace).map(drop)
    }

    /// Writes `key` unless it exists; `false` when it did.
    fn create(&self, key: &str, bytes: &[u8]) -> Result<bool> {
        self.write(key, bytes, WriteMode::CreateOnly)
    }

    fn write(&self, key: &str, bytes: &[u8], how: WriteMode) -> Result<bool> {
        let (folder, name) = split_key(key)?;
        let dir = self.open_folder(folder, key, Missing::Create)?.ok_or_else(|| not_created(key))?;
        self.write_file(dir.as_fd(), name, key, bytes, how)
    }

    /// Writes several files in order, stopping at the first failure. A file in the folder of
    /// the one before it, or below that folder, is reached from that folder's open handle
    /// rather than from the root again.
    fn put_all(&self, files: &[(String, Bytes)]) -> Result<()> {
        let mut open: Option<(&str, OwnedFd)> = None;
        for (key, bytes) in files {
            let (folder, name) = split_key(key)?;
            let below = open.as_ref().and_then(|(at, fd)| {
                let rest = if folder == *at { Some("") } else { folder.strip_prefix(*at)?.strip_prefix('/') };
                rest.map(|rest| (fd.as_fd(), rest))
            });
            let dir = match below {
                Some((_, "")) => None,
                Some((from, rest)) => Some(self.open_dir(from, rest, key, Missing::Create)?),
                None => Some(self.open_folder(folder, key, Missing::Create)?),
            };
            if let Some(dir) = dir {
                open = Some((folder, dir.ok_or_else(|| not_created(key))?));
            }
            let (_, dir) = open.as_ref().expect("a folder is open");
            self.write_file(dir.as_fd(), name, key, bytes, WriteMode::Replace)?;
        }
        Ok(())
    }

    /// Writes `bytes` to a temporary file in `dir` and moves it into place as `name`: renamed
    /// over any file there, or, create-only, linked (which fails if `name` exists: then
    /// `false`). A link at `name` is refused.
    fn write_file(&self, dir: BorrowedFd<'_>, name: &str, key: &str, bytes: &[u8], how: WriteMode) -> Result<bool> {
        exists_unlinked(dir, name, key)?;
        let tmp = format!("{TMP_PREFIX}{}", uuid::Uuid::new_v4().simple());
        let write = || -> std::io::Result<bool> {
            let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            let mut file = std::fs::File::from(openat(dir, tmp.as_str(), flags, Mode::S_IRUSR | Mode::S_IWUSR)?);
            file.write_all(bytes)?;
            if self.durability == Durability::Synced {
                file.sync_data()?;
            }
            drop(file);
            match how {
                WriteMode::Replace => renameat(dir, tmp.as_str(), dir, name).map(|()| true).map_err(Into::into),
                WriteMode::CreateOnly => {
                    let linked = match linkat(dir, tmp.as_str(), dir, name, AtFlags::empty()) {
                        Ok(()) => Ok(true),
                        Err(Errno::EEXIST) => Ok(false),
                        Err(e) => Err(e.into()),
                    };
                    unlinkat(dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir)?;
                    linked
                }
            }
        };
        write().map_err(|e| {
            let _ = unlinkat(dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
            io_error("writing", &self.root.join(key), e)
        })
    }

    fn get(&self, key: &str) -> Result<Option<Bytes>> {
        let Some(mut file) = self.open_file(key)? else { return Ok(None) };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(|e| io_error("reading", &self.root.join(key), e))?;
        Ok(Some(Bytes::from(bytes)))
    }

    fn get_range(&self, key: &str, offset: u64, len: u64) -> Result<Option<Chunk>> {
        let Some(mut file) = self.open_file(key)? else { return Ok(None) };
        let path = self.root.join(key);
        let total = file.metadata().map_err(|e| io_error("reading", &path, e))?.len();
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
        let Some(start) = self.checked_folder(key)? else { return Ok(Vec::new()) };
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

    /// Removes the file `key` (a link there is removed, not followed), then its folder if that
    /// leaves it empty. Nothing there is not an error.
    fn delete_file(&self, key: &str) -> Result<()> {
        let (folder, name) = split_key(key)?;
        let (parent, last) = folder.rsplit_once('/').unwrap_or(("", folder));
        let Some(above) = self.open_folder(parent, key, Missing::Absent)? else { return Ok(()) };
        let Some(dir) = self.open_dir(above.as_fd(), last, key, Missing::Absent)? else { return Ok(()) };
        match unlinkat(dir.as_fd(), name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(io_error("deleting", &self.root.join(key), e.into())),
        }
        // Fails, and is meant to, while anything else is in the folder.
        let _ = unlinkat(above.as_fd(), last, UnlinkatFlags::RemoveDir);
        Ok(())
    }

    /// Removes the folder `key` and everything in it (links inside are removed, never
    /// followed); returns how many files it held.
    fn delete_folder(&self, key: &str, owner_prefix: &str) -> Result<usize> {
        let files = self.list(key, owner_prefix)?.len();
        let Some(path) = self.checked_folder(key)? else { return Ok(0) };
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

/// Whether `name` exists in `dir`, refusing a symbolic link there (`key` names it in the
/// error).
fn exists_unlinked(dir: BorrowedFd<'_>, name: &str, key: &str) -> Result<bool> {
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(stat) if stat.st_mode & SFlag::S_IFMT.bits() == SFlag::S_IFLNK.bits() => Err(refused_link(key)),
        Ok(_) => Ok(true),
        Err(Errno::ENOENT) => Ok(false),
        Err(e) => Err(Error::Storage(format!("checking {key:?}: {e}"))),
    }
}

fn refused_link(key: &str) -> Error {
    tracing::warn!(key, "refused a symbolic link inside the storage folder");
    Error::InvalidRequest(format!("invalid storage path {key:?}"))
}

fn not_created(key: &str) -> Error {
    Error::Storage(format!("the folder of {key:?} could not be created"))
}

/// Opens the folder `name` in `dir` without following a link (a link fails with `ENOTDIR`).
fn open_subdir(dir: BorrowedFd<'_>, name: &str) -> nix::Result<OwnedFd> {
    openat(dir, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
}

/// A file's key as its folder and its name.
fn split_key(key: &str) -> Result<(&str, &str)> {
    match key.rsplit_once('/') {
        Some((folder, name)) if !name.is_empty() => Ok((folder, name)),
        _ => Err(Error::InvalidRequest(format!("invalid storage path {key:?}"))),
    }
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

    async fn delete(&self, owner: &OwnerKey, paths: &[String]) -> Result<()> {
        let keys = paths.iter().map(|path| file_key(owner, path)).collect::<Result<Vec<_>>>()?;
        self.blocking(move |inner| keys.iter().try_for_each(|key| inner.delete_file(key))).await
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
pub(crate) mod tests {
    use super::*;

    /// A folder of a test's own under the temporary folder, removed when dropped (when the
    /// test fails too).
    pub(crate) struct Scratch(PathBuf);

    impl Scratch {
        pub(crate) fn new(name: &str) -> Self {
            Self(std::env::temp_dir().join(format!("toolyard-fs-{name}-{}", std::process::id())))
        }

        /// A store in subfolder `root`, and the owner the tests write as.
        pub(crate) fn store(&self, root: &str) -> (FsStore, OwnerKey) {
            (FsStore::new(self.0.join(root)).unwrap(), OwnerKey::derive("local", "dev"))
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[tokio::test]
    async fn both_durabilities_store_atomically_and_read_back() {
        let scratch = Scratch::new("durability");
        for durability in [Durability::Synced, Durability::Buffered] {
            let (store, owner) = scratch.store(&format!("{durability:?}"));
            let store = store.with_durability(durability);
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
    }

    #[tokio::test]
    async fn a_batch_lands_each_file_in_its_own_folder() {
        let scratch = Scratch::new("batch");
        let (store, owner) = scratch.store("root");
        // A sibling whose name extends the folder, back again, the same folder, a subfolder
        // of it, and a folder elsewhere two levels deep.
        let files = [
            "calls/c1/input.json",
            "calls/c10/input.json",
            "calls/c1/result.json",
            "calls/c1/done.json",
            "calls/c1/events/000001.jsonl",
            "tasks/t1/outputs/a.csv",
        ];
        let batch = files.iter().map(|f| ((*f).to_owned(), Bytes::from(f.as_bytes().to_vec()))).collect();
        store.put_all(&owner, batch).await.unwrap();
        for file in files {
            let on_disk = std::fs::read(store.root().join(format!("owners/{owner}/{file}"))).unwrap();
            assert_eq!(on_disk, file.as_bytes(), "{file}");
        }
        let listed: Vec<_> = store.list(&owner, "calls/").await.unwrap().into_iter().map(|o| o.path).collect();
        assert_eq!(
            listed,
            [
                "calls/c1/done.json",
                "calls/c1/events/000001.jsonl",
                "calls/c1/input.json",
                "calls/c1/result.json",
                "calls/c10/input.json"
            ]
        );
    }

    #[tokio::test]
    async fn deleting_files_by_path_removes_the_folder_they_leave_empty_and_follows_no_link() {
        let scratch = Scratch::new("delete");
        let (store, owner) = scratch.store("root");
        for file in ["asks/a1/answer.json", "asks/a2/answer.json", "asks/a2/other.json", "outside/kept.json"] {
            store.put(&owner, file, Bytes::from_static(b"{}")).await.unwrap();
        }
        let owned = store.root().join(format!("owners/{owner}"));
        // A link where a file is deleted goes itself; what it points to stays.
        std::os::unix::fs::symlink(owned.join("outside/kept.json"), owned.join("asks/a3.json")).unwrap();
        let paths = ["asks/a1/answer.json", "asks/a2/answer.json", "asks/gone/answer.json", "asks/a3.json"];
        store.delete(&owner, &paths.map(String::from)).await.unwrap();
        assert!(!owned.join("asks/a1").exists(), "the folder left empty is removed");
        assert!(!owned.join("asks/a2/answer.json").exists());
        assert!(owned.join("asks/a2/other.json").exists(), "a folder with other files stays");
        assert!(std::fs::symlink_metadata(owned.join("asks/a3.json")).is_err(), "the link is removed");
        assert!(owned.join("outside/kept.json").exists(), "the link was not followed");
        // A link on the way to a file is refused; so are traversal and folders.
        std::os::unix::fs::symlink(owned.join("outside"), owned.join("asks/via")).unwrap();
        assert!(store.delete(&owner, &["asks/via/kept.json".into()]).await.is_err());
        assert!(owned.join("outside/kept.json").exists());
        for bad in ["../other/asks/a2/other.json", "asks/a2/"] {
            let err = store.delete(&owner, &["asks/a2/other.json".into(), bad.into()]).await.unwrap_err();
            assert!(matches!(err, Error::InvalidRequest(_)), "{bad}: {err}");
        }
        assert!(owned.join("asks/a2/other.json").exists(), "a bad path fails the call before anything is deleted");
    }

    #[tokio::test]
    async fn a_fifo_in_place_of_a_file_reads_as_no_file() {
        let scratch = Scratch::new("fifo");
        let (store, owner) = scratch.store("root");
        store.put(&owner, "calls/c1/input.json", Bytes::from_static(b"{}")).await.unwrap();
        let fifo = store.root().join(format!("owners/{owner}/calls/c1/result.json"));
        nix::unistd::mkfifo(&fifo, Mode::S_IRUSR | Mode::S_IWUSR).unwrap();
        let read = tokio::time::timeout(std::time::Duration::from_secs(10), store.get(&owner, "calls/c1/result.json"));
        let Ok(read) = read.await else {
            // Blocked in open(2): a writer releases it, so that the test ends and says why.
            drop(std::fs::OpenOptions::new().write(true).open(&fifo));
            panic!("reading a FIFO in the store blocked");
        };
        assert_eq!(read.unwrap(), None);
        let range = store.get_range(&owner, "calls/c1/result.json", 0, 10).await.unwrap();
        assert!(range.is_none());
    }

    #[tokio::test]
    async fn folders_and_files_are_private_to_the_gateways_user() {
        use std::os::unix::fs::MetadataExt;

        let scratch = Scratch::new("modes");
        let (store, owner) = scratch.store("root");
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
    }
}
