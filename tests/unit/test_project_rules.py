"""Project-wide rules: no pickle anywhere, the wire library stays light, public APIs are pinned."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import tandem_wire

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ["shared", "services", "tools", "examples"]


def _python_files():
    for d in SOURCE_DIRS:
        yield from (ROOT / d).rglob("*.py") if (ROOT / d).exists() else ()


def test_no_pickle_imports():
    offenders = []
    for path in _python_files():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            if any(n.split(".")[0] in {"pickle", "cloudpickle", "dill", "_pickle"} for n in names):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert offenders == []


def _imported_modules(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print('\\n'.join(sys.modules))"],
        check=True,
        capture_output=True,
        text=True,
    )
    return {m.split(".")[0] for m in out.stdout.split()}


def test_client_imports_no_vllm_or_torch():
    # A trainer installs the client without vLLM.
    mods = _imported_modules("import tandem_client")
    assert not mods & {"vllm", "torch", "transformers", "fastapi"}


def test_wire_library_imports_no_vllm_torch_or_web_framework():
    # (numpy itself imports pickle; what matters is that our code never calls it: see above)
    mods = _imported_modules("import tandem_wire")
    assert not mods & {"vllm", "torch", "fastapi", "starlette", "transformers"}


def test_only_adapters_import_vllm():
    allowed = {"tandem_vllm"}
    offenders = []
    for path in (ROOT / "shared").rglob("*.py"):
        pkg = path.relative_to(ROOT / "shared").parts[0]
        if pkg in allowed:
            continue
        if "vllm" in {n.split(".")[0] for n in _module_imports(path)}:
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_front_door_imports_vllm_only_in_its_adapter():
    offenders = [
        path.name
        for path in (ROOT / "services" / "tandem_front").glob("*.py")
        if path.name != "vllm_answers.py"
        and "vllm" in {n.split(".")[0] for n in _module_imports(path)}
    ]
    assert offenders == []
    # Importing the app (as worker processes do) loads no vLLM: the adapter comes at start-up.
    mods = _imported_modules("import tandem_front.app, tandem_front.__main__")
    assert "vllm" not in mods


def _module_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_wire_public_api_is_pinned():
    assert sorted(tandem_wire.__all__) == sorted(
        [
            "ANY_WIRE_TRANSFORM",
            "BODY_CODING_HEADER",
            "BatchedLayout",
            "ChoiceLogprobs",
            "content_id",
            "named_by_content",
            "DEFAULT_LIMITS",
            "DEFAULT_ZSTD_LEVEL",
            "IDENTITY",
            "MIN_COMPRESSED_BYTES",
            "ZSTD",
            "accepts_coding",
            "body_coding",
            "compress_zstd",
            "decode_body",
            "UnsupportedContentEncoding",
            "DecodeLimits",
            "ErrorBody",
            "ErrorInfo",
            "FieldElem",
            "FieldLayout",
            "FieldTransform",
            "FlatLayout",
            "GenerateChoice",
            "GenerateRequest",
            "GenerateResponse",
            "GenerateStreamChoice",
            "GenerateStreamResponse",
            "GenerateTextChoice",
            "GenerateTextResponse",
            "GenerateTextStreamChoice",
            "GenerateTextStreamResponse",
            "InvalidDocument",
            "InvalidFieldLayout",
            "InvalidTensorData",
            "ItemBytes",
            "JSON_CONTENT_TYPE",
            "KwargsItem",
            "MSGPACK_CONTENT_TYPE",
            "MalformedBase64",
            "MalformedBody",
            "MalformedFrame",
            "MultiModalFeatures",
            "NestedTensors",
            "NestingTooDeep",
            "PayloadTooLarge",
            "PlaceholderRange",
            "PromptLogprob",
            "RAW_TENSOR_EXT",
            "SYSTEM_FINGERPRINT_HEADER",
            "ShapeMismatch",
            "SharedLayout",
            "TandemHTTPError",
            "TextLogprob",
            "TextLogprobContent",
            "TextLogprobs",
            "TokenLogprob",
            "TokenLogprobContent",
            "UnsupportedDtype",
            "UnsupportedExtType",
            "UnsupportedWireTransform",
            "UsageInfo",
            "WEIGHT_VERSIONS_HEADER",
            "PROMPT_TOKENS_DETAILS_HEADER",
            "WIRE_DTYPES",
            "WIRE_TRANSFORMS_HEADER",
            "WeightVersionSpan",
            "WireError",
            "WireFormat",
            "accepted_wire_transforms",
            "b64decode_item_bytes",
            "check_features",
            "check_placeholder_embeds",
            "decode_document",
            "decode_generate_request",
            "decode_generate_requests",
            "decode_item",
            "decode_item_b64",
            "decode_safetensors",
            "encode_document",
            "encode_generate_request",
            "encode_generate_request_parts",
            "msgpack_fields",
            "msgpack_pieces_with",
            "encode_generate_requests",
            "encode_item",
            "encode_item_b64",
            "encode_safetensors",
            "control",
            "error_types",
            "streams",
            "format_for_accept",
            "format_of_content_type",
            "new_request_id",
            "numpy_dtype",
            "wire_dtype_name",
        ]
    )
    for name in tandem_wire.__all__:
        assert hasattr(tandem_wire, name)


def test_every_wire_error_has_a_distinct_stable_type():
    errors = [getattr(tandem_wire, n) for n in tandem_wire.__all__]
    errors = [e for e in errors if isinstance(e, type) and issubclass(e, tandem_wire.WireError)]
    types = [e.type for e in errors if e is not tandem_wire.WireError]
    assert len(types) == len(set(types))
    assert all(400 <= e.status_code < 500 for e in errors)
