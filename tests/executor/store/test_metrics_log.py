"""executor/store/metrics_log.py: a step's metrics.jsonl, live on a local disk and on object stores (no append)."""

from __future__ import annotations

import json
import os
import uuid

import pytest

from executor import storage
from executor.store.metrics_log import MetricsLog, read_metrics_bytes, read_metrics_tail, segments_folder
from executor.watch import files
from executor.watch.metrics_view import metrics_grid
from steps.train.train_metrics import JsonlMetricsTracker, read_metrics


def lines_of(path: str) -> list[str]:
    data = read_metrics_bytes(path)
    return [] if data is None else data.decode().splitlines()


def test_a_local_file_is_appended_line_by_line_and_a_restart_continues_it(tmp_path):
    path = str(tmp_path / "run" / "metrics.jsonl")
    assert read_metrics_bytes(path) is None
    log = MetricsLog(path, flush_seconds=3600)
    log.write('{"step": 1}')
    assert lines_of(path) == ['{"step": 1}']  # visible at once, whatever flush_seconds says
    log.close()
    again = MetricsLog(path)
    again.write('{"step": 2}')
    again.close()
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 2}\n'
    assert not os.path.exists(segments_folder(path))


def test_on_an_object_store_lines_go_to_segments_rewritten_at_most_every_flush_interval():
    path = f"memory://metrics-{uuid.uuid4().hex}/train/metrics.jsonl"
    log = MetricsLog(path, flush_seconds=3600, segment_bytes=40)
    log.write('{"step": 1}')
    assert read_metrics_bytes(path) is None  # held until the interval passes or the segment fills
    log.flush()
    assert lines_of(path) == ['{"step": 1}']
    for step in range(2, 8):  # 12-13 bytes a line: the segment is written, and a new one begun, at 40 bytes
        log.write(json.dumps({"step": step}))
    log.close()
    expected = [json.dumps({"step": step}) for step in range(1, 8)]
    assert lines_of(path) == expected
    assert storage.list_names(segments_folder(path)) == ["00000000.jsonl", "00000001.jsonl"]
    first = storage.read_bytes(storage.join(segments_folder(path), "00000000.jsonl"))

    resumed = MetricsLog(path, flush_seconds=0)  # a resumed run: every line visible at once, in a new segment
    resumed.write('{"step": 7}')
    assert lines_of(path) == [*expected, '{"step": 7}']
    assert storage.read_bytes(storage.join(segments_folder(path), "00000000.jsonl")) == first
    assert storage.list_names(segments_folder(path))[-1] == "00000002.jsonl"
    assert read_metrics_bytes(path, limit=25) == "".join(f"{line}\n" for line in expected)[:25].encode()


def twelve_lines_local_and_in_segments(tmp_path) -> list[tuple[str, bytes]]:  # type: ignore[no-untyped-def]
    """Twelve lines written by MetricsLog to a local file and to memory:// segments of 40 bytes: (path, stream)."""
    written = []
    for path in (str(tmp_path / "metrics.jsonl"), f"memory://metrics-{uuid.uuid4().hex}/train/metrics.jsonl"):
        log = MetricsLog(path, flush_seconds=0, segment_bytes=40)
        for step in range(12):
            log.write(json.dumps({"step": step}))
        log.close()
        stream = read_metrics_bytes(path)
        assert stream is not None
        written.append((path, stream))
    return written


def test_a_read_from_an_offset_skips_whole_segments_by_their_listed_size(tmp_path):
    """What the publisher reads each cycle: the stream from where it stopped, local file or segments alike."""
    for path, stream in twelve_lines_local_and_in_segments(tmp_path):
        for start in range(len(stream) + 2):
            assert read_metrics_bytes(path, start=start) == stream[start:], (path, start)
        assert read_metrics_bytes(path, limit=7, start=20) == stream[20:27]


def test_the_tail_is_the_streams_last_whole_lines_local_file_or_segments_alike(tmp_path):
    """What the stall rule reads of a long run (files.metrics_tail_records): the last bytes of the stream, from
    its first whole line there, whether the lines are in one local file or in an object store's segments."""
    assert read_metrics_tail(str(tmp_path / "none.jsonl"), 10) is None
    for path, stream in twelve_lines_local_and_in_segments(tmp_path):
        for tail in range(len(stream) + 2):
            found = read_metrics_tail(path, tail)
            start = max(0, len(stream) - tail)
            whole = (
                stream[start:]
                if start == 0 or stream[start - 1 : start] == b"\n"
                else stream[start:].partition(b"\n")[2]
            )
            assert found == whole, (path, tail)
        assert read_metrics_tail(path, 16) == b'{"step": 11}\n'
        assert [record["step"] for record in files.metrics_tail_records(path, 30) or []] == [10, 11]


@pytest.fixture(params=[pytest.param("gcs", marks=pytest.mark.gcs), pytest.param("s3", marks=pytest.mark.s3)])
def bucket_folder(request: pytest.FixtureRequest) -> str:
    bucket = request.getfixturevalue("gcs_emulator" if request.param == "gcs" else "s3_server")
    return f"{bucket}/metrics-{uuid.uuid4().hex[:8]}"


def test_a_training_run_on_an_object_store_is_watchable_while_it_runs(bucket_folder):
    """The train step's tracker on gs:// or s3://: the dashboard and `read_metrics` see each step while the
    run goes on (fsspec's buffered upload would show nothing before the end), and after it ends."""
    tracker = JsonlMetricsTracker(f"{bucket_folder}/metrics.jsonl", 6.0, None, devices=1, flush_seconds=0)
    tracker.log({"train/loss": 5.0, "throughput/tokens_per_second": 10.0}, step=0)
    tracker.log({"train/loss": 4.0}, step=1)
    assert [record["train/loss"] for record in read_metrics(bucket_folder)] == [5.0, 4.0]
    assert read_metrics(bucket_folder)[0]["model_flops_per_second"] == 60.0
    live = metrics_grid(files.metrics_records(f"{bucket_folder}/metrics.jsonl"))
    assert live["rows"] == 2 and live["series"]["train/loss"]["y"] == [5.0, 4.0]
    tracker.log({"train/loss": 3.0}, step=2)
    tracker.finish()
    finished = metrics_grid(files.metrics_records(f"{bucket_folder}/metrics.jsonl"))
    assert finished["series"]["train/loss"]["y"] == [5.0, 4.0, 3.0]
