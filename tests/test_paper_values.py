"""Paper values beside the run's numbers: lookup by key, difference, synthetic layout."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fedmedbench.report import paper_values


@pytest.fixture
def paper_yaml(tmp_path):
    (tmp_path / "demo.yaml").write_text(
        "paper: Someone et al., 2025\n"
        "tables:\n"
        "  t1:\n"
        "    source: Table 1\n"
        "    keys: [setting, method]\n"
        "    rows:\n"
        "      - {setting: a, method: fedavg, accuracy: 70.0}\n"
        "      - {setting: a, method: moon, accuracy: 72.5}\n")
    return tmp_path


def test_beside_adds_paper_value_and_difference(paper_yaml):
    table = paper_values.load("demo", "t1", root=paper_yaml)
    frame = pd.DataFrame({"setting": ["a", "a", "b"], "method": ["fedavg", "moon", "fedavg"],
                          "accuracy": [71.0, 70.0, 50.0]})
    out = paper_values.beside(frame, table, {"accuracy": "accuracy"}, synthetic=False)
    assert list(out.columns) == ["setting", "method", "accuracy", "accuracy (paper)", "accuracy Δ"]
    assert out["accuracy (paper)"].tolist()[:2] == [70.0, 72.5]
    assert out["accuracy Δ"].tolist()[:2] == [1.0, -2.5]
    assert math.isnan(out["accuracy (paper)"].iloc[2]) and math.isnan(out["accuracy Δ"].iloc[2])


def test_synthetic_keeps_layout_without_difference(paper_yaml):
    table = paper_values.load("demo", "t1", root=paper_yaml)
    frame = pd.DataFrame({"setting": ["a"], "method": ["fedavg"], "accuracy": [99.0]})
    out = paper_values.beside(frame, table, {"accuracy": "accuracy"}, synthetic=True)
    assert out["accuracy (paper)"].iloc[0] == 70.0
    assert math.isnan(out["accuracy Δ"].iloc[0])
    assert "synthetic" in paper_values.note(table, synthetic=True)


def test_missing_study_or_table_is_none(paper_yaml):
    assert paper_values.load("nostudy", "t1", root=paper_yaml) is None
    assert paper_values.load("demo", "t9", root=paper_yaml) is None


def test_table_without_key_column_is_named(paper_yaml):
    table = paper_values.load("demo", "t1", root=paper_yaml)
    with pytest.raises(KeyError, match="setting"):
        paper_values.beside(pd.DataFrame({"method": ["fedavg"], "accuracy": [1.0]}), table,
                            {"accuracy": "accuracy"}, synthetic=False)
