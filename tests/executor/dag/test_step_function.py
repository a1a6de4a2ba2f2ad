"""A step's function given by reference, `"package.module:function"`: planned without importing its module, named
and fingerprinted as the function itself is, run in the process that runs the step, and a reference to nothing
refused when the DAG is planned."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from executor import THIS_OUTPUT_PATH, ConfigError, Executor, ExecutorStep, StepFunction, storage, versioned
from executor.dag.identity import code_fingerprint, function_name
from executor.dag.plan import build_plan
from executor.store.events import StepStatus, read_events

MODULE = '''
    """A step module whose import is seen: it appends to `IMPORTS` in the file named by its own constant."""
    import functools
    import json
    import os

    with open(os.path.join(os.path.dirname(__file__), "imports.log"), "a") as log:
        log.write(__name__ + "\\n")


    def write(config):
        """Writes the config's word."""
        with open(os.path.join(config.output_path, "word.json"), "w") as file:
            json.dump({"word": config.word}, file)  # a comment the fingerprint ignores


    def logged(fn):
        @functools.wraps(fn)
        def wrapper(config):
            return fn(config)

        return wrapper


    @logged
    def decorated(config):
        return write(config)


    class Steps:
        @staticmethod
        def nested(config):
            return write(config)


    if os.environ.get("NEVER_SET_BY_ANYONE"):
        conditional = write
    else:
        from json import dumps as imported
'''


@dataclass(frozen=True)
class WordConfig:
    word: str
    output_path: str = THIS_OUTPUT_PATH


@pytest.fixture
def step_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh module on sys.path (its name unique to the test, so no other test imported it)."""
    name = f"by_reference_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / f"{name}.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(folder))
    yield name
    sys.modules.pop(name, None)


def imports_of(module: str) -> list[str]:
    log = Path(importlib.util.find_spec(module).origin).parent / "imports.log"  # type: ignore[union-attr, arg-type]
    return log.read_text().split() if log.exists() else []


def test_a_step_by_reference_is_planned_without_its_module_and_named_and_fingerprinted_as_the_function(
    step_module: str, tmp_path: Path
) -> None:
    references = [f"{step_module}:{name}" for name in ("write", "decorated", "Steps.nested")]
    steps = [ExecutorStep(f"s{index}", reference, WordConfig(versioned("hi"))) for index, reference in
             enumerate(references)]  # fmt: skip
    plan = build_plan(steps, str(tmp_path / "prefix"))
    assert imports_of(step_module) == [] and step_module not in sys.modules
    planned = {step.name: step for step in plan.steps}

    module = importlib.import_module(step_module)
    functions = [module.write, module.decorated, module.Steps.nested]
    for index, (reference, function) in enumerate(zip(references, functions, strict=True)):
        assert isinstance(steps[index].fn, StepFunction) and steps[index].fn.load() is function
        assert planned[f"s{index}"].fn_name == reference == function_name(function)
        assert planned[f"s{index}"].fingerprint == code_fingerprint(function) is not None
    # The fingerprint reads the source as the function's does: comments and docstrings aside, a change shows.
    assert code_fingerprint(StepFunction(references[0])) != code_fingerprint(StepFunction(references[1]))
    # The same step by reference or by the function is one step: the same hash and path.
    by_function = build_plan([ExecutorStep("s0", module.write, WordConfig(versioned("hi")))], str(tmp_path / "prefix"))
    assert by_function.steps[0].output_path == planned["s0"].output_path


def test_a_step_by_reference_runs_its_function_in_the_process_that_runs_it(step_module: str, tmp_path: Path) -> None:
    step = ExecutorStep("word", f"{step_module}:write", WordConfig(versioned("hello")))
    executor = Executor(str(tmp_path / "prefix"))
    executor.run([step])
    output = executor.output_paths[step]
    assert json.loads(storage.read_text(storage.join(output, "word.json"))) == {"word": "hello"}
    assert read_events(output)[-1].status == StepStatus.SUCCESS
    assert read_events(output)[-1].details["code_fingerprint"] == code_fingerprint(StepFunction(f"{step_module}:write"))
    assert imports_of(step_module) == [step_module]  # imported once, to run


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ("write", r"'write' is not a reference: write 'package\.module:function'"),
        ("a module:write", r"is not a reference"),
        ("no_such_module_anywhere:write", r"step 'bad' \(defined at .*test_step_function\.py:\d+\): its function "
                                          r"'no_such_module_anywhere:write' names a module that cannot be found"),
        ("{module}:wirte", r"step 'bad' .*: its function '{module}:wirte': .*{module}\.py defines no 'wirte' at its "
                           r"top level"),
    ],
)  # fmt: skip
def test_a_reference_to_nothing_is_refused_when_the_dag_is_planned(
    step_module: str, tmp_path: Path, reference: str, message: str
) -> None:
    reference, message = reference.format(module=step_module), message.format(module=step_module)
    with pytest.raises(ConfigError, match=message):
        build_plan([ExecutorStep("bad", reference, WordConfig("x"))], str(tmp_path / "prefix"))
    assert not (tmp_path / "prefix").exists() and imports_of(step_module) == []


def test_names_bound_by_an_if_or_an_import_at_the_top_level_are_found(step_module: str, tmp_path: Path) -> None:
    """A reference may name what the module binds by an assignment under an `if` or by an import: it is planned
    (no fingerprint: no `def` of that name is there to read), and refused by nothing."""
    steps = [ExecutorStep(name, f"{step_module}:{name}", WordConfig("x")) for name in ("conditional", "imported")]
    plan = build_plan(steps, str(tmp_path / "prefix"))
    assert [step.fingerprint for step in plan.steps] == [None, None]
