"""Step identity: versions, hashes, paths, resolved configs. No step runs here."""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass, field
from typing import NamedTuple

import pytest

from executor import (
    THIS_OUTPUT_PATH,
    ConfigError,
    CycleError,
    ExecutorStep,
    InputName,
    UnversionableValueError,
    output_path_of,
    this_output_path,
    versioned,
)
from executor.dag.identity import code_fingerprint
from executor.dag.plan import build_plan


@dataclass(frozen=True)
class Config:
    output_path: str = THIS_OUTPUT_PATH
    input_path: object = None
    lr: object = 0.1
    threads: int = 4
    extra: object = None


def fn(config: Config) -> None:
    pass


def other_fn(config: Config) -> None:
    pass


def plan_of(*steps: ExecutorStep, prefix: str = "/prefix"):
    return build_plan(list(steps), prefix)


def test_paths_and_config_instantiation():
    a = ExecutorStep("a", fn, Config(lr=versioned(0.1)))
    b = ExecutorStep("b", fn, Config(input_path=output_path_of(a, "sub"), extra=this_output_path("ckpt")))
    plan = plan_of(b)
    pa, pb = plan.lookup(a), plan.lookup(b)
    assert pa.output_path == f"/prefix/a-{pa.hash[:8]}"
    assert pb.config.input_path == f"{pa.output_path}/sub"
    assert pb.config.output_path == pb.output_path
    assert pb.config.extra == f"{pb.output_path}/ckpt"
    assert pa.config.lr == 0.1 and pa.config.threads == 4
    assert [p.name for p in plan.steps] == ["a", "b"]
    assert pb.version["config"] == {"input_path": "DEP[0]/sub"}
    assert pb.version["dependencies"] == [f"a-{pa.hash}"]


def test_step_cd_and_truediv_are_output_path_of():
    a = ExecutorStep("a", fn, Config())
    b1 = ExecutorStep("b", fn, Config(input_path=a / "x" / "y"))
    b2 = ExecutorStep("b", fn, Config(input_path=a.cd("x/y")))
    plan = plan_of(b1, b2)
    assert plan.lookup(b1) is plan.lookup(b2)
    assert plan.lookup(b1).config.input_path.endswith("/x/y")


def test_versioned_fields_change_the_hash_and_plain_fields_do_not():
    base = plan_of(ExecutorStep("s", fn, Config(lr=versioned(0.1), threads=4))).requested[0]
    plain = plan_of(ExecutorStep("s", fn, Config(lr=versioned(0.1), threads=64))).requested[0]
    changed = plan_of(ExecutorStep("s", fn, Config(lr=versioned(0.2), threads=4))).requested[0]
    unversioned_lr = plan_of(ExecutorStep("s", fn, Config(lr=0.1))).requested[0]
    assert base.hash == plain.hash
    assert base.hash != changed.hash
    assert base.hash != unversioned_lr.hash
    as_int = plan_of(ExecutorStep("s", fn, Config(lr=versioned(1)))).requested[0]
    as_float = plan_of(ExecutorStep("s", fn, Config(lr=versioned(1.0)))).requested[0]
    as_bool = plan_of(ExecutorStep("s", fn, Config(lr=versioned(True)))).requested[0]
    assert len({as_int.hash, as_float.hash, as_bool.hash}) == 3


def test_hash_is_pinned():
    """The identity algorithm is a storage format: changing it would rerun every stored step."""
    step = ExecutorStep("tokenize", fn, Config(lr=versioned({"b": [1, 2.5, None], "a": "x"})))
    planned = plan_of(step).requested[0]
    assert planned.version_str == (
        '{"code_version":null,"config":{"lr":{"a":"x","b":[1,2.5,null]}},"dependencies":[],"name":"tokenize"}'
    )
    assert planned.hash == hashlib.sha256(planned.version_str.encode()).hexdigest()
    assert planned.hash == "a0190122ed6e38221824637215113c2eedad913c25ae47ab0c7e67ae8a3f6102"
    assert planned.output_path == "/prefix/tokenize-a0190122"


def test_same_hashes_under_any_prefix_and_deep_chains_stay_small():
    def chain(depth: int) -> list[ExecutorStep]:
        steps = [ExecutorStep("s0", fn, Config(lr=versioned(0)))]
        for index in range(1, depth):
            steps.append(
                ExecutorStep(f"s{index}", fn, Config(input_path=output_path_of(steps[-1]), lr=versioned(index)))
            )
        return steps

    local = plan_of(chain(12)[-1], prefix="/data/run")
    remote = plan_of(chain(12)[-1], prefix="gs://bucket-a/x")
    assert [p.hash for p in local.steps] == [p.hash for p in remote.steps]
    assert local.steps[-1].output_path.startswith("/data/run/s11-")
    assert remote.steps[-1].output_path.startswith("gs://bucket-a/x/s11-")
    sizes = [len(p.version_str) for p in local.steps[1:]]
    assert max(sizes) - min(sizes) <= 4  # only the index digits grow, never the dependency chain
    deep = plan_of(chain(300)[-1]).steps  # iterative planning: no recursion limit
    assert len(deep) == 300 and len(deep[-1].version_str) < 200


def test_changing_an_upstream_value_changes_every_downstream_hash():
    def dag(rate: float):
        a = ExecutorStep("a", fn, Config(lr=versioned(rate)))
        b = ExecutorStep("b", fn, Config(input_path=output_path_of(a)))
        c = ExecutorStep("c", fn, Config(input_path=output_path_of(b)))
        return plan_of(c)

    first, second = dag(0.1), dag(0.2)
    assert all(x.hash != y.hash for x, y in zip(first.steps, second.steps, strict=True))


def test_identical_steps_built_separately_are_one_step():
    a1 = ExecutorStep("a", fn, Config(lr=versioned(0.1)))
    a2 = ExecutorStep("a", fn, Config(lr=versioned(0.1)))
    b = ExecutorStep("b", fn, Config(input_path=output_path_of(a1), extra=[output_path_of(a2, "z")]))
    plan = plan_of(b, a2)
    assert [p.name for p in plan.steps] == ["a", "b"]
    assert plan.lookup(a1) is plan.lookup(a2)
    assert plan.lookup(b).version["dependencies"] == [f"a-{plan.lookup(a1).hash}"]


def test_same_name_and_version_with_a_different_function_is_an_error():
    a1 = ExecutorStep("a", fn, Config(lr=versioned(0.1)))
    a2 = ExecutorStep("a", other_fn, Config(lr=versioned(0.1)))
    with pytest.raises(ConfigError, match=r"two steps named 'a'.*different functions.*other_fn"):
        plan_of(a1, a2)


def test_same_override_path_for_different_steps_is_an_error():
    a = ExecutorStep("a", fn, Config(lr=versioned(1)), override_output_path="pinned")
    b = ExecutorStep("b", fn, Config(lr=versioned(2)), override_output_path="pinned")
    with pytest.raises(ConfigError, match="would both write /prefix/pinned"):
        plan_of(a, b)


def test_override_output_path_changes_the_path_not_the_version():
    plain = plan_of(ExecutorStep("a", fn, Config(lr=versioned(1)))).requested[0]
    relative = plan_of(ExecutorStep("a", fn, Config(lr=versioned(1)), override_output_path="fixed/a")).requested[0]
    absolute = plan_of(ExecutorStep("a", fn, Config(lr=versioned(1)), override_output_path="gs://b/a")).requested[0]
    assert plain.hash == relative.hash == absolute.hash
    assert relative.output_path == "/prefix/fixed/a"
    assert absolute.output_path == "gs://b/a"


def test_code_version_enters_the_hash():
    v1 = plan_of(ExecutorStep("a", fn, Config(), code_version="1")).requested[0]
    v2 = plan_of(ExecutorStep("a", fn, Config(), code_version="2")).requested[0]
    assert v1.hash != v2.hash and v1.version["code_version"] == "1"


def test_hardcoded_and_nonblocking_inputs():
    a = ExecutorStep("a", fn, Config(lr=versioned(1)))
    blocking = ExecutorStep("b", fn, Config(input_path=output_path_of(a)))
    pseudo = ExecutorStep("b", fn, Config(input_path=output_path_of(a).nonblocking()))
    hard = ExecutorStep("c", fn, Config(input_path=InputName.hardcoded("gs://raw/data")))
    plan = plan_of(blocking, pseudo, hard)
    assert plan.lookup(blocking) is plan.lookup(pseudo)  # blocking-ness is scheduling, not identity
    only_pseudo = plan_of(pseudo).lookup(pseudo)
    assert only_pseudo.blocking == [] and [d.name for d in only_pseudo.dependencies] == ["a"]
    planned_hard = plan.lookup(hard)
    assert planned_hard.config.input_path == "gs://raw/data"
    assert planned_hard.version["config"] == {"input_path": "gs://raw/data"}
    assert planned_hard.dependencies == []


class Mode(enum.Enum):
    FAST = "fast"


class Pair(NamedTuple):
    left: object
    right: object


@dataclass(frozen=True)
class Inner:
    width: int
    tags: tuple[str, ...] = ("a",)


def test_walking_containers_gives_dotted_keys_and_keeps_types():
    a = ExecutorStep("a", fn, Config())
    config = Config(
        lr=versioned(Inner(3)),
        extra={
            "pair": Pair(output_path_of(a, "l"), versioned(Mode.FAST)),
            "list": [versioned(1), {"deep": versioned("x")}],
            "set": frozenset({"plain"}),
        },
    )
    planned = plan_of(ExecutorStep("s", fn, config)).requested[0]
    assert planned.version["config"] == {
        "lr": {"width": 3, "tags": ["a"]},
        "extra.pair.[0]": "DEP[0]/l",
        "extra.pair.[1]": "fast",
        "extra.list.[0]": 1,
        "extra.list.[1].deep": "x",
    }
    resolved = planned.config.extra
    assert isinstance(resolved["pair"], Pair) and resolved["pair"].right is Mode.FAST
    assert resolved["pair"].left.endswith("/l")
    assert resolved["list"] == [1, {"deep": "x"}]


def test_set_members_are_ordered_by_content_not_by_memory():
    a = ExecutorStep("a", fn, Config(lr=versioned(1)))
    b = ExecutorStep("b", fn, Config(lr=versioned(2)))
    one = plan_of(ExecutorStep("s", fn, Config(extra={output_path_of(a), output_path_of(b)}))).requested[0]
    two = plan_of(ExecutorStep("s", fn, Config(extra={output_path_of(b), output_path_of(a)}))).requested[0]
    assert one.hash == two.hash
    assert sorted(one.version["config"]) == ["extra.{0}", "extra.{1}"]
    assert isinstance(one.config.extra, set) and all(path.startswith("/prefix/") for path in one.config.extra)


def test_field_order_does_not_matter_for_dependencies():
    a = ExecutorStep("a", fn, Config(lr=versioned(1)))
    b = ExecutorStep("b", fn, Config(lr=versioned(2)))
    x = plan_of(ExecutorStep("s", fn, Config(input_path=output_path_of(a), extra=output_path_of(b)))).requested[0]
    y = plan_of(ExecutorStep("s", fn, Config(input_path=output_path_of(b), extra=output_path_of(a)))).requested[0]
    assert x.version["dependencies"] == y.version["dependencies"]  # sorted by hash
    assert x.hash != y.hash  # but which field points where still matters


def test_unversionable_values_name_the_step_and_key():
    class Opaque:
        pass

    with pytest.raises(UnversionableValueError, match=r"step 'bad', config key 'extra.inner'.*Opaque"):
        plan_of(ExecutorStep("bad", fn, Config(extra={"inner": versioned(Opaque())})))
    with pytest.raises(TypeError, match="nan"):
        plan_of(ExecutorStep("bad", fn, Config(lr=versioned(float("nan")))))
    with pytest.raises(TypeError, match="not a str"):
        plan_of(ExecutorStep("bad", fn, Config(lr=versioned({1: "x"}))))


def test_versioned_rejects_nesting_and_dependencies():
    a = ExecutorStep("a", fn, Config())
    with pytest.raises(ValueError, match="already versioned"):
        versioned(versioned(1))
    with pytest.raises(ValueError, match="already versioned"):
        versioned([1, {"x": versioned(2)}])
    with pytest.raises(ValueError, match="InputName cannot be versioned"):
        versioned(output_path_of(a))


def test_non_dataclass_config_and_bad_names_are_config_errors():
    with pytest.raises(ConfigError, match="step 'a': config must be a dataclass instance, got dict"):
        ExecutorStep("a", fn, {"lr": 1})
    with pytest.raises(ConfigError, match="not valid"):
        ExecutorStep("bad name", fn, Config())
    with pytest.raises(ConfigError, match="expected ExecutorStep"):
        build_plan(["not a step"], "/p")


@dataclass
class Mutable:
    output_path: str = THIS_OUTPUT_PATH
    inputs: list = field(default_factory=list)


def test_cycles_are_reported_with_their_path():
    a = ExecutorStep("a", fn, Mutable())
    b = ExecutorStep("b", fn, Mutable(inputs=[output_path_of(a)]))
    c = ExecutorStep("c", fn, Mutable(inputs=[output_path_of(b)]))
    a.config.inputs.append(output_path_of(c))
    with pytest.raises(CycleError, match=r"cycle: (a -> c -> b -> a|c -> b -> a -> c|b -> a -> c -> b)"):
        plan_of(c)


def test_code_fingerprint_ignores_comments_and_docstrings():
    namespace: dict = {}
    exec(compile("def f(x):\n    return x + 1\n", "<one>", "exec"), namespace)
    assert code_fingerprint(namespace["f"]) is None  # no source file: unknown, never a guess

    def f1(config):
        """Doc one."""
        return config + 1  # a comment

    def f2(config):
        """A different docstring."""
        # another comment
        return config + 1

    def f3(config):
        return config + 2

    assert code_fingerprint(f1) is not None
    assert code_fingerprint(f1) == code_fingerprint(f2) != code_fingerprint(f3)


def test_version_json_round_trips():
    planned = plan_of(ExecutorStep("a", fn, Config(lr=versioned([1, "two", None])))).requested[0]
    assert json.loads(planned.version_str) == planned.version
