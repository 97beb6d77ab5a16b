"""examples/python (the seeds' OCR task on this package) against a real `homing up`: a PDF with a
text layer, a scan that needs tesseract, and a missing file whose failure is stored while the
user is still told SUCCESS."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from .conftest import Homing, eventually

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "python"


def need(tool: str, package: str) -> None:
    assert shutil.which(tool), f"{tool} is missing: install the Debian package {package}"


def make_pdfs(tmp: Path) -> tuple[Path, Path]:
    need("pango-view", "pango1.0-tools")
    need("img2pdf", "img2pdf")
    text = tmp / "text.pdf"
    subprocess.run(["pango-view", "--no-display", "--font=DejaVu Sans 14", "--text",
                    "homing OCR example: the quick brown fox jumps over the lazy dog",
                    "--output", str(text)], check=True)
    png = tmp / "scan.png"
    subprocess.run(["pango-view", "--no-display", "--dpi", "300", "--font=DejaVu Sans 14",
                    "--text", "Scanned page: homing recovers crashed workers",
                    "--output", str(png)], check=True)
    scan = tmp / "scan.pdf"
    subprocess.run(["img2pdf", str(png), "-o", str(scan)], check=True)
    return text, scan


def test_ocr_example(tmp_path: Path) -> None:
    for tool, package in [("pdftotext", "poppler-utils"), ("tesseract", "tesseract-ocr")]:
        need(tool, package)
    text_pdf, scan_pdf = make_pdfs(tmp_path)
    notes = tmp_path / "notifications.jsonl"
    h = Homing(tmp_path).start()
    try:
        w = h.worker("--concurrency", "1", module="ocr_tasks", cwd=EXAMPLE,
                     extra_env={"HOMING_OCR_NOTIFICATIONS": str(notes)})
        eventually("the OCR worker's session", lambda: "registered" in w.text())
        env = h.env()
        env["HOMING_URL"] = h.url
        out = subprocess.run(
            [sys.executable, "submit.py", str(text_pdf), str(scan_pdf),
             str(tmp_path / "missing.pdf"), "--timeout", "120"],
            cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=180, check=False)
        assert out.returncode == 1, out.stdout + out.stderr  # one document failed
        lines = out.stdout.splitlines()
        assert any("text.pdf: 1 page(s) by text" in line for line in lines), out.stdout
        assert any("scan.pdf: 1 page(s) by ocr" in line for line in lines), out.stdout
        assert any("missing.pdf: OCR failed" in line and "no PDF at" in line
                   for line in lines), out.stdout

        def notified() -> list[dict[str, str]]:
            if not notes.exists():
                return []
            got = [json.loads(x) for x in notes.read_text().splitlines()]
            return got if len(got) >= 3 else []

        got = eventually("three notifications", notified)
        assert len(got) == 3, got
        assert {n["status"] for n in got} == {"SUCCESS"}
        assert sorted(n["ocr"] for n in got) == ["failed", "succeeded", "succeeded"]
    finally:
        h.stop()
