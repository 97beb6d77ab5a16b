"""`python -m homing worker MODULE`: the command line of the worker."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
import traceback
from typing import Optional

from ._app import App
from ._worker import EXIT_CONFIG, Worker, WorkerError

UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(text: str) -> float:
    """`2s`, `500ms`, `1.5m`, `1h`, or a bare number of seconds."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a duration (examples: 2s, 500ms, 1m, or seconds as a number)"
        )
    return float(m.group(1)) * UNITS[m.group(2) or "s"]


def positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive whole number")
    return n


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m homing",
        description="Python workers and tools for homing, the crash-safe background job system.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    w = sub.add_parser(
        "worker",
        help="run the tasks of a Python module as a homing worker",
        description=(
            "Imports MODULE, which defines `app = homing.App(...)` and its tasks, registers a "
            "worker session with the homing server (HOMING_URL, default http://127.0.0.1:8787; "
            "token from HOMING_API_TOKEN) and runs the jobs it reserves: `async def` tasks on "
            "an event loop, plain functions on threads. SIGTERM or SIGINT stops reserving, "
            "lets running jobs finish within --grace, releases the rest and exits 0; a second "
            "signal releases at once. Exit status 2: a mistake it cannot run past (module, "
            "options, API token)."
        ),
        epilog="Example: python -m homing worker myproject.tasks --queue ocr --concurrency 1",
    )
    w.add_argument("module", metavar="MODULE",
                   help="module to import, optionally MODULE:ATTRIBUTE naming the App "
                        "(default attribute: app)")
    w.add_argument("-q", "--queue", action="append", dest="queues", metavar="Q",
                   help="queue to consume (repeatable; default: the queues of the module's tasks)")
    w.add_argument("-c", "--concurrency", type=positive_int, default=None, metavar="N",
                   help="jobs run at once (default: number of CPUs)")
    w.add_argument("--heartbeat-interval", type=duration, default=2.0, metavar="DURATION",
                   help="how often to tell the server this worker is alive; it presumes the "
                        "worker dead after 3 missed intervals (default: 2s)")
    w.add_argument("--grace", type=duration, default=30.0, metavar="DURATION",
                   help="on SIGTERM/SIGINT, how long running jobs may take to finish before "
                        "they are released to run elsewhere (default: 30s)")
    w.add_argument("--poll", type=duration, default=5.0, metavar="DURATION",
                   help="how long one reserve call waits for a job on the server (default: 5s)")
    w.add_argument("--url", default=None,
                   help="the homing server (default: the app's, from HOMING_URL)")
    w.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="default: INFO")
    return p


def fail(message: str) -> int:
    print(f"homing worker: {message}", file=sys.stderr)
    return EXIT_CONFIG


def load_app(spec: str) -> App:
    module_name, _, attr = spec.partition(":")
    attr = attr or "app"
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise WorkerError(
                f"cannot import module '{module_name}': no module named '{e.name}' "
                f"(run from the directory that contains it, or add it to PYTHONPATH)"
            ) from e
        raise WorkerError(
            f"module '{module_name}' failed to import: {e}\n{traceback.format_exc()}"
        ) from e
    except Exception as e:
        raise WorkerError(
            f"module '{module_name}' failed to import: {e}\n{traceback.format_exc()}"
        ) from e
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        found = "nothing" if app is None else f"a {type(app).__name__}"
        raise WorkerError(
            f"module '{module_name}' has no homing.App named '{attr}' (found {found}); "
            f"define `{attr} = homing.App()` and its tasks, or name it as {module_name}:NAME"
        )
    if not app.tasks:
        raise WorkerError(f"the App '{module_name}:{attr}' defines no task (use @app.task)")
    return app


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s homing-worker[%(process)d] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    if args.log_level != "DEBUG":
        # httpx logs every request at INFO: heartbeats and long polls would drown the
        # worker's own lines. --log-level DEBUG shows them.
        logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        app = load_app(args.module)
        if args.url:
            app.url = args.url.rstrip("/")
        queues = args.queues or sorted({t.queue for t in app.tasks.values()})
        worker = Worker(
            app,
            queues=queues,
            concurrency=args.concurrency or os.cpu_count() or 1,
            heartbeat_interval=args.heartbeat_interval,
            grace=args.grace,
            wait=min(args.poll, 30.0),
        )
    except WorkerError as e:
        return fail(str(e))
    code = worker.run()
    if worker.fatal is not None:
        print(f"homing worker: {worker.fatal}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
