"""The vLLM internals the services rely on are all there, and the check says so when one is not."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

pytest.importorskip("vllm")

from vllm.entrypoints.scale_out.render.serving import ServingRender  # noqa: E402
from vllm.renderers.base import BaseRenderer  # noqa: E402

from tandem_vllm.upstream_names import (  # noqa: E402
    UPSTREAM_NAMES,
    UpstreamChanged,
    UpstreamName,
    check_upstream_names,
    signature_of,
)

ROOT = Path(__file__).resolve().parents[3]


def test_installed_vllm_has_every_name_as_expected():
    check_upstream_names()


def test_each_side_checks_only_its_own_names():
    check_upstream_names(["render"])
    check_upstream_names(["generate"])
    check_upstream_names(["front"])
    assert {n.side for n in UPSTREAM_NAMES} == {"render", "generate", "front"}


def test_a_missing_method_fails_naming_it(monkeypatch):
    monkeypatch.delattr(ServingRender, "_placeholder_metadata_fields")
    with pytest.raises(
        UpstreamChanged, match=r"ServingRender\._placeholder_metadata_fields: missing"
    ):
        check_upstream_names(["render"])


def test_a_changed_signature_fails_naming_both(monkeypatch):
    def reshaped(self, engine_input, mm_payload="tensors"):  # keyword-only no more
        return None

    monkeypatch.setattr(ServingRender, "_extract_mm_features", reshaped)
    with pytest.raises(UpstreamChanged) as info:
        check_upstream_names(["render"])
    message = str(info.value)
    assert (
        "ServingRender._extract_mm_features: signature is (self, engine_input, mm_payload)"
        in message
    )
    assert "expected (self, engine_input, *, mm_payload)" in message


def test_a_missing_instance_attribute_or_module_fails():
    names = [
        UpstreamName("vllm.renderers.base:BaseRenderer._no_such_pool", None, "render", "test"),
        UpstreamName("vllm.no_such_module:Thing", None, "render", "test"),
    ]
    with pytest.raises(UpstreamChanged) as info:
        check_upstream_names(names=names)
    assert "BaseRenderer._no_such_pool: missing" in str(info.value)
    assert "vllm.no_such_module cannot be imported" in str(info.value)


def test_instance_attributes_are_found_in_init():
    assert not hasattr(BaseRenderer, "_executor")  # so the __init__ scan is what finds it
    check_upstream_names(
        names=[UpstreamName("vllm.renderers.base:BaseRenderer._executor", None, "render", "t")]
    )


def test_signature_spelling():
    def f(a, /, b, *args, c, **kw): ...

    def g(a, *, b=1): ...

    assert signature_of(f) == ("a", "/", "b", "*args", "c", "**kw")
    assert signature_of(g) == ("a", "*", "b")


def _vllm_modules():
    for base in (ROOT / "services", ROOT / "shared" / "tandem_vllm"):
        for path in base.rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            if path.name != "upstream_names.py" and _imports_vllm(tree):
                yield path, tree


def _imports_vllm(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] == "vllm":
                return True
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "vllm" for a in node.names):
            return True
    return False


def _vllm_names(tree: ast.AST) -> set[str]:
    return {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vllm")
        for a in node.names
    }


def test_the_table_lists_every_internal_the_adapters_touch():
    # Private attributes reached on objects other than our own (self/cls), and methods our
    # subclasses of vLLM classes override: each must be an entry the start-up check covers.
    listed = {n.where.rpartition(".")[2] for n in UPSTREAM_NAMES}
    unlisted = []
    for path, tree in _vllm_modules():
        from_vllm = _vllm_names(tree)
        where = path.relative_to(ROOT)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
                own = isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"}
                if not node.attr.startswith("__") and not own and node.attr not in listed:
                    unlisted.append(f"{where}:{node.lineno} .{node.attr}")
            if isinstance(node, ast.ClassDef):
                bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                if not bases & from_vllm:
                    continue
                for item in node.body:
                    if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                        if item.name != "__init__" and item.name not in listed:
                            unlisted.append(f"{where}:{item.lineno} {node.name}.{item.name}")
    assert unlisted == []
