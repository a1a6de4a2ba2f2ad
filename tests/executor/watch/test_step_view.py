"""`/api/step/live` answers 404 for a path that holds no step, as `/api/step` does (issue 38 point 6); it said
200 "NEVER_RAN" for any path at all, so a typo in a link looked like a step waiting to run."""

from __future__ import annotations

import json

from conftest import make_step

from executor import Executor
from executor.watch.app import DashboardApp


def test_live_state_of_a_path_that_is_no_step_is_a_404(tmp_path, calls):
    step = make_step("data/a")
    executor = Executor(str(tmp_path))
    executor.run([step])
    app = DashboardApp(str(tmp_path))
    known = app.handle("/api/step/live", {"path": f"data/{executor.output_paths[step].rsplit('/', 1)[-1]}"})
    assert known.status == 200 and json.loads(known.body)["status"] == "SUCCESS"
    for path in ("data/no-such-step", "experiments", "data"):
        for route in ("/api/step/live", "/api/step"):
            answer = app.handle(route, {"path": path})
            assert answer.status == 404, (route, path, answer.body)
            assert f"{path!r} is not a step output under {tmp_path}" in json.loads(answer.body)["error"]
