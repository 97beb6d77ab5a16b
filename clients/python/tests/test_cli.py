"""`python -m homing worker`'s parsing and module loading: user mistakes get one clear line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

from homing import App
from homing.__main__ import duration, load_app, main
from homing._worker import WorkerError


def test_durations() -> None:
    assert duration("2s") == 2.0
    assert duration("500ms") == 0.5
    assert duration("1.5m") == 90.0
    assert duration("3") == 3.0
    for bad in ("", "2x", "-1s", "s", "1e9"):
        with pytest.raises(argparse.ArgumentTypeError):
            duration(bad)


def test_load_app_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "noapp.py").write_text("x = 1\n")
    (tmp_path / "empty_app.py").write_text("import homing\napp = homing.App()\n")
    (tmp_path / "broken.py").write_text("import homing\nraise RuntimeError('bad config')\n")
    (tmp_path / "good.py").write_text(
        "import homing\nmine = homing.App()\n@mine.task(name='g.t')\ndef t(ctx): return 1\n")
    with pytest.raises(WorkerError, match="cannot import module 'nothere'"):
        load_app("nothere")
    with pytest.raises(WorkerError, match=r"has no homing\.App named 'app'"):
        load_app("noapp")
    with pytest.raises(WorkerError, match="defines no task"):
        load_app("empty_app")
    with pytest.raises(WorkerError, match="failed to import: bad config"):
        load_app("broken")
    app = load_app("good:mine")
    assert isinstance(app, App) and list(app.tasks) == ["g.t"]


def test_main_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "surely_not_a_module_xyz"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("homing worker: cannot import module 'surely_not_a_module_xyz'")
    assert "surely_not_a_module_xyz" not in sys.modules


def test_task_registration_rules() -> None:
    app = App("http://127.0.0.1:1")

    @app.task(name="a.b", queue="q", max_retries=2, retry_delay=1.5, time_limit=10)
    def f(ctx: object) -> None:
        return None

    assert f.declaration() == {"name": "a.b", "max_retries": 2, "retry_delay_ms": 1500,
                               "time_limit_ms": 10000}
    with pytest.raises(ValueError, match="registered twice"):
        app.task(name="a.b")(f.fn)
    with pytest.raises(ValueError):
        app.task(name="c", max_retries=-1)
    with pytest.raises(ValueError):
        app.task(name="c", retry_delay=-1)
