"""`toolyard.image(...)` and `toolyard.file(...)`: files a running call returns.

The caller gets each image as MCP image content, and every file as a link to the caller's
stored copy (`toolyard://calls/<call id>/files/outputs/<name>`, also readable with
`read_artifact`). The runner says where they go: a folder named by `TOOLYARD_OUTPUT_DIR` (one
process per call), or the jsonl request's `outputDir` (a reused worker; `toolyard.run` sets
the current call's). Each file is written to `<folder>/files/<name>` and described by a line
of `<folder>/manifest.jsonl`; the runner checks them all again.
"""

from __future__ import annotations

import contextvars
import json
import os
import threading
from typing import Union

#: Image types a call may return as images.
IMAGE_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
#: Largest file in bytes (8 MiB).
MAX_FILE_BYTES = 8 * 1024 * 1024
#: Most files one call returns.
MAX_FILES = 32

_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp"}
_TOKEN_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$&^_.+-")

_UNSET = object()
# The jsonl worker's current call: its output folder.
_current: contextvars.ContextVar[object] = contextvars.ContextVar("toolyard_output_dir", default=_UNSET)
_lock = threading.Lock()

Data = Union[bytes, bytearray, memoryview, str]


def _folder() -> str | None:
    current = _current.get()
    if current is not _UNSET:
        return current if isinstance(current, str) else None
    return os.environ.get("TOOLYARD_OUTPUT_DIR") or None


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError("a file name must be a non-empty string")
    if len(name.encode("utf-8")) > 512 or name.count("/") >= 8:
        raise ValueError(f"file name {name!r} is too long or too deep (512 bytes, 8 levels)")
    if name.startswith("/") or any(part in ("", ".", "..") for part in name.split("/")):
        raise ValueError(f"file name {name!r} must be a relative path without '.', '..' or empty parts")
    if any(c in "\\:" or ord(c) < 32 or ord(c) == 127 for c in name):
        raise ValueError(f"file name {name!r} contains a character that is not allowed")
    return name


def _check_media_type(mime_type: object) -> str:
    if not isinstance(mime_type, str):
        raise ValueError("a media type must be a string like 'text/csv'")
    kind, _, sub = mime_type.partition("/")
    if not (kind and sub and set(kind) <= _TOKEN_CHARS and set(sub) <= _TOKEN_CHARS):
        raise ValueError(f"{mime_type!r} is not a media type like 'text/csv'")
    return mime_type


def _as_bytes(data: Data) -> bytes:
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"data must be bytes or str, got {type(data).__name__}")


def _save(name: str, data: bytes, mime_type: str, image: bool) -> str | None:
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{name} has {len(data)} bytes; a returned file may have at most {MAX_FILE_BYTES} (8 MiB)")
    folder = _folder()
    if folder is None:
        return None
    with _lock:
        manifest = os.path.join(folder, "manifest.jsonl")
        listed = []
        if os.path.exists(manifest):
            with open(manifest, encoding="utf-8") as f:
                listed = [json.loads(line)["name"] for line in f if line.strip()]
        if name in listed:
            raise ValueError(f"{name} is already returned by this call")
        if len(listed) >= MAX_FILES:
            raise ValueError(f"a call returns at most {MAX_FILES} files")
        path = os.path.join(folder, "files", *name.split("/"))
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        with open(manifest, "a", encoding="utf-8") as f:
            f.write(json.dumps({"name": name, "mimeType": mime_type, "image": image}) + "\n")
    return name


def image(data: bytes, mime_type: str = "image/png", name: str | None = None) -> str | None:
    """Return an image (e.g. a matplotlib PNG) with the running call's result.

    The caller gets it as MCP image content and as a stored file (`name`, by default
    `image-<n>.<ext>`). `mime_type` is one of image/png, image/jpeg, image/gif, image/webp;
    at most 8 MiB. Returns the stored name; outside a Toolyard call it does nothing and
    returns None.
    """
    if mime_type not in IMAGE_TYPES:
        raise ValueError(f"an image is one of {', '.join(IMAGE_TYPES)}, not {mime_type!r}")
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"image data must be bytes, got {type(data).__name__}")
    if name is None:
        folder = _folder()
        count = 0
        if folder and os.path.exists(os.path.join(folder, "manifest.jsonl")):
            with open(os.path.join(folder, "manifest.jsonl"), encoding="utf-8") as f:
                count = sum(1 for line in f if line.strip())
        name = f"image-{count + 1}.{_EXTENSIONS[mime_type]}"
    return _save(_check_name(name), bytes(data), mime_type, True)


def file(name: str, data: Data, mime_type: str = "application/octet-stream") -> str | None:
    """Return a file (e.g. a CSV of scenarios) with the running call's result.

    It is stored as the caller's, under `name` (a relative path), and the caller gets a link
    to it. `data` is bytes, or text written as UTF-8; at most 8 MiB, 32 files per call.
    Returns the stored name; outside a Toolyard call it does nothing and returns None.
    """
    return _save(_check_name(name), _as_bytes(data), _check_media_type(mime_type), False)


def begin_call(value: object) -> contextvars.Token[object]:
    """Sets the jsonl worker's current output folder (the request's `outputDir`, or none)."""
    return _current.set(value if isinstance(value, str) else None)


def end_call(token: contextvars.Token[object]) -> None:
    _current.reset(token)
