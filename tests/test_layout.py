"""Package layout: folders named by job (a few modules at the root and in ``fl/``, each folder saying what it
holds), no import circle anywhere in ``src/``, importing one module of ``fl/`` loads only what it needs, and
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
CORE = ("fedmedbench.fl", "fedmedbench.fl.api", "fedmedbench.fl.api.arrays", "fedmedbench.fl.api.registry", "fedmedbench.fl.spec", "fedmedbench.fl.tasks", "fedmedbench.fl.tasks.base",
        "fedmedbench.fl.engine.job", "fedmedbench.fl.engine.federation", "fedmedbench.fl.engine.flower", "fedmedbench.fl.state.checkpoint",
        "fedmedbench.fl.state.client_state", "fedmedbench.fl.data", "fedmedbench.fl.training", "fedmedbench.fl.stopping",
        "fedmedbench.fl.api.method_params", "fedmedbench.fl.engine.inline_grid")

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
    assert "fedmedbench.fl.api.registry" in FL_MODULES and "fedmedbench.fl.tasks.detection.yolo" in FL_MODULES
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
    assert graph["fedmedbench.fl.api.registry"] >= {"fedmedbench.fl.api.method"}
    assert graph["fedmedbench.fl.spec"] == set(), "spec.py is read while the workflow plans: it imports nothing of fl/"
    assert _cycles(graph) == []


SRC_MODULES = _modules(SRC)


def _static_imports(name: str) -> set[str]:
    """The package's modules ``name`` imports anywhere in its text (inside functions too), except under
    ``if TYPE_CHECKING:``; ``from pkg import mod`` counts as ``pkg.mod``, ``from pkg import name`` as ``pkg``."""
    path = SRC.parent / (name.replace(".", "/") + ".py")
    if not path.exists():
        path = path.with_suffix("") / "__init__.py"
    package = name.split(".")[: None if path.name == "__init__.py" else -1]
    found: set[str] = set()

    class Imports(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            if "TYPE_CHECKING" in ast.unparse(node.test):
                for stmt in node.orelse:
                    self.visit(stmt)
                return
            self.generic_visit(node)

        def visit_Import(self, node: ast.Import) -> None:
            found.update(a.name for a in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            base = ".".join([*package[: len(package) - node.level + 1], node.module or ""]) if node.level else node.module
            base = (base or "").rstrip(".")
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in SRC_MODULES else base for a in node.names)

    Imports().visit(ast.parse(path.read_text()))
    return found & set(SRC_MODULES) - {name}


def test_no_import_circle_anywhere_in_src():
    """A circle of imports (even one closed inside a function) means two modules each need the other: one of
    them holds something of the other's job."""
    graph = {m: _static_imports(m) for m in SRC_MODULES}
    assert "fedmedbench.metrics.scoring" in graph["fedmedbench.metrics.segmentation_device"]
    assert _cycles(graph) == []


def test_the_src_circle_finder_sees_imports_inside_functions_but_not_type_only_ones():
    assert "fedmedbench.fl.augment" in _static_imports("fedmedbench.fl.api.method")  # inside a method
    assert "fedmedbench.fl.api.method" not in _static_imports("fedmedbench.fl.augment")  # under TYPE_CHECKING
    assert "fedmedbench.fl.methods._together" in _static_imports("fedmedbench.fl.methods._sgd")  # `from pkg import mod`


#: at most this many modules side by side: the package root holds entry points, ``fl/`` the pieces every
#: method and job shares; everything else lives in a folder named by its job
MAX_MODULES = {SRC: 5, SRC / "fl": 10}


@pytest.mark.parametrize("folder", list(MAX_MODULES), ids=lambda p: str(p.relative_to(SRC.parent)))
def test_a_folder_holds_few_modules_side_by_side(folder):
    assert len(list(folder.glob("*.py"))) <= MAX_MODULES[folder], sorted(p.name for p in folder.glob("*.py"))


def test_every_subpackage_says_what_it_holds():
    """A newcomer finds where a thing goes from the folder names and their ``__init__`` docstrings."""
    silent = [str(p.relative_to(SRC)) for p in SRC.rglob("__init__.py")
              if p.parent != SRC and len(ast.get_docstring(ast.parse(p.read_text())) or "") < 40]
    assert silent == []


def test_the_method_api_is_one_import_path():
    """A user's method file imports everything from ``fedmedbench.fl.api`` (README, examples/methods)."""
    import fedmedbench.fl.api as api

    for name in api.__all__:
        assert getattr(api, name) is not None, name
    assert api.Method.__module__ == "fedmedbench.fl.api.method"
    assert api.register_method.__module__ == "fedmedbench.fl.api.registry"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        api.nope  # noqa: B018


def test_the_circle_finder_sees_type_only_imports_and_finds_a_circle():
    assert "fedmedbench.fl.spec" in _module_level_imports("fedmedbench.fl.api.method")  # under TYPE_CHECKING
    assert "fedmedbench.fl.training" not in _module_level_imports("fedmedbench.fl.api.method")  # inside a method
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
    assert {"fedmedbench.studies.fedst.runs", "fedmedbench.fl.spec", "fedmedbench.config.check"} <= set(names), names
    probe = ("import sys\nfor n in sys.argv[1:]: __import__(n)\n"
             "print(sorted(m for m in ('torch', 'flwr', 'timm', 'ultralytics', 'sklearn') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", probe, *names], capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.strip().splitlines()[-1] == "[]", res.stdout


#: a place asking whether a value is a tensor or a NumPy array (``torch.is_tensor``, ``isinstance(..., torch.Tensor)``,
#: ``isinstance(..., np.ndarray)``)
ARRAY_KIND_CHECK = re.compile(r"\bis_tensor\w*\(|\bisinstance\(.*?\b(?:torch\.Tensor|np\.ndarray|numpy\.ndarray)\b")
#: where ``fl/`` may ask it: at the message boundary, where checkpoint files walk a state's nested values, and
#: where Ultralytics' label caches are written as files without pickle (their values are NumPy, not model arrays)
ARRAY_KIND_BOUNDARY = {"fl/engine/flower.py", "fl/engine/inline_grid.py", "fl/state/checkpoint.py", "fl/state/file_format.py", "fl/state/client_state.py",
                       "fl/tasks/detection/label_cache.py"}
MAX_ARRAY_KIND_CHECKS = 6


def _lines_matching(paths, found) -> list[str]:
    return [f"{p.relative_to(SRC)}:{i}" for p in paths for i, line in enumerate(p.read_text().splitlines(), 1) if found(line)]


def test_fl_asks_whether_an_array_is_a_tensor_only_at_its_boundary():
    """Model arrays are tensors everywhere inside fl/: no method or helper keeps a NumPy branch."""
    found = _lines_matching(sorted((SRC / "fl").rglob("*.py")), ARRAY_KIND_CHECK.search)
    assert len(found) <= MAX_ARRAY_KIND_CHECKS, found
    assert all(f.split(":")[0] in ARRAY_KIND_BOUNDARY for f in found), found


def test_the_array_kind_finder_sees_each_form():
    lines = ["if torch.is_tensor(v):", "isinstance(obj, torch.Tensor)", "isinstance(a, (np.ndarray, list))",
             "isinstance(next(iter(arrays.values())), torch.Tensor)", "if is_tensor_arrays(new):",
             "if isinstance(x, dict):", "isinstance(arr, HeldArray)"]
    assert [bool(ARRAY_KIND_CHECK.search(line)) for line in lines] == [True] * 5 + [False] * 2


def test_no_method_opts_into_device_arrays():
    """One array path for every method: no ``device_arrays`` flag, field or option anywhere in the package."""
    assert _lines_matching(sorted(SRC.rglob("*.py")), lambda line: "device_arrays" in line) == []
