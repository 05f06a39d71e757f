"""`python -m toolyard.verify`: a manifest checked against the function it names."""

from __future__ import annotations

import json
import subprocess
import sys

from runner_support import subprocess_env

from toolyard.manifest import Options, tool_document
from toolyard.verify import verify


def entry(target: str, **changes) -> dict:
    spec = tool_document(target, Options(image="x"))["spec"]
    out = {"tool": spec["name"], "target": target, "inputSchema": spec["inputSchema"],
           "outputSchema": spec.get("outputSchema")}  # fmt: skip
    out.update(changes)
    return out


def test_a_generated_manifest_passes():
    assert verify(entry("sample_tools:add"))["status"] == "pass"


def test_changed_descriptions_are_a_warning():
    e = entry("sample_tools:add")
    e["inputSchema"]["properties"]["a"]["description"] = "old words"
    result = verify(e)
    assert result["status"] == "warn" and "descriptions differ" in result["detail"]


def test_parameters_and_results_that_drifted_fail_with_what_differs():
    e = entry("sample_tools:add")
    e["inputSchema"]["properties"]["c"] = e["inputSchema"]["properties"].pop("b")
    e["inputSchema"]["required"] = ["a", "c"]
    detail = verify(e)["detail"]
    assert "the function has 'b', the manifest does not" in detail
    assert "the manifest has 'c', the function does not" in detail
    assert "required is ['a', 'c'] in the manifest, ['a'] from the function" in detail
    wrong_type = entry("sample_tools:add")
    wrong_type["inputSchema"]["properties"]["a"]["type"] = "string"
    assert "'a' is" in verify(wrong_type)["detail"]
    no_output = entry("sample_tools:add", outputSchema=None)
    assert verify(no_output)["status"] == "fail"


def test_functions_that_cannot_be_loaded_fail_with_the_reason():
    missing = verify({"tool": "x", "target": "no_such_module:f", "inputSchema": {}, "outputSchema": None})
    assert missing["status"] == "fail" and "no_such_module" in missing["detail"]
    broken = verify({"tool": "x", "target": "broken_module:f", "inputSchema": {}, "outputSchema": None})
    assert broken["status"] == "fail" and "broken_module" in broken["detail"]


def test_the_module_answers_json_even_when_imports_print():
    entries = [entry("sample_tools:add"), {"tool": "x", "target": "nope:f", "inputSchema": {}}]
    out = subprocess.run([sys.executable, "-m", "toolyard.verify"], input=json.dumps(entries), capture_output=True,
                         text=True, env=subprocess_env(), check=True)  # fmt: skip
    statuses = [r["status"] for r in json.loads(out.stdout)]
    assert statuses == ["pass", "fail"]
