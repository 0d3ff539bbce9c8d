"""Files and input that are not what they claim: a clear error, never a hang or a
traceback, and the good lines around a bad one still count."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from shadow.cli import app
from shadow.events import iter_file
from shadow.events import parse as event_module

GOOD = json.dumps({"type": "worker", "ts": 1.0, "worker": "w0", "capacity": 4}) + "\n"


def test_ingest_refuses_directories_and_devices(tmp_path):
    runner = CliRunner()
    for target in (tmp_path, "/dev/zero"):
        outcome = runner.invoke(app, ["ingest", str(target), "--db", str(tmp_path / "x.db")])
        assert outcome.exit_code == 2
        assert "not a regular file" in " ".join(outcome.output.split())
    with pytest.raises(ValueError, match="is not a regular file"):
        next(iter_file(tmp_path))


def test_an_endless_line_is_rejected_without_reading_it_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(event_module, "MAX_LINE_BYTES", 1000)
    path = tmp_path / "long.jsonl"
    path.write_text(GOOD + "x" * 50_000 + "\n" + GOOD.replace("w0", "w1"))
    batches = list(iter_file(path))
    accepted = [event for pairs, _ in batches for _, event in pairs]
    errors = [error for _, errs in batches for error in errs]
    assert [e.worker for e in accepted] == ["w0", "w1"]
    assert len(errors) == 1 and errors[0].line == 2
