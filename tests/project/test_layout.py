"""The source tree's shape, and the page that describes it: executor/ in rooms, steps/ by stage, tests by source.

Who may import whom is import-linter's (`[tool.importlinter]` in pyproject.toml, run by `make test` before pytest):
the rooms of executor/ in layers, steps/'s stages in pipeline order, steps/ and experiments/ on the public API
only, no import cycles. These tests check what it cannot: that docs/contributing.md says the same as those
contracts, that each room lists its modules, that executor/'s root holds only the public API, and sizes.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
import tomllib

import pytest
from paths import DATA, REPO

from executor.dag.plan import build_plan
from experiments import hero_535b

ROOT = REPO
MAX_MODULES_PER_STAGE = 10
MAX_MODULE_LINES = 400
PINNED_HASHES = DATA / "hero_step_hashes.json"
CONTRIBUTING = ROOT / "docs" / "contributing.md"


def contract(contract_id: str) -> dict:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return next(found for found in contracts if found["id"] == contract_id)


def layer_modules(layer: str) -> list[str]:
    return [module.strip() for module in re.split(r"[|:]", layer)]


def test_make_test_runs_the_import_contracts_first() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: install lint-imports$", makefile, re.M)
    assert re.search(r"^lint-imports: tools\n\t.*lint-imports", makefile, re.M)


def test_executors_root_holds_only_the_public_api_errors_and_retry() -> None:
    executor = ROOT / "executor"
    assert sorted(path.name for path in executor.glob("*.py")) == [
        "__init__.py",
        "__main__.py",
        "errors.py",
        "retry.py",
    ]
    rooms = sorted(path.name for path in executor.iterdir() if (path / "__init__.py").exists())
    assert rooms == ["cli", "dag", "run", "shards", "store", "watch"]


def test_each_room_says_what_it_owns_and_lists_its_modules() -> None:
    for package in sorted((ROOT / "executor").rglob("__init__.py")):
        folder = package.parent
        if folder == ROOT / "executor":
            continue
        docstring = ast.get_docstring(ast.parse(package.read_text())) or ""
        relative = folder.relative_to(ROOT / "executor").as_posix()
        assert docstring.startswith(f"{relative}/:"), f"executor/{relative}/__init__.py does not open with its room"
        assert "import" in docstring.lower(), f"executor/{relative}/__init__.py does not say what it may import"
        for module in sorted(folder.glob("*.py")):
            if module.name != "__init__.py":
                assert re.search(rf"\b{re.escape(module.name)}\b", docstring), (
                    f"executor/{relative}/ lacks {module.name}"
                )


def test_no_module_of_executor_is_over_400_lines() -> None:
    long = {
        path.relative_to(ROOT).as_posix(): lines
        for path in (ROOT / "executor").rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def documented_rooms() -> dict[str, set[str]]:
    """docs/contributing.md's table of rooms: `executor/<room>/` -> the rooms it may import."""
    rows = re.findall(r"^\| `executor/(\w+)/` \| [^|]+ \| ([^|]+) \|$", CONTRIBUTING.read_text(), re.M)
    return {room: set(re.findall(r"\b(cli|watch|run|dag|shards|store)\b", may)) for room, may in rows}


def test_the_contributing_page_describes_the_rooms_the_contracts_enforce() -> None:
    layers = [layer_modules(layer) for layer in contract("executor-rooms")["layers"]]
    rooms = [module.removeprefix("executor.") for layer in layers for module in layer if len(layer) == 1]
    assert rooms[:6] == ["cli", "watch", "run", "dag", "shards", "store"]
    assert layers[-1] == ["executor.retry", "executor.errors"]
    assert documented_rooms() == {room: set(rooms[index + 1 : 6]) for index, room in enumerate(rooms[:6])}


def written(module: str) -> str:
    """How the page writes a module of watch/: `watch/site/` for a room, `app` for a module."""
    name = module.removeprefix("executor.watch.")
    return f"`watch/{name}/`" if (ROOT / "executor" / "watch" / name).is_dir() else f"`{name}`"


def test_the_contributing_page_describes_the_watch_rooms_and_the_stage_order() -> None:
    text = CONTRIBUTING.read_text()
    watch = [layer_modules(layer) for layer in contract("watch-rooms")["layers"]]
    said = text[text.index("Inside `watch/`") :].split("\n\n")[0]
    positions = [[said.index(written(module)) for module in layer] for layer in watch]
    assert all(max(upper) < min(lower) for upper, lower in itertools.pairwise(positions)), said
    stages = [module.removeprefix("steps.") for module in contract("steps-stages")["layers"]]
    assert stages[::-1] == list(STAGE_ORDER)
    public = contract("public-api")
    assert sorted(public["source_modules"]) == ["experiments", "steps"]
    rooms = {f"executor.{room}" for room in documented_rooms()} | {"executor.retry", "executor.errors"}
    assert set(public["forbidden_modules"]) == rooms


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
"""steps/README.md's table, top to bottom: a stage imports only from the stages before it (the `steps-stages`
contract, in pyproject.toml, lists them bottom to top)."""


def test_the_stages_readme_lists_them_in_pipeline_order() -> None:
    on_disk = sorted(path.name for path in (ROOT / "steps").iterdir() if (path / "__init__.py").exists())
    assert sorted(STAGE_ORDER) == on_disk
    readme = (ROOT / "steps" / "README.md").read_text()
    assert sorted(STAGE_ORDER, key=lambda stage: readme.index(f"`steps/{stage}/`")) == list(STAGE_ORDER)


def test_tests_mirror_the_source_with_helpers_in_support() -> None:
    """tests/executor/<room>/ for each room, tests/steps/<stage>/ for each stage with tests, tests/e2e/; every
    folder of tests on pytest's `pythonpath` (its modules are imported by name), no two test files of one name,
    none named for an issue, and nothing but tests in a test folder: helpers are tests/support/'s."""
    tests = ROOT / "tests"
    files = sorted(tests.rglob("test_*.py"))
    folders = {path.parent.relative_to(ROOT).as_posix() for path in files}
    pythonpath = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["pythonpath"]
    assert pythonpath[:3] == [".", "tests", "tests/support"]
    assert sorted(pythonpath[3:]) == sorted(folders)
    names = [path.name for path in files]
    assert sorted(name for name in set(names) if names.count(name) > 1) == []
    assert [name for name in names if re.search(r"issue|_\d+\.py$", name)] == []
    rooms = {path.name for path in (ROOT / "executor").iterdir() if (path / "__init__.py").exists()}
    assert {path.name for path in (tests / "executor").iterdir() if path.is_dir()} == rooms
    stages = {path.name for path in (tests / "steps").iterdir() if path.is_dir()}
    assert stages <= set(STAGE_ORDER) and len(stages) >= 7
    loose = [
        path.relative_to(tests).as_posix()
        for path in tests.rglob("*.py")
        if not path.name.startswith("test_") and path.parent.name != "support" and path.name != "conftest.py"
    ]
    assert loose == []
