"""Same hash, same bytes (issue 37): each step's output digest, recorded at commit and shown by `status` and
`explain`; `compare` of two prefixes; pins that fail loudly."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from conftest import make_step

from executor import Executor
from executor.cli import main as cli_main
from executor.status import read_events


def _digest_from_disk(output_path: Path) -> str:
    """The output digest recomputed from the files themselves, as the issue defines it: sha256 over the canonical
    JSON of (path, size, sha256), sorted by path, the executor's own records left out."""
    entries = []
    for path in sorted(output_path.rglob("*")):
        relative = path.relative_to(output_path).as_posix()
        if path.is_file() and not relative.startswith((".executor_", "logs/")):
            entries.append({"path": relative, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                            "size": path.stat().st_size})  # fmt: skip
    canonical = json.dumps(entries, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def test_each_success_records_its_output_digest_and_status_and_explain_show_it(tmp_path: Path, capsys) -> None:
    """The SUCCESS event carries the digest of the bytes written (recomputed here from the files), the same under
    two prefixes, written at different times; `status` shows its first 12 characters, `explain` all of it."""
    corpus = make_step("corpus", text="alpha")
    steps = [corpus, make_step("tokens", corpus, text="beta")]
    digests = {}
    for prefix in ("a", "b"):
        executor = Executor(str(tmp_path / prefix))
        executor.run(steps)
        for step in steps:
            output = Path(executor.output_paths[step])
            success = read_events(str(output))[-1]
            assert success.status == "SUCCESS"
            assert success.details["output_digest"] == _digest_from_disk(output)
            manifest = json.loads((output / ".executor_manifest").read_text())
            assert manifest["digest"] == success.details["output_digest"]
            digests[prefix, step.name] = success.details["output_digest"]
    assert digests["a", "corpus"] == digests["b", "corpus"] != digests["a", "tokens"] == digests["b", "tokens"]
    capsys.readouterr()
    assert cli_main(["status", str(tmp_path / "a")]) == 0
    shown = capsys.readouterr().out
    assert "digest" in shown and digests["a", "corpus"][:12] in shown and digests["a", "tokens"][:12] in shown
    assert cli_main(["explain", str(tmp_path / "a"), "^tokens$"]) == 0
    assert f"output digest: sha256 of the canonical manifest (paths, sizes, sha256s) = {digests['a', 'tokens']}" in (
        capsys.readouterr().out
    )
