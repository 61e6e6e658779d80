"""One source per list of names: the package's constants are the truth, and every copy that cannot
import them (the schema's enums, tables keyed by the same names) must agree with them exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fedmedbench.data import medmnist
from fedmedbench.data.surgical import facts, index, synthetic_layouts

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = yaml.safe_load((ROOT / "config" / "schema.yaml").read_text())


def enums(node: Any, path: str = "") -> list[tuple[str, list]]:
    """Every ``enum`` of a JSON schema, with the path of the node that holds it."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "enum" and isinstance(value, list):
                found.append((path, value))
            else:
                found += enums(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += enums(value, f"{path}[{i}]")
    return found


def enums_sharing(names: tuple) -> dict[str, list]:
    """The schema's enums that share a name with ``names`` (each must then be all of it, in order)."""
    return {path: values for path, values in enums(SCHEMA) if set(values) & set(names)}


def test_enum_walk_finds_the_enums_it_should():
    found = dict(enums({"a": {"enum": [1, 2]}, "b": [{"c": {"enum": ["x"]}}]}))
    assert found == {"/a": [1, 2], "/b[0]/c": ["x"]}


RELEASE = "/definitions/surgical_dataset/properties/release"


@pytest.mark.parametrize("names,holders", [
    (medmnist.SUPPORTED_FLAGS, {"/definitions/dataset_flag"}),
    (medmnist.SIZES, {"/definitions/user_dataset/properties/sizes/items", "/definitions/study/properties/size"}),
    # the release names (facts.FRAME_RATES) share two names with the layouts: that enum is the release list
    (tuple(index.LAYOUTS), {"/definitions/surgical_dataset/properties/layout", RELEASE}),
], ids=["medmnist_flags", "medmnist_sizes", "surgical_layouts"])
def test_schema_enums_are_the_packages_lists(names, holders):
    lists = {RELEASE: [*facts.FRAME_RATES, None], "/definitions/surgical_dataset/properties/layout": list(index.LAYOUTS)}
    shared = enums_sharing(names)
    assert set(shared) == holders, f"config/schema.yaml enums holding these names moved or multiplied: {sorted(shared)}"
    for path, values in shared.items():
        expected = lists.get(path, list(names))
        assert values == expected, f"config/schema.yaml {path}: {values} differs from the package's {expected}"


def test_tables_keyed_by_layout_name_only_known_layouts():
    """Synthetic writers, official frame rates and published counts exist for some layouts, never for another name."""
    layouts = set(index.LAYOUTS)
    for table in (synthetic_layouts.WRITERS, synthetic_layouts.OFFICIAL_FPS, facts.PUBLISHED):
        assert set(table) <= layouts, sorted(set(table) - layouts)
    assert set(synthetic_layouts.WRITERS) == layouts - {"yolo", "coco"}  # the generic folders have no stand-in


def test_workflow_takes_flags_and_sizes_from_the_package():
    """rules/common.smk imports both lists instead of spelling them out."""
    text = (ROOT / "rules" / "common.smk").read_text()
    assert "from fedmedbench.data.medmnist import SUPPORTED_FLAGS as OFFICIAL_FLAGS" in text
    assert '"|".join(map(str, SIZES))' in text
    assert not [f for f in medmnist.SUPPORTED_FLAGS if f'"{f}"' in text]
