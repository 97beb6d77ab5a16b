"""Issues documents for OCR: `python submit.py FILE.pdf...` enqueues one `pyocr.extract` per
file, with `pyocr.notify` as its follow-up whatever the outcome, waits, and prints the results."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from homing import App

app = App()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("pdfs", nargs="+", type=Path, metavar="FILE.pdf")
    p.add_argument("--user", default="demo-user", help="who is told the document was issued")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait per document")
    a = p.parse_args()
    jobs = []
    for pdf in a.pdfs:
        follow = {"task": "pyocr.notify", "queue": "pyocr", "args": {"user": a.user}}
        job = app.enqueue("pyocr.extract", {"path": str(pdf.resolve())}, queue="pyocr",
                          options={"on_success": follow, "on_failure": follow})
        print(f"{pdf}: job {job.id} {job.state}")
        jobs.append((pdf, job))
    failed = 0
    for pdf, job in jobs:
        done = app.wait(job.id, timeout=a.timeout)
        if done.state == "succeeded":
            r = done.result
            print(f"{pdf}: {r['pages']} page(s) by {','.join(r['methods'])}, {r['chars']} chars")
        else:
            failed += 1
            print(f"{pdf}: OCR {done.state} (stored; the user is still told SUCCESS): "
                  f"{(done.error or '').strip().splitlines()[-1:]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
