"""The seeds' document OCR task, written in Python on the homing package.

What the seed asked of its Celery worker, and how it is met here:
- queue `pyocr`, concurrency 1, prefetch 1: run the worker with `--concurrency 1`; it never
  reserves more jobs than it has free slots, so it holds one document at a time. (`homing up`
  runs the Rust version of this pipeline on queue `ocr`; this one has its own queue so the two
  never take each other's jobs.)
- two retries 30 s apart: `max_retries=2, retry_delay=30`, kept by the server, so a retry
  survives the worker, the server and the machine restarting.
- FAILED stored but SUCCESS notified: `submit.py` enqueues the extraction with `pyocr.notify` as
  its follow-up on success *and* on failure. homing enqueues the follow-up in the same store
  transaction as the terminal state, so the user is told exactly once, whatever crashes; the
  notification says SUCCESS either way (the PDF was issued; only its text is missing), while
  the extraction job itself stays `failed` with its error.
- a crashed worker's document is taken up again: homing's late acknowledgement and heartbeats.

The extraction reads the PDF's text layer with pdftotext and falls back to tesseract on pages
that have none (scans), like the Rust pipeline. Both run as subprocesses without a shell.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from homing import App, Context, Fatal

app = App()

QUEUE = "pyocr"
# A page with fewer characters than this in its text layer is treated as a scan.
MIN_TEXT = 20
TOOLS = {"pdfinfo": "poppler-utils", "pdftotext": "poppler-utils",
         "pdftoppm": "poppler-utils", "tesseract": "tesseract-ocr"}


def run(args: list[str], timeout: float = 120) -> str:
    """Runs a tool; a missing tool is fatal (retrying cannot install it), a failure retryable."""
    tool = args[0]
    if shutil.which(tool) is None:
        raise Fatal(f"{tool} is not installed (Debian package {TOOLS.get(tool, tool)})")
    out = subprocess.run(args, capture_output=True, timeout=timeout, check=False)
    if out.returncode != 0:
        err = out.stderr.decode(errors="replace").strip()[-2000:]
        raise RuntimeError(f"{tool} exited with {out.returncode}: {err}")
    return out.stdout.decode(errors="replace")


def page_count(pdf: Path) -> int:
    for line in run(["pdfinfo", str(pdf)]).splitlines():
        if line.startswith("Pages:"):
            return int(line.split(":", 1)[1])
    raise Fatal(f"{pdf} has no page count: not a PDF?")


def languages() -> str:
    listed = run(["tesseract", "--list-langs"]).split()
    chosen = [lang for lang in ("kor", "eng") if lang in listed]
    return "+".join(chosen) or "eng"


def ocr_page(pdf: Path, page: int, work: Path) -> str:
    prefix = work / f"page-{page}"
    run(["pdftoppm", "-r", "300", "-gray", "-png", "-f", str(page), "-l", str(page),
         str(pdf), str(prefix)])
    images = sorted(work.glob(f"page-{page}*.png"))
    if not images:
        raise RuntimeError(f"pdftoppm made no image of page {page}")
    return run(["tesseract", str(images[0]), "stdout", "-l", languages()])


@app.task(name="pyocr.extract", queue=QUEUE, max_retries=2, retry_delay=30)
def extract(ctx: Context, path: str) -> dict[str, Any]:
    pdf = Path(path)
    if not pdf.is_file():
        raise Fatal(f"no PDF at {path}")
    pages = page_count(pdf)
    texts: list[str] = []
    methods: list[str] = []
    with tempfile.TemporaryDirectory(prefix="homing-ocr-") as tmp:
        for page in range(1, pages + 1):
            if ctx.cancelled():
                raise Fatal("stopped: the job was cancelled or is no longer this worker's")
            text = run(["pdftotext", "-layout", "-f", str(page), "-l", str(page), str(pdf), "-"])
            method = "text"
            if len(text.strip()) < MIN_TEXT:
                text, method = ocr_page(pdf, page, Path(tmp)), "ocr"
            texts.append(text.strip())
            methods.append(method)
            ctx.progress({"page": page, "pages": pages})
    text = "\n\n".join(texts)
    return {"pages": pages, "methods": methods, "chars": len(text), "text": text}


@app.task(name="pyocr.notify", queue=QUEUE, max_retries=5, retry_delay=5)
def notify(ctx: Context, parent: dict[str, Any], user: str = "unknown") -> dict[str, Any]:
    """Tells the user the document was issued. SUCCESS whatever the extraction's outcome: the
    seed's rule (an OCR failure does not undo issuance). Here the message is a line appended to
    a file ($HOMING_OCR_NOTIFICATIONS, default notifications.jsonl); a real service would call a
    webhook, with `ctx.idempotency_key` (the same on every run) as its Idempotency-Key."""
    message = {
        "user": user,
        "status": "SUCCESS",
        "document_job": parent.get("id"),
        "ocr": parent.get("state"),
        "key": ctx.idempotency_key,
        "at": time.time(),
    }
    out = Path(os.environ.get("HOMING_OCR_NOTIFICATIONS", "notifications.jsonl"))
    with out.open("a", encoding="utf-8") as f:
        f.write(json.dumps(message, ensure_ascii=False) + "\n")
    return message
