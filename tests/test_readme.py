"""The README stays a short page of tasks, and its example configs do not mislead: every example value equals
the schema default, or its line says that it is not (a copied example must not silently change a setting)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SCHEMA = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())
#: pages whose yaml examples are held to the schema defaults
PAGES = (README, ROOT / "docs" / "configuration.md")
#: what a line says where its value is not the default
NOT_DEFAULT = "not the default"


def _resolve(node: Any) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        node = SCHEMA["definitions"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def _child(node: Any, key: str) -> Any:
    """The schema of ``node``'s entry ``key``: a named property, else the schema of free-form entries."""
    node = _resolve(node)
    if not isinstance(node, dict):
        return None
    if key in (node.get("properties") or {}):
        return _resolve(node["properties"][key])
    for pattern, sub in (node.get("patternProperties") or {}).items():
        if re.search(pattern, key):
            return _resolve(sub)
    extra = node.get("additionalProperties")
    return _resolve(extra) if isinstance(extra, dict) else None


def _has_children(node: Any) -> bool:
    return isinstance(node, dict) and bool(node.get("properties") or node.get("patternProperties")
                                           or isinstance(node.get("additionalProperties"), dict))


def _mismatches(value: yaml.Node, schema: Any, path: str, lines: list[str]) -> list[str]:
    """Keys under ``value`` whose example differs from the schema default on a line that does not say so."""
    out = []
    if not isinstance(value, yaml.MappingNode):
        return out
    for key_node, val_node in value.value:
        key = key_node.value
        if NOT_DEFAULT in lines[key_node.start_mark.line]:
            continue  # this key, and everything under it, is marked as an example value
        sub = _child(schema, key)
        name = f"{path}.{key}" if path else key
        if isinstance(val_node, yaml.MappingNode) and _has_children(sub):
            out += _mismatches(val_node, sub, name, lines)
        elif isinstance(sub, dict) and "default" in sub:
            example = yaml.safe_load(yaml.serialize(val_node))
            if example != sub["default"]:
                out.append(f"{name}: {example!r} (default {sub['default']!r}), line {key_node.start_mark.line + 1}: "
                           f"{lines[key_node.start_mark.line].strip()}")
    return out


def _yaml_blocks(page: Path) -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S)


def test_readme_is_at_most_200_lines():
    assert len(README.read_text().splitlines()) <= 200


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_example_config_values_are_the_defaults_or_say_they_are_not(page):
    blocks = _yaml_blocks(page)
    assert blocks, f"{page.name} has no yaml example"
    wrong = []
    for block in blocks:
        wrong += _mismatches(yaml.compose(block), SCHEMA, "", block.splitlines())
    assert wrong == []


def test_the_own_dataset_example_is_a_valid_config():
    from fedmedbench.workflow.diagnostics import validate_config

    block = next(b for b in _yaml_blocks(README) if "datasets:\n  mydata:" in b)
    validate_config(yaml.safe_load(block), ROOT / "config" / "schema.yaml")


def test_the_check_catches_a_changed_default():
    """The example the README had: momentum 0.9 and 50 rounds, shown as if they were the defaults."""
    block = "studies:\n  s:\n    train: {rounds: 50, lr: 0.01, momentum: 0.9}\n"
    wrong = _mismatches(yaml.compose(block), SCHEMA, "", block.splitlines())
    assert [w.split(":")[0] for w in wrong] == ["studies.s.train.rounds", "studies.s.train.momentum"]
    marked = "studies:\n  s:\n    train: {rounds: 50, momentum: 0.9}   # not the default: the paper's\n"
    assert _mismatches(yaml.compose(marked), SCHEMA, "", marked.splitlines()) == []


def test_readme_links_resolve():
    for target in re.findall(r"\]\(([^)#]+)\)", README.read_text()):
        if "://" not in target:
            assert (ROOT / target).exists(), target
    index = ROOT / "docs" / "README.md"
    for target in re.findall(r"\]\(([^)#]+)\)", index.read_text()):
        assert (index.parent / target).exists(), target
    listed = set(re.findall(r"\]\(([\w.-]+\.md)\)", index.read_text()))
    assert {p.name for p in (ROOT / "docs").glob("*.md")} - {"README.md"} <= listed, "a docs page missing from docs/README.md"
