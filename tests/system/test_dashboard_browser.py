"""The dashboard in a real browser: every page renders its charts with no console error.

Runs `dtprof dashboard` on sample traces in subprocesses and drives headless Chromium (the
Debian package, installed by scripts/browser.sh) through Playwright. Each page's screenshot is
saved as <page>.png in a temporary folder, or in the folder DTPROF_SCREENSHOTS names
(``DTPROF_SCREENSHOTS=docs/screenshots`` refreshes the documentation's), so that a test run
leaves the working tree as it was.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dtprof.jobs.launch import free_port

CHROMIUM = Path(os.environ.get("DTPROF_CHROMIUM", "/usr/bin/chromium"))
ROOT = Path(__file__).resolve().parents[2]
SHOTS_ENV = os.environ.get("DTPROF_SCREENSHOTS")
VIEWPORT = {"width": 1400, "height": 900}

# page -> (sample trace that shows it best, path with its window)
PAGES = {
    "overview": ("straggler-ddp", "/"),
    "ranks": ("straggler-ddp", "/ranks"),
    "timeline": ("straggler-ddp", "/timeline?ranks=0-3&steps=10:13"),
    "communication": ("poor-overlap", "/communication"),
    "pipeline": ("pipeline-1f1b", "/pipeline?step=15"),
    "memory": ("straggler-ddp", "/memory"),
    "divergence": ("divergence", "/divergence"),
}

playwright_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
if not CHROMIUM.exists() and os.environ.get("CI"):
    # CI installs it (scripts/browser.sh): a missing browser there is a failure, not a skip
    pytest.fail(f"no Chromium at {CHROMIUM} in CI", pytrace=False)
if not CHROMIUM.exists():
    pytest.skip(
        f"no Chromium at {CHROMIUM} (scripts/browser.sh installs it)", allow_module_level=True
    )


def _serve(trace: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dtprof",
            "dashboard",
            str(ROOT / "sample_traces" / trace),
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    return proc, f"http://127.0.0.1:{port}"


def _wait_up(proc: subprocess.Popen[bytes], url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise AssertionError(f"dtprof dashboard exited with {proc.returncode}: {err}")
        try:
            with urllib.request.urlopen(url + "/_dash-layout", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer within {timeout_s} s")


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    """One server per sample trace used, started together."""
    started = {trace: _serve(trace) for trace in sorted({t for t, _ in PAGES.values()})}
    try:
        for proc, url in started.values():
            _wait_up(proc, url)
        yield {trace: url for trace, (_, url) in started.items()}
    finally:
        for proc, _ in started.values():
            proc.terminate()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    with playwright_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield browser
        browser.close()


GRAPHS_DRAWN = """() => {
  const graphs = [...document.querySelectorAll('.js-plotly-plot')];
  return graphs.map(g => ({
    traces: (g.data || []).length,
    note: ((g.layout || {}).annotations || []).length,
    svg: g.querySelectorAll('.main-svg').length,
  }));
}"""


def _open(browser: object, url: str) -> tuple[object, list[str]]:
    page = browser.new_page(viewport=VIEWPORT)  # type: ignore[attr-defined]
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    return page, errors


def _settle(page: object) -> list[dict[str, int]]:
    """Wait until every graph has its figure from the server (data or an explaining note)."""
    page.wait_for_selector(".js-plotly-plot .main-svg", timeout=20_000)  # type: ignore[attr-defined]
    page.wait_for_function(  # type: ignore[attr-defined]
        f"() => ({GRAPHS_DRAWN})().every(g => g.traces > 0 || g.note > 0)", timeout=20_000
    )
    page.wait_for_timeout(300)  # type: ignore[attr-defined]  # transitions end
    return page.evaluate(GRAPHS_DRAWN)  # type: ignore[attr-defined,no-any-return]


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(SHOTS_ENV) if SHOTS_ENV else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.mark.parametrize("name", list(PAGES))
def test_page_renders_without_console_errors(
    name: str, servers: dict[str, str], browser: object, shots: Path
) -> None:
    trace, path = PAGES[name]
    page, errors = _open(browser, servers[trace] + path)
    graphs = _settle(page)
    assert graphs and all(g["svg"] for g in graphs)
    assert sum(g["traces"] for g in graphs) > 0, f"{name}: no chart has data"
    page.screenshot(path=str(shots / f"{name}.png"), full_page=False)  # type: ignore[attr-defined]
    assert (shots / f"{name}.png").stat().st_size > 10_000, f"{name}: an empty screenshot"
    page.close()  # type: ignore[attr-defined]
    assert errors == [], f"{name}: browser console errors: {errors}"


def test_clicking_a_finding_opens_its_window(servers: dict[str, str], browser: object) -> None:
    page, errors = _open(browser, servers["straggler-ddp"] + "/")
    _settle(page)  # the page drawn from the trace's snapshot: its cards stay as they are
    for attempt in range(3):  # on a busy machine a redraw may still replace the card clicked
        page.click("#overview-findings .finding-link")  # type: ignore[attr-defined]
        try:
            page.wait_for_url("**/timeline?**", timeout=10_000)  # type: ignore[attr-defined]
            break
        except playwright_api.TimeoutError:
            if attempt == 2:
                raise
    assert "ranks=0-3" in page.url  # type: ignore[attr-defined]  # the straggler, rank 1, and its neighbours
    graphs = _settle(page)
    assert graphs[0]["traces"] > 3
    assert page.input_value("#timeline-ranks") == "0-3"  # type: ignore[attr-defined]
    page.close()  # type: ignore[attr-defined]
    assert errors == []
