"""`toolyard.image()` and `toolyard.file()`: files a call returns, in the output folder the
runner names (file mode) or the jsonl request's `outputDir`; checked where they are made."""

from __future__ import annotations

import json

import pytest

import toolyard
from toolyard.run import _load, serve_line

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


def folder(tmp_path):
    (tmp_path / "files").mkdir(parents=True)
    return tmp_path


def manifest(tmp_path):
    return [json.loads(line) for line in (tmp_path / "manifest.jsonl").read_text().splitlines()]


def test_images_and_files_are_written_and_listed(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLYARD_OUTPUT_DIR", str(folder(tmp_path)))
    assert toolyard.image(PNG) == "image-1.png"
    assert toolyard.image(PNG, "image/jpeg") == "image-2.jpg"
    assert toolyard.file("reports/q3.csv", "a,b\n1,2\n", "text/csv") == "reports/q3.csv"
    assert toolyard.file("blob.bin", b"\x00\x01") == "blob.bin"
    assert (tmp_path / "files" / "image-1.png").read_bytes() == PNG
    assert (tmp_path / "files" / "reports" / "q3.csv").read_text() == "a,b\n1,2\n"
    assert manifest(tmp_path) == [
        {"name": "image-1.png", "mimeType": "image/png", "image": True},
        {"name": "image-2.jpg", "mimeType": "image/jpeg", "image": True},
        {"name": "reports/q3.csv", "mimeType": "text/csv", "image": False},
        {"name": "blob.bin", "mimeType": "application/octet-stream", "image": False},
    ]


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: toolyard.file("../x", "x"), "must be a relative path"),
        (lambda: toolyard.file("/etc/passwd", "x"), "must be a relative path"),
        (lambda: toolyard.file("a\\b", "x"), "not allowed"),
        (lambda: toolyard.file("x.txt", "x", "text plain"), "is not a media type"),
        (lambda: toolyard.image(PNG, "image/svg+xml"), "an image is one of"),
        (lambda: toolyard.image("text"), "image data must be bytes"),
        (lambda: toolyard.file("big.bin", b"\x00" * (8 * 1024 * 1024 + 1)), "at most 8388608"),
    ],
)
def test_bad_files_are_refused_where_they_are_made(tmp_path, monkeypatch, call, error):
    monkeypatch.setenv("TOOLYARD_OUTPUT_DIR", str(folder(tmp_path)))
    with pytest.raises((ValueError, TypeError), match=error):
        call()
    assert not (tmp_path / "manifest.jsonl").exists(), "nothing was listed"


def test_a_name_is_returned_once_and_a_call_returns_at_most_32_files(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLYARD_OUTPUT_DIR", str(folder(tmp_path)))
    toolyard.file("same.txt", "x")
    with pytest.raises(ValueError, match="already returned"):
        toolyard.file("same.txt", "y")
    for i in range(31):
        toolyard.file(f"f{i}.txt", "x")
    with pytest.raises(ValueError, match="at most 32 files"):
        toolyard.file("one-more.txt", "x")


def test_outside_a_call_nothing_is_written(monkeypatch):
    monkeypatch.delenv("TOOLYARD_OUTPUT_DIR", raising=False)
    assert toolyard.image(PNG) is None
    assert toolyard.file("x.txt", "x") is None


def test_a_jsonl_worker_writes_each_requests_files_to_its_own_folder(tmp_path, monkeypatch):
    monkeypatch.delenv("TOOLYARD_OUTPUT_DIR", raising=False)
    spec = _load("sample_tools:attach")
    first, second = folder(tmp_path / "one"), folder(tmp_path / "two")
    for dir_, text in ((first, "first"), (second, "second")):
        answer = serve_line(spec, json.dumps({"id": text, "arguments": {"text": text}, "outputDir": str(dir_)}).encode())
        assert answer == {"id": text, "ok": True, "result": "note.txt"}
        assert (dir_ / "files" / "note.txt").read_text() == text
    answer = serve_line(spec, json.dumps({"id": "none", "arguments": {"text": "x"}}).encode())
    assert answer == {"id": "none", "ok": True, "result": None}, "a request without a folder returns no files"
