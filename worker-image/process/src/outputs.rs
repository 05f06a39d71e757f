//! The files a call returns (see [`toolyard_api::protocol::outputs`]): read back from the
//! call's output folder after the function ended, every entry of its manifest checked.
//!
//! The function is not trusted: a name must be a relative path inside the folder's `files/`
//! (no `..`, no absolute path, no link anywhere on the way), a media type must be well formed
//! (and an image's one of the image types), and the count and sizes stay under the limits.
//! Anything else fails the call with a message that says which file and why.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toolyard_api::protocol::outputs::{
    FILES, IMAGE_TYPES, MANIFEST, MAX_FILE_BYTES, MAX_FILES, MAX_TOTAL_BYTES, OutputFile, is_media_type,
};
use toolyard_api::protocol::{CallErrorKind, CallResult};
use toolyard_api::storage::RelativePath;

/// Largest manifest read (a line per file).
const MAX_MANIFEST_BYTES: u64 = 256 * 1024;

/// One returned file with its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    /// What the result lists.
    pub file: OutputFile,
    /// The bytes.
    pub bytes: Vec<u8>,
}

/// One manifest line as the function wrote it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Entry {
    name: String,
    mime_type: String,
    #[serde(default)]
    image: bool,
}

/// Takes the files of a call that ended with `result` from its output folder `dir`: a
/// successful result lists them; a file that breaks a rule fails the call (`BadResult`, the
/// message saying which and why). A failed call returns none.
pub fn finish(result: &mut CallResult, dir: &Path) -> Vec<Output> {
    if result.is_error() {
        return Vec::new();
    }
    match collect(dir) {
        Ok(files) => {
            result.files = files.iter().map(|o| o.file.clone()).collect();
            files
        }
        Err(message) => {
            *result = CallResult::err(CallErrorKind::BadResult, message, result.exit_code, result.duration_ms);
            Vec::new()
        }
    }
}

/// Creates the output folder's `files/` in `dir` (a private folder of the call).
pub fn prepare(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().mode(0o700).create(dir.join(FILES))
}

/// The files listed in `dir`'s manifest, checked; none when there is no manifest.
pub fn collect(dir: &Path) -> Result<Vec<Output>, String> {
    let manifest = dir.join(MANIFEST);
    let text = match std::fs::File::open(&manifest) {
        Ok(file) => {
            let mut text = String::new();
            file.take(MAX_MANIFEST_BYTES + 1)
                .read_to_string(&mut text)
                .map_err(|e| format!("the list of returned files cannot be read: {e}"))?;
            if text.len() as u64 > MAX_MANIFEST_BYTES {
                return Err(format!("the list of returned files is longer than {MAX_MANIFEST_BYTES} bytes"));
            }
            text
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("the list of returned files cannot be read: {e}")),
    };
    let mut out: Vec<Output> = Vec::new();
    let mut total = 0u64;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let entry: Entry =
            serde_json::from_str(line).map_err(|e| format!("a returned file is described wrongly ({e}): {line}"))?;
        let name = RelativePath::parse(&entry.name)
            .map_err(|e| format!("a returned file's name {:?} is not allowed: {e}", entry.name))?;
        if out.iter().any(|o| o.file.name == name.as_str()) {
            return Err(format!("the file {name} is returned twice"));
        }
        if out.len() == MAX_FILES {
            return Err(format!("a call returns at most {MAX_FILES} files"));
        }
        if !is_media_type(&entry.mime_type) {
            return Err(format!("the file {name} has no valid media type: {:?}", entry.mime_type));
        }
        if entry.image && !IMAGE_TYPES.contains(&entry.mime_type.as_str()) {
            return Err(format!("the image {name} is {}; images are {}", entry.mime_type, IMAGE_TYPES.join(", ")));
        }
        let bytes = read_inside(&dir.join(FILES), &name)?;
        let size = bytes.len() as u64;
        total += size;
        if total > MAX_TOTAL_BYTES {
            return Err(format!("the returned files take more than {} MiB together", MAX_TOTAL_BYTES >> 20));
        }
        let file = OutputFile { name: name.as_str().to_owned(), mime_type: entry.mime_type, size, image: entry.image };
        out.push(Output { file, bytes });
    }
    Ok(out)
}

/// Reads `base/name`, refusing a link on any component and a file over the size limit.
fn read_inside(base: &Path, name: &RelativePath) -> Result<Vec<u8>, String> {
    let mut path = PathBuf::from(base);
    let segments: Vec<&str> = name.as_str().split('/').collect();
    for (i, segment) in segments.iter().enumerate() {
        path.push(segment);
        let meta = std::fs::symlink_metadata(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => format!("the returned file {name} was not written"),
            _ => format!("the returned file {name} cannot be read: {e}"),
        })?;
        let last = i + 1 == segments.len();
        let fits = if last { meta.file_type().is_file() } else { meta.file_type().is_dir() };
        if !fits {
            return Err(format!("the returned file {name} is not a plain file in the call's folder"));
        }
        if last && meta.len() > MAX_FILE_BYTES {
            return Err(format!(
                "the returned file {name} has {} bytes; the limit is {} MiB",
                meta.len(),
                MAX_FILE_BYTES >> 20
            ));
        }
    }
    let file = std::fs::File::open(&path).map_err(|e| format!("the returned file {name} cannot be read: {e}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("the returned file {name} cannot be read: {e}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!("the returned file {name} is larger than {} MiB", MAX_FILE_BYTES >> 20));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Folder(crate::child::TempDir);

    impl Folder {
        fn new() -> Self {
            let dir = crate::child::TempDir::new("outputs-test").expect("temp dir");
            prepare(dir.path()).expect("files/");
            Self(dir)
        }
        fn write(&self, name: &str, bytes: &[u8]) {
            let path = self.0.path().join(FILES).join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, bytes).unwrap();
        }
        fn manifest(&self, lines: &[&str]) {
            std::fs::write(self.0.path().join(MANIFEST), lines.join("\n")).unwrap();
        }
        fn collect(&self) -> Result<Vec<Output>, String> {
            collect(self.0.path())
        }
    }

    #[test]
    fn listed_files_come_back_with_their_bytes() {
        let f = Folder::new();
        assert_eq!(f.collect(), Ok(vec![]), "no manifest, no files");
        f.write("plot.png", b"\x89PNG");
        f.write("data/scenarios.csv", b"a,b\n");
        f.write("unlisted.txt", b"ignored");
        f.manifest(&[
            r#"{"name": "plot.png", "mimeType": "image/png", "image": true}"#,
            r#"{"name": "data/scenarios.csv", "mimeType": "text/csv"}"#,
        ]);
        let out = f.collect().expect("collected");
        assert_eq!(out.len(), 2);
        assert_eq!(
            out[0].file,
            OutputFile { name: "plot.png".into(), mime_type: "image/png".into(), size: 4, image: true }
        );
        assert_eq!((out[1].file.name.as_str(), out[1].bytes.as_slice()), ("data/scenarios.csv", &b"a,b\n"[..]));
    }

    #[test]
    fn bad_entries_fail_with_the_file_and_the_reason() {
        let cases: &[(&str, &str)] = &[
            (r#"{"name": "../etc/passwd", "mimeType": "text/plain"}"#, "is not allowed"),
            (r#"{"name": "/etc/passwd", "mimeType": "text/plain"}"#, "is not allowed"),
            (r#"{"name": "a.txt", "mimeType": "text plain"}"#, "no valid media type"),
            (r#"{"name": "a.txt", "mimeType": "text/plain", "image": true}"#, "images are image/png"),
            (r#"{"name": "missing.txt", "mimeType": "text/plain"}"#, "was not written"),
            (r#"{"name": "a.txt", "mimeType": "text/plain", "extra": 1}"#, "described wrongly"),
            ("not json", "described wrongly"),
        ];
        for (line, reason) in cases {
            let f = Folder::new();
            f.write("a.txt", b"x");
            f.manifest(&[line]);
            let e = f.collect().expect_err(line);
            assert!(e.contains(reason), "{line}: {e}");
        }
        let f = Folder::new();
        f.write("a.txt", b"x");
        f.manifest(&[
            r#"{"name": "a.txt", "mimeType": "text/plain"}"#,
            r#"{"name": "a.txt", "mimeType": "text/plain"}"#,
        ]);
        assert!(f.collect().expect_err("twice").contains("returned twice"));
    }

    #[test]
    fn links_and_oversized_files_are_refused() {
        let f = Folder::new();
        std::os::unix::fs::symlink("/etc/passwd", f.0.path().join(FILES).join("link.txt")).unwrap();
        f.manifest(&[r#"{"name": "link.txt", "mimeType": "text/plain"}"#]);
        assert!(f.collect().expect_err("a link").contains("not a plain file"));

        let f = Folder::new();
        std::os::unix::fs::symlink("/etc", f.0.path().join(FILES).join("dir")).unwrap();
        f.manifest(&[r#"{"name": "dir/passwd", "mimeType": "text/plain"}"#]);
        assert!(f.collect().expect_err("a linked folder").contains("not a plain file"));

        let f = Folder::new();
        let big = std::fs::File::create(f.0.path().join(FILES).join("big.bin")).unwrap();
        big.set_len(MAX_FILE_BYTES + 1).unwrap();
        f.manifest(&[r#"{"name": "big.bin", "mimeType": "application/octet-stream"}"#]);
        assert!(f.collect().expect_err("too big").contains("the limit is 8 MiB"));

        let f = Folder::new();
        let lines: Vec<String> = (0..=MAX_FILES)
            .map(|i| {
                f.write(&format!("f{i}.txt"), b"x");
                format!(r#"{{"name": "f{i}.txt", "mimeType": "text/plain"}}"#)
            })
            .collect();
        f.manifest(&lines.iter().map(String::as_str).collect::<Vec<_>>());
        assert!(f.collect().expect_err("too many").contains("at most 32 files"));
    }
}
