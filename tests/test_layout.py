"""The source tree's shape: `steps/` is one subpackage per stage, and no module imports its way back to itself.

An import cycle is found from the source alone (every `import` statement counts, those inside functions and
under `TYPE_CHECKING` included): a function-level import that closes a cycle still couples two modules that
should sit one below the other, and only hides the cycle until someone moves the import to the top.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from executor.dag.plan import build_plan
from experiments import hero_535b

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("executor", "steps", "experiments")
MAX_MODULES_PER_STAGE = 10
PINNED_HASHES = Path(__file__).parent / "data" / "hero_step_hashes.json"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """The project modules `path` imports: `from a.b import c` counts as a.b.c when that is a module, else a.b."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {module for module in found if module in modules and module != name}


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    return {name: imported_modules(path, set(paths)) for name, path in paths.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_its_way_back_to_itself() -> None:
    graph = import_graph()
    assert len(graph) > 80, "the walk found too few modules to mean anything"
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    module = ROOT / "steps" / "model" / "moe_block.py"
    modules = set(import_graph())
    assert "steps.model.config" in imported_modules(module, modules)


def test_steps_holds_one_documented_subpackage_per_stage() -> None:
    steps = ROOT / "steps"
    loose = sorted(path.name for path in steps.iterdir() if path.is_file())
    assert loose == ["README.md", "__init__.py"]
    stages = sorted(path for path in steps.iterdir() if path.is_dir() and path.name != "__pycache__")
    assert len(stages) >= 6
    readme = (steps / "README.md").read_text()
    for stage in stages:
        modules = [path for path in stage.glob("*.py") if path.name != "__init__.py"]
        assert 1 <= len(modules) <= MAX_MODULES_PER_STAGE, stage.name
        docstring = ast.get_docstring(ast.parse((stage / "__init__.py").read_text()))
        assert docstring and len(docstring.splitlines()) >= 2, f"steps/{stage.name}/__init__.py says nothing"
        assert f"steps/{stage.name}/" in readme, f"steps/README.md's map lacks steps/{stage.name}/"
        assert not list(stage.glob("*/*.py")), f"steps/{stage.name}/ nests packages"


@pytest.mark.parametrize("scale", ["tiny", "full"])
def test_the_hero_dags_hashes_change_only_on_purpose(scale: str) -> None:
    """Every step hash of the hero DAG is pinned: a refactor (moving modules, renaming them) changes none, and a
    change to what a step computes shows up here, to be recorded deliberately. The file was first written by
    planning both DAGs on the flat steps/ layout, before the steps/-by-stage move, which left every hash as it
    was; it is regenerated (in a commit of its own, saying why) when a recipe or the DAG's shape changes, as
    issues 19 (full recipe: sigmoid combine, bf16), 21 (the ladder's fit), 23 (global dedup) and 37 (the eval
    suite read from the locked packages, the lock file's sha256 versioned: a new lock changes the tiny hashes) did."""
    pinned = json.loads(PINNED_HASHES.read_text())[scale]
    dag = hero_535b.tiny_scale() if scale == "tiny" else hero_535b.full_scale()
    plan = build_plan(hero_535b.build_dag(dag).steps, "/prefix")
    assert {planned.name: planned.hash for planned in plan.steps} == pinned


STAGE_ORDER = ("data", "dedup", "filter", "tokenize", "model", "train", "evaluate", "scaling", "corpora")
"""steps/README.md's table, top to bottom: a stage imports only from the stages before it."""


def test_a_stage_imports_only_from_the_stages_before_it() -> None:
    graph = import_graph()
    on_disk = sorted(path.name for path in (ROOT / "steps").iterdir() if (path / "__init__.py").exists())
    assert sorted(STAGE_ORDER) == on_disk
    readme = (ROOT / "steps" / "README.md").read_text()
    assert sorted(STAGE_ORDER, key=lambda stage: readme.index(f"`steps/{stage}/`")) == list(STAGE_ORDER)
    upward = [
        f"{module} -> {dependency}"
        for module, dependencies in graph.items()
        for dependency in dependencies
        if module.startswith("steps.") and dependency.startswith("steps.") and dependency.count(".") >= 2
        if STAGE_ORDER.index(dependency.split(".")[1]) > STAGE_ORDER.index(module.split(".")[1])
    ]
    assert upward == []
