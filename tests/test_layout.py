"""Package layout: importing one module of ``fl/`` loads only what it needs, and
docs/architecture.md names every module and rule of the tree."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "fedmedbench"
DOC = ROOT / "docs" / "architecture.md"

#: the modules whose import registers a task
TASK_MODULES = {"fedmedbench.fl.tasks.classification", "fedmedbench.fl.tasks.segmentation.task", "fedmedbench.fl.tasks.detection.task"}
#: core modules: importing one loads no method and no task module
CORE = ("fedmedbench.fl", "fedmedbench.fl.api", "fedmedbench.fl.arrays", "fedmedbench.fl.registry", "fedmedbench.fl.spec", "fedmedbench.fl.tasks", "fedmedbench.fl.tasks.base",
        "fedmedbench.fl.job", "fedmedbench.fl.federation", "fedmedbench.fl.engine", "fedmedbench.fl.checkpoint",
        "fedmedbench.fl.client_state", "fedmedbench.fl.data", "fedmedbench.fl.training", "fedmedbench.fl.stopping",
        "fedmedbench.fl.method_params", "fedmedbench.fl.inline_grid")

# One clean interpreter loads the third-party libraries once, then imports each module in a forked
# child of its own (a fresh sys.modules per module, without paying torch's start-up every time).
_PROBE = r"""
import json, os, sys
import numpy, torch, flwr.app, flwr.serverapp, flwr.clientapp  # noqa: F401  (third-party, shared by the children)
assert not [m for m in sys.modules if m.startswith("fedmedbench")]
out = {}
for name in sys.argv[1:]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            if name.startswith("task:"):  # look a task up through the registry: where its class comes from
                from fedmedbench.fl.tasks.base import get_task_class
                loaded = [get_task_class(name[5:]).__module__]
            else:
                __import__(name)
                loaded = sorted(m for m in sys.modules if m.startswith("fedmedbench.fl."))
        except BaseException as e:  # reported, not swallowed
            loaded = {"error": repr(e)}
        os.write(w, json.dumps(loaded).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    out[name] = json.loads(data)
print(json.dumps(out))
"""


def _modules(root: Path) -> list[str]:
    """Dotted names of every module and package under ``root`` (a folder of src/fedmedbench)."""
    names = []
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


FL_MODULES = _modules(SRC / "fl")
METHOD_MODULES = {m for m in FL_MODULES if m.startswith("fedmedbench.fl.methods.")}
CORE = (*CORE, "fedmedbench.fl.methods")


@pytest.fixture(scope="module")
def loaded() -> dict[str, list[str]]:
    res = subprocess.run([sys.executable, "-c", _PROBE, *FL_MODULES, "task:classification", "task:segmentation"], capture_output=True, text=True, timeout=600,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_module_names_cover_fl():
    assert "fedmedbench.fl.registry" in FL_MODULES and "fedmedbench.fl.tasks.detection.yolo" in FL_MODULES
    assert len(METHOD_MODULES) > 10


@pytest.mark.parametrize("name", CORE)
def test_core_module_imports_no_method_or_task(loaded, name):
    mods = loaded[name]
    assert isinstance(mods, list), mods
    assert not [m for m in mods if m.startswith("fedmedbench.fl.methods.")], f"{name} imports methods"
    assert not [m for m in mods if m in TASK_MODULES or m.startswith(("fedmedbench.fl.tasks.detection", "fedmedbench.fl.tasks.segmentation"))], \
        f"{name} imports tasks"


def test_no_single_module_imports_the_whole_package(loaded):
    for name in FL_MODULES:
        mods = loaded[name]
        assert isinstance(mods, list), (name, mods)
        assert not METHOD_MODULES <= set(mods), f"{name} imports every method"
        assert not TASK_MODULES <= set(mods), f"{name} imports every task"


def test_a_task_module_imports_no_other_task(loaded):
    for name in TASK_MODULES:
        assert set(loaded[name]) & TASK_MODULES == {name}, name


def test_tasks_register_when_looked_up(loaded):
    """The registry loads no task on import (above), yet finds each when looked up."""
    assert loaded["task:classification"] == ["fedmedbench.fl.tasks.classification"]
    assert loaded["task:segmentation"] == ["fedmedbench.fl.tasks.segmentation.task"]


def test_the_segmentation_package_loads_no_task(loaded):
    """The methods import its training loop; the task registers only when looked up."""
    assert "fedmedbench.fl.tasks.segmentation.training" in loaded["fedmedbench.fl.tasks.segmentation"]
    assert not set(loaded["fedmedbench.fl.tasks.segmentation"]) & TASK_MODULES
    assert not set(loaded["fedmedbench.fl.methods.seg_fedavg"]) & TASK_MODULES


def _module_level_imports(name: str) -> set[str]:
    """The fl modules ``name`` imports outside its functions (``if TYPE_CHECKING:`` blocks included:
    a type-only import is a dependency too); ``from pkg import mod`` counts as ``pkg.mod``."""
    path = SRC.parent / (name.replace(".", "/") + ".py")
    if not path.exists():
        path = path.with_suffix("") / "__init__.py"
    found: set[str] = set()

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                package = name.split(".")[: None if path.name == "__init__.py" else -1]
                base = ".".join([*package[: len(package) - node.level + 1], node.module or ""]) if node.level else node.module
                found.update([base, *(f"{base}.{a.name}" for a in node.names)])
            elif isinstance(node, ast.If | ast.Try):
                walk(node.body + node.orelse + [s for h in getattr(node, "handlers", []) for s in h.body])

    walk(ast.parse(path.read_text()).body)
    return {m.rstrip(".") for m in found} & set(FL_MODULES) - {name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of ``graph``: one path that comes back to its start, per circle found by a depth-first walk."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                out.append([*path[path.index(w):], w])
            elif w not in state:
                visit(w)
        path.pop()
        state[v] = 2

    for v in sorted(graph):
        if v not in state:
            visit(v)
    return out


def test_no_import_circle_among_fl_modules():
    graph = {m: _module_level_imports(m) for m in FL_MODULES}
    assert graph["fedmedbench.fl.registry"] >= {"fedmedbench.fl.api"}
    assert graph["fedmedbench.fl.spec"] == set(), "spec.py is read while the workflow plans: it imports nothing of fl/"
    assert _cycles(graph) == []


def test_the_circle_finder_sees_type_only_imports_and_finds_a_circle():
    assert "fedmedbench.fl.spec" in _module_level_imports("fedmedbench.fl.api")  # under TYPE_CHECKING
    assert "fedmedbench.fl.training" not in _module_level_imports("fedmedbench.fl.api")  # inside a method
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


def _package_map() -> set[str]:
    text = DOC.read_text()
    section = text.split("## Package map", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^- `([^`]+\.py)`", section, flags=re.M))


def test_architecture_lists_every_module():
    tree = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py")}
    listed = _package_map()
    assert sorted(tree - listed) == [], "modules missing from docs/architecture.md"
    assert sorted(listed - tree) == [], "docs/architecture.md lists modules that do not exist"


def test_architecture_names_every_rule():
    text = DOC.read_text()
    rules = {m for f in (ROOT / "rules").glob("*.smk") for m in re.findall(r"^rule (\w+):", f.read_text(), flags=re.M)}
    assert rules and sorted(r for r in rules if f"`{r}`" not in text) == []
    for f in (ROOT / "rules").glob("*.smk"):
        assert f"rules/{f.name}" in text, f.name


def _workflow_imports() -> list[str]:
    """The fedmedbench modules the Snakefile and rules/*.smk import (what the workflow reads while it plans)."""
    text = "\n".join(p.read_text() for p in [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))])
    names = set(re.findall(r"^import (fedmedbench[\w.]*)", text, flags=re.M))
    for pkg, what in re.findall(r"^from (fedmedbench[\w.]*) import ([\w, ]+)", text, flags=re.M):
        for item in (w.strip() for w in what.split(",")):
            names.add(f"{pkg}.{item}" if (SRC.parent / pkg.replace(".", "/") / f"{item}.py").exists() else pkg)
    return sorted(names)


def test_workflow_plans_without_torch():
    """Every Snakemake invocation (and each SLURM job, which runs Snakemake twice) parses the workflow:
    importing torch there would cost seconds per invocation."""
    names = _workflow_imports()
    assert {"fedmedbench.studies.fedst.runs", "fedmedbench.fl.spec", "fedmedbench.configcheck"} <= set(names), names
    probe = ("import sys\nfor n in sys.argv[1:]: __import__(n)\n"
             "print(sorted(m for m in ('torch', 'flwr', 'timm', 'ultralytics', 'sklearn') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", probe, *names], capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == "[]", res.stdout
