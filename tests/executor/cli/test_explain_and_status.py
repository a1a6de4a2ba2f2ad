"""explain, code drift, the `python -m executor` CLI and `executor_main`'s command line."""

from __future__ import annotations

import importlib.util
import json
import logging
import textwrap
from pathlib import Path

import pytest
from conftest import make_step, plant_crashed_holder

from executor import ConfigError, Executor, StepFailedError, executor_main, output_path_of, read_status
from executor.cli.commands import main as cli_main
from executor.dag.explain import diff_versions, explain_output, flatten_version
from executor.dag.plan import build_plan


def test_explain_names_the_changed_key(tmp_path, calls):
    upstream_v1 = make_step("corpus", text="v1")
    upstream_v2 = make_step("corpus", text="v2")
    Executor(str(tmp_path)).run([make_step("tok", upstream_v1, text="same")])
    current = make_step("tok", upstream_v2, text="same")
    executor = Executor(str(tmp_path))
    executor.run([current])

    report = executor.explain(current)
    assert report.status == "SUCCESS"
    assert [other.label.split("-")[0] for other in report.others] == ["tok"]
    [difference] = report.others[0].differences
    assert difference.key == "dependencies[corpus]"
    text = report.render()
    assert "dependencies[corpus]" in text and "1 difference" in text

    corpus_report = executor.explain(upstream_v2)
    [corpus_difference] = corpus_report.others[0].differences
    assert (corpus_difference.key, corpus_difference.other, corpus_difference.this) == ("config.text", "v1", "v2")
    assert 'config.text: "v1" there -> "v2" here' in corpus_report.render()


def test_diff_versions_reports_added_removed_and_changed_keys():
    old = {"name": "s", "config": {"a": 1, "gone": 2}, "dependencies": [], "code_version": None}
    new = {"name": "s", "config": {"a": 3, "new": 4}, "dependencies": ["d-" + "f" * 64], "code_version": "2"}
    rendered = {d.key: d.render() for d in diff_versions(old, new)}
    assert rendered == {
        "code_version": 'code_version: null there -> "2" here',
        "config.a": "config.a: 1 there -> 3 here",
        "config.gone": "config.gone: removed here (was 2)",
        "config.new": "config.new: added here = 4",
        "dependencies[d]": 'dependencies[d]: added here = "ffffffff"',
    }


STEP_MODULE = """
from dataclasses import dataclass
from pathlib import Path

@dataclass(frozen=True)
class Config:
    output_path: str

def produce(config: Config) -> None:
    Path(config.output_path).mkdir(parents=True, exist_ok=True)
    Path(config.output_path, "out.txt").write_text({body!r})
"""


def load_step_module(tmp_path: Path, body: str, comment: str = ""):
    # Each version in a folder of its own: a rewrite of one file to the same size within one tick of the file
    # system's clock ("one" -> "two") looks unchanged to both the bytecode cache (__pycache__, written under
    # `make test`) and linecache, which would load or fingerprint the old version.
    folder = tmp_path / f"version-{len(list(tmp_path.glob('version-*')))}"
    folder.mkdir()
    source = folder / "drift_steps.py"
    source.write_text(textwrap.dedent(STEP_MODULE.format(body=body)) + comment)
    spec = importlib.util.spec_from_file_location("drift_steps", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def drift_step(module):
    from executor import THIS_OUTPUT_PATH, ExecutorStep

    return ExecutorStep("produce", module.produce, module.Config(THIS_OUTPUT_PATH))


def test_a_changed_function_body_is_reported_as_drift_never_rerun(tmp_path, caplog, capsys):
    prefix = str(tmp_path / "out")
    original = drift_step(load_step_module(tmp_path, "one"))
    first = Executor(prefix)
    first.run([original])
    output = first.output_paths[original]

    commented = drift_step(load_step_module(tmp_path, "one", comment="# only a comment\n"))
    with caplog.at_level(logging.WARNING):
        Executor(prefix).run([commented], dry_run=True)
    assert "code drift" not in caplog.text

    changed = drift_step(load_step_module(tmp_path, "two"))
    executor = Executor(prefix)
    with caplog.at_level(logging.WARNING):
        executor.run([changed], dry_run=True)
        executor.run([changed])
    assert executor.output_paths[changed] == output  # same version, same path
    assert "code drift" in caplog.text and "--force_run" in caplog.text
    assert "code drift" in capsys.readouterr().out  # the dry run says so too
    assert Path(output, "out.txt").read_text() == "one"  # never a silent rerun
    assert executor.explain(changed).drift is not None
    assert explain_output(output).drift is None  # without the current code, no claim either way
    assert cli_main(["status", executor.executor_info_path]) == 0
    assert "code drift!" in capsys.readouterr().out


def test_cli_status_explain_verify(tmp_path, calls, capsys):
    a = make_step("a", text="A")
    b = make_step("b", a)
    bad = make_step("bad", fail=True)
    executor = Executor(str(tmp_path))
    with pytest.raises(Exception, match="1 step"):
        executor.run([b, bad])
    assert cli_main(["status", str(tmp_path)]) == 1  # a FAILED step makes the exit code 1
    out = capsys.readouterr().out
    assert "SUCCESS: 2" in out and "FAILED: 1" in out and "b-" in out

    assert cli_main(["status", executor.executor_info_path, "--name", "^a$"]) == 0
    out = capsys.readouterr().out
    assert "a-" in out and "b-" not in out

    Executor(str(tmp_path)).run([make_step("a", text="A2")])
    capsys.readouterr()
    assert cli_main(["explain", str(tmp_path), "^a$"]) == 0
    out = capsys.readouterr().out
    assert 'config.text: "A" there -> "A2" here' in out  # the newest experiment's step, against the older one

    good_path = executor.output_paths[b]
    assert cli_main(["verify", good_path]) == 0
    assert "every file matches" in capsys.readouterr().out
    Path(good_path, "out.txt").write_text("tampered")
    Path(good_path, "extra.bin").write_bytes(b"?")
    assert cli_main(["verify", good_path]) == 1
    out = capsys.readouterr().out
    assert "corrupt:" in out and "not in manifest:" in out
    Path(good_path, "out.txt").unlink()
    assert cli_main(["verify", good_path]) == 1
    assert "missing:" in capsys.readouterr().out
    assert cli_main(["verify", executor.output_paths[bad]]) == 1
    assert "never finished" in capsys.readouterr().out


def test_executor_main_parses_its_command_line(tmp_path, calls, monkeypatch, capsys):
    a = make_step("a")
    b = make_step("b", a)
    c = make_step("c")
    monkeypatch.setenv("EXECUTOR_PREFIX", str(tmp_path / "from-env"))
    executor = executor_main([output_path_of(b), c], args=["--dry_run", "true"])  # InputNames too, as in Marin
    assert "Dry run: 3 step(s)" in capsys.readouterr().out
    assert executor.prefix == str(tmp_path / "from-env") and calls.counts == {}

    executor = executor_main([b, c], args=["--prefix", str(tmp_path / "p"), "--run_only", "[^b$]"])
    assert calls.counts == {"a": 1, "b": 1}
    assert read_status(executor.output_paths[c]) is None
    experiment = json.loads(Path(executor.executor_info_path).read_text())
    assert experiment["caller"].endswith("test_explain_and_status.py")
    assert executor.executor_info_path.startswith(str(tmp_path / "p" / "experiments" / "test_explain_and_status-"))

    executor_main([b, c], args=["--prefix", str(tmp_path / "p"), "--force_run", "[^a$]", "--max_concurrent", "1"])
    assert calls.counts == {"a": 2, "b": 1, "c": 1}


@pytest.mark.parametrize(
    "flags",
    [
        ["--force_run", "^a$"],  # a single pattern, as the drift warning prints it
        ["--force_run=^a$"],
        ["--force_run", "^a$, ^zzz_never$|^a$"],  # comma-separated
        ["--force_run", '["^a$"]'],  # the list form still works
    ],
)
def test_pattern_flags_take_a_name_a_comma_list_or_a_list(tmp_path, calls, flags):
    a, b = make_step("a"), make_step("b")
    prefix = ["--prefix", str(tmp_path)]
    executor_main([a, b], args=prefix)
    executor_main([a, b], args=[*prefix, *flags])
    assert calls.counts == {"a": 2, "b": 1}
    executor_main([a, b], args=[*prefix, "--run_only", "b,a", "--force_run", "b"])
    assert calls.counts == {"a": 2, "b": 2}


def test_a_bad_flag_value_is_one_line_naming_the_accepted_forms(tmp_path):
    step = make_step("a")
    with pytest.raises(ConfigError) as caught:
        executor_main([step], args=["--prefix", str(tmp_path), "--force_run", "[unclosed"])
    message = str(caught.value)
    assert "\n" not in message and "--force_run" in message and "'a,b' (comma-separated)" in message
    with pytest.raises(ConfigError, match=r"max_concurrent.*see --help"):
        executor_main([step], args=["--prefix", str(tmp_path), "--max_concurrent", "many"])


def test_force_run_failed_false_advises_a_command_line_flag(tmp_path, calls):
    bad = make_step("bad", fail=True)
    with pytest.raises(StepFailedError):
        executor_main([bad], args=["--prefix", str(tmp_path)])
    with pytest.raises(StepFailedError, match=r"--force_run '\^bad\$'") as caught:
        executor_main([bad], args=["--prefix", str(tmp_path), "--force_run_failed", "false"])
    assert calls.counts == {"bad": 1}
    assert "force_run=[" not in str(caught.value).split("; force_run=[...] from Python")[0]


def two_inputs_whose_order_flips(text_b: str) -> tuple[str, str]:
    """Texts of `a` (v1, v2) such that `a`'s hash sorts before `b`'s in one version and after it in the other."""
    b_hash = build_plan([make_step("b", text=text_b)], "/p").requested[0].hash
    before = {
        text: build_plan([make_step("a", text=text)], "/p").requested[0].hash < b_hash for text in map(str, range(64))
    }
    return next(t for t in before if before[t]), next(t for t in before if not before[t])


def test_explain_diffs_dependencies_by_name_not_by_position(tmp_path, calls, capsys):
    text_first, text_second = two_inputs_whose_order_flips("B")
    b = make_step("b", text="B")
    old = make_step("tok", make_step("a", text=text_first), b)
    new = make_step("tok", make_step("a", text=text_second), b)
    Executor(str(tmp_path)).run([old])
    executor = Executor(str(tmp_path))
    executor.run([new])
    [other] = executor.explain(new).others
    assert [difference.key for difference in other.differences] == ["dependencies[a]"]  # no DEP[0] -> DEP[1]
    assert flatten_version(executor.versions[new])["config.inputs.[0]"] in ("DEP[a]/out.txt", "DEP[b]/out.txt")

    capsys.readouterr()
    assert cli_main(["explain", str(tmp_path), "^tok$"]) == 0
    out = capsys.readouterr().out
    assert f"tok: 2 versions stored; explaining {executor.output_paths[new]}" in out  # says which one
    assert "1 difference" in out and "DEP[0]" not in out


def test_status_and_explain_of_a_prefix_show_code_drift(tmp_path, capsys):
    prefix = str(tmp_path / "out")
    Executor(prefix).run([drift_step(load_step_module(tmp_path, "one"))])
    changed = drift_step(load_step_module(tmp_path, "two"))
    executor = Executor(prefix)
    executor.run([changed])  # skipped, with a drift warning; its experiment file records the new code
    capsys.readouterr()
    assert cli_main(["status", prefix]) == 0
    assert "code drift!" in capsys.readouterr().out
    assert cli_main(["explain", prefix, "produce"]) == 0
    assert "code drift:" in capsys.readouterr().out
    assert cli_main(["explain", executor.output_paths[changed]]) == 0
    assert "code drift:" in capsys.readouterr().out


def test_status_takes_several_experiment_files_globs_and_latest(tmp_path, calls, capsys):
    prefix = str(tmp_path)
    code = make_step("tokenized/code", text="1")
    Executor(prefix).run([code], caller="demo.py")
    Executor(prefix).run([make_step("tokenized/code", text="2")], caller="demo.py")
    files = sorted(str(path) for path in Path(prefix, "experiments").glob("demo-*.json"))
    assert len(files) == 2
    capsys.readouterr()
    assert cli_main(["status", *files]) == 0
    out = capsys.readouterr().out
    assert out.count("experiment demo-") == 2 and "tokenized/code-" in out  # the full step name
    assert cli_main(["status", str(Path(prefix, "experiments", "demo-*.json"))]) == 0
    assert capsys.readouterr().out.count("experiment demo-") == 2
    assert cli_main(["status", prefix, "--latest", "demo"]) == 0
    out = capsys.readouterr().out
    assert out.count("experiment demo-") == 1
    assert cli_main(["status", str(Path(prefix, "experiments", "nothing-*.json"))]) == 2
    assert "no file matches" in capsys.readouterr().err


def test_verify_a_prefix_or_an_experiment_verifies_every_finished_step(tmp_path, calls, capsys):
    a = make_step("a")
    b = make_step("b", a)
    executor = Executor(str(tmp_path))
    with pytest.raises(StepFailedError):
        executor.run([b, make_step("bad", fail=True)])
    capsys.readouterr()
    assert cli_main(["verify", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 finished step(s) match their manifests; 0 with problems; 1 not finished" in out
    assert cli_main(["verify", executor.executor_info_path]) == 0
    Path(executor.output_paths[a], "out.txt").write_text("tampered")
    assert cli_main(["verify", str(tmp_path)]) == 1
    assert "1 of 2 finished step(s) match" in capsys.readouterr().out


def test_dry_run_shows_all_on_request_and_the_summary_counts_taken_over_steps(tmp_path, calls, capsys, fast_leases):
    a = make_step("a")
    b = make_step("b", a)
    Executor(str(tmp_path)).run([b])
    Executor(str(tmp_path)).run([make_step("c", b)], dry_run=True)
    out = capsys.readouterr().out
    assert "c-" in out and " a-" not in out and "--show_all true lists them" in out
    Executor(str(tmp_path)).run([make_step("c", b)], dry_run=True, show_all=True)
    out = capsys.readouterr().out
    assert "Not looked at by this run (1)" in out and " a-" in out and "SUCCESS at" in out

    orphan = make_step("orphan")
    probe = Executor(str(tmp_path))
    probe.run([orphan], dry_run=True)
    plant_crashed_holder(probe.output_paths[orphan])
    executor = Executor(str(tmp_path))
    executor.run([b, orphan])
    assert executor.summary() == (
        "1 step(s) ran here (1 taken over from a holder that was gone), 1 were already done; "
        "1 other step(s) of the DAG not needed by this run"
    )


def test_every_help_shows_an_example(capsys):
    for argv in (["--help"], *([command, "--help"] for command in ("status", "explain", "verify", "dashboard"))):
        with pytest.raises(SystemExit):
            cli_main(argv)
        out = capsys.readouterr().out
        command = argv[0] if argv[0] != "--help" else "status"
        assert "example" in out and f"  python -m executor {command} " in out, out
    with pytest.raises(SystemExit):
        executor_main([make_step("a")], args=["--help"])
    assert "python mine.py --force_run mine/stats" in " ".join(capsys.readouterr().out.split())
