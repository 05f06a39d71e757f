"""McpTool generation: schemas and descriptions from type hints and docstrings, YAML output."""

from __future__ import annotations

import subprocess
import sys

import pytest
from runner_support import subprocess_env

from toolyard import _docstring, _yaml
from toolyard.manifest import ManifestError, Options, generate, tool_document

IMAGE = "example.org/tools:1"


def spec_of(target: str, **options) -> dict:
    return tool_document(target, Options(image=IMAGE, **options))["spec"]


def test_google_docstring_gives_descriptions_and_defaults():
    spec = spec_of("sample_tools:quote")
    assert spec["name"] == "quote" and spec["title"] == "Quote"
    assert spec["description"] == "Price a multi-leg trade.\n\nThe total is a plain sum, good enough for tests."
    schema = spec["inputSchema"]
    assert schema["required"] == ["legs"] and schema["additionalProperties"] is False
    legs, side, note = (schema["properties"][n] for n in ("legs", "side", "note"))
    assert legs["description"] == "The legs to price, in order."
    assert legs["items"]["properties"]["strike"] == {"description": "Strike price.", "type": "number"}
    assert legs["items"]["required"] == ["strike"]
    assert side == {
        "description": "Whether we buy or sell.", "type": "string", "enum": ["buy", "sell"], "default": "buy",
    }  # fmt: skip
    assert note == {
        "description": "Free text, ignored.", "anyOf": [{"type": "string"}, {"type": "null"}], "default": None,
    }  # fmt: skip


def test_sphinx_docstring_and_tuple_default():
    spec = spec_of("sample_tools:describe")
    tags = spec["inputSchema"]["properties"]["tags"]
    assert spec["inputSchema"]["properties"]["name"]["description"] == "What to describe."
    assert tags["description"] == "A label and a weight." and tags["default"] == ["x", 1]
    assert tags["prefixItems"] == [{"type": "string"}, {"type": "integer"}]


def test_dataclass_result_is_the_output_schema():
    output = spec_of("sample_tools:quote")["outputSchema"]
    assert output["type"] == "object" and output["required"] == ["total", "side"]
    side = {"description": "Trade direction.", "type": "string", "enum": ["buy", "sell"]}
    assert output["properties"]["side"] == side


def test_non_object_result_is_wrapped_like_the_gateway_does():
    assert spec_of("sample_tools:add")["outputSchema"] == {
        "type": "object",
        "properties": {"result": {"description": "The sum.", "type": "number"}},
        "required": ["result"],
    }


@pytest.mark.parametrize("target", ["sample_tools:anything", "sample_tools:undocumented", "sample_tools:maybe"])
def test_output_schema_is_omitted_when_unknown_or_ambiguous(target):
    assert "outputSchema" not in spec_of(target)


def test_dict_result_is_an_object():
    output = spec_of("sample_tools:talk")["outputSchema"]
    assert output == {"type": "object", "additionalProperties": {"type": "string"}}


def test_job_document_shape():
    doc = tool_document("sample_tools:add", Options(image=IMAGE))
    assert list(doc) == ["apiVersion", "kind", "metadata", "spec"]
    assert doc["metadata"] == {"name": "add"}
    assert list(doc["spec"]) == ["name", "title", "description", "inputSchema", "outputSchema",
                                 "annotations", "runtime", "execution"]  # fmt: skip
    assert doc["spec"]["annotations"] == {"openWorldHint": False}
    assert doc["spec"]["runtime"] == {"image": IMAGE, "command": ["python3", "-m", "toolyard.run", "sample_tools:add"]}
    assert doc["spec"]["execution"] == {"mode": "Job", "timeoutSeconds": 60}


def test_pool_read_only_document_shape():
    doc = tool_document(
        "sample_tools:read_stdin",
        Options(image=IMAGE, namespace="ns", toolset="t", mode="Pool", reuse=True, replicas=3, queue=0, timeout=5,
                read_only=True, name="Read_Input"),
    )  # fmt: skip
    assert doc["metadata"] == {"name": "read-input", "namespace": "ns"}
    spec = doc["spec"]
    assert (spec["name"], spec["title"], spec["toolset"]) == ("Read_Input", "Read Input", "t")
    assert spec["annotations"] == {
        "readOnlyHint": True, "idempotentHint": True, "destructiveHint": False, "openWorldHint": False,
    }  # fmt: skip
    assert spec["execution"] == {
        "mode": "Pool", "timeoutSeconds": 5, "pool": {"replicas": 3, "reuseProcess": True, "queue": 0},
    }  # fmt: skip


def test_missing_docstring_falls_back_to_the_title(capsys):
    assert spec_of("sample_tools:undocumented")["description"] == "Undocumented"
    assert "no docstring" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("targets", "options", "fragment"),
    [
        (["sample_tools:bad_type"], {}, "function 'bad_type': parameter 'values': set[int] has no JSON equivalent"),
        (["sample_tools:varargs"], {}, "parameter 'values' is variadic positional"),
        (["no_such_module:f"], {}, "cannot import module 'no_such_module'"),
        (["sample_tools:add"], {"name": "not-valid"}, "tool name 'not-valid' must match"),
        (["sample_tools:add"], {"name": "_x"}, "'-x' (from '_x') is not a valid Kubernetes name"),
        (["sample_tools:add", "sample_tools:count"], {"name": "x"}, "--name can only be used with a single function"),
        (["sample_tools:add", "sample_tools:add"], {}, "both become McpTool 'add'"),
    ],
)
def test_errors(targets, options, fragment):
    with pytest.raises(ManifestError) as info:
        generate(targets, Options(image=IMAGE, **options))
    assert fragment in str(info.value)


def manifest_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolyard.manifest", *args], capture_output=True, text=True, env=subprocess_env()
    )


def test_cli_writes_deterministic_multi_document_yaml():
    args = ["sample_tools:quote", "sample_tools:add", "--image", IMAGE, "--toolset", "t", "--read-only"]
    first, second = manifest_cli(*args), manifest_cli(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout == second.stdout
    assert first.stdout.startswith('---\napiVersion: "toolyard.dev/v1alpha1"\nkind: "McpTool"\n')
    assert first.stdout.count("\n---\n") == 1


def test_cli_yaml_reads_back_as_the_documents():
    yaml = pytest.importorskip("yaml")  # PyYAML is only a test-time convenience
    proc = manifest_cli("sample_tools:quote", "sample_tools:describe", "--image", IMAGE, "--mode", "Pool")
    options = Options(image=IMAGE, mode="Pool")
    assert list(yaml.safe_load_all(proc.stdout)) == [
        tool_document("sample_tools:quote", options),
        tool_document("sample_tools:describe", options),
    ]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["sample_tools:add", "--image", IMAGE, "--reuse"], "--reuse, --replicas and --queue need --mode Pool"),
        (["sample_tools:add", "--image", IMAGE, "--queue", "2"], "--reuse, --replicas and --queue need --mode Pool"),
        (["sample_tools:add", "--image", IMAGE, "--mode", "Pool", "--queue", "5000"], "must be from 0 to 4096"),
        (["sample_tools:add", "--image", IMAGE, "--timeout", "0"], "must be a positive integer"),
        (["sample_tools:bad_type", "--image", IMAGE], "toolyard.manifest: error: sample_tools:bad_type: function"),
        (["sample_tools:add"], "the following arguments are required: --image"),
    ],
)
def test_cli_errors_exit_2(args, fragment):
    proc = manifest_cli(*args)
    assert proc.returncode == 2 and proc.stdout == ""
    assert fragment in proc.stderr


def test_yaml_quotes_what_could_be_misread():
    data = {"on": "yes", "a b": 1e-05, "list": [1, None, True], "nested": [{"k": []}], "e": {}, "s": "\u2028\x85"}
    text = _yaml.dump(data)
    assert text == (
        '"on": "yes"\n'
        '"a b": 1.0e-05\n'
        "list: [1, null, true]\n"
        "nested:\n"
        "  - k: []\n"
        "e: {}\n"
        's: "\\u2028\\u0085"\n'
    )
    yaml = pytest.importorskip("yaml")
    assert yaml.safe_load(text) == data


def test_docstring_sections():
    doc = _docstring.parse(
        """Summary.

        Body that is
        wrapped.

        - first item
        - second item

        Args:
            x (int): The x.
            y: The y,
                continued.

                Second paragraph.

        Returns:
            float: The answer.

        Raises:
            ValueError: never documented as a parameter.
        """
    )
    assert doc.description == "Summary.\n\nBody that is wrapped.\n\n- first item\n- second item"
    assert doc.params == {"x": "The x.", "y": "The y, continued.\n\nSecond paragraph."}
    assert doc.returns == "The answer."
    assert doc.attributes == {}
