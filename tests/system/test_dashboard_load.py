"""`dtprof dashboard` as started from the command line: loopback only, no file outside the app
served whatever the path says, and still answering after a burst of 200 requests."""

from __future__ import annotations

import http.client
import os
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dtprof.jobs.launch import free_port

SAMPLE = Path(__file__).parents[2] / "sample_traces" / "healthy-ddp"
pytestmark = pytest.mark.timeout(120)


def _get(port: int, path: str, timeout_s: float = 10) -> tuple[int, bytes]:
    """One GET with the path sent exactly as given (no client-side normalization)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.putrequest("GET", path, skip_accept_encoding=True)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    root = tmp_path_factory.mktemp("dash")
    trace = root / "trace"
    shutil.copytree(SAMPLE, trace)
    secret = root / "secret.txt"
    token = secrets.token_hex(16)
    secret.write_text(token)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dtprof", "dashboard", str(trace), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(os.environ, DTPROF_CACHE_DIR=str(root / "cache")),
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                if _get(port, "/_dash-layout", 2)[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the dashboard did not come up"
            time.sleep(0.2)
        yield {"port": port, "root": root, "trace": trace, "secret": secret, "token": token}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _listening(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} writes them) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if int(hex_port, 16) == port and fields[3] == "0A":  # 0A: LISTEN
                found.add(address)
    return found


def test_it_binds_the_loopback_address_only(served: dict) -> None:
    if not os.path.exists("/proc/net/tcp"):
        pytest.skip("no /proc/net/tcp on this system")
    assert _listening(served["port"]) == {"0100007F"}  # 127.0.0.1, little-endian hex


def test_no_path_reads_a_file(served: dict) -> None:
    secret, trace = served["secret"], served["trace"]
    rel_secret = "/".join([".."] * 12) + str(secret)
    meta_text = (trace / "rank=00000" / "meta.json").read_text()
    paths = [
        "/../secret.txt",
        "/../../../../../../etc/passwd",
        "/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/%2E%2E%2F%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
        "/..%2f..%2f..%2f..%2fetc%2fpasswd",
        "/_dash-component-suites/../../../../../../etc/passwd",
        "/_dash-component-suites/dash/../../../../../../../etc/passwd",
        "/_dash-component-suites/dash/%2e%2e/%2e%2e/%2e%2e/%2e%2e/%2e%2e/etc/passwd",
        "/_dash-component-suites/dash/..%2f..%2f..%2f..%2f..%2f..%2fetc%2fpasswd",
        f"/_dash-component-suites/dash/{rel_secret}",
        f"/_dash-component-suites/dash/deps/{rel_secret}",
        f"/assets/{rel_secret}",
        "/assets/../../../../../../etc/passwd",
        "//etc/passwd",
        "/etc/passwd",
        str(secret),
        f"/{rel_secret}",
        "/rank=00000/meta.json",
        f"/{trace}/rank=00000/meta.json",
        "/_dash-component-suites/dash/../../rank=00000/meta.json",
        "/_reload-hash/../../../etc/passwd",
    ]
    passwd = Path("/etc/passwd").read_text() if Path("/etc/passwd").exists() else None
    for path in paths:
        status, body = _get(served["port"], path)
        text = body.decode(errors="replace")
        assert served["token"] not in text, path
        assert '"schema_version"' not in text and meta_text not in text, path
        if passwd:
            assert "root:x:0:0" not in text and passwd[:40] not in text, path
        assert status in (200, 400, 404, 405), (path, status)


def test_a_burst_of_200_requests_leaves_it_answering(served: dict) -> None:
    port = served["port"]
    paths = ["/_dash-layout", "/", "/_dash-dependencies", "/../../etc/passwd", "/no/such/page"]

    def hit(i: int) -> int:
        try:
            return _get(port, paths[i % len(paths)], timeout_s=30)[0]
        except OSError:
            return -1

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=40) as pool:
        codes = list(pool.map(hit, range(200)))
    took = time.monotonic() - started
    assert codes.count(-1) <= 10, (codes, took)  # a few refused by a full backlog at most
    status, body = _get(port, "/_dash-layout", timeout_s=10)
    assert status == 200 and body.startswith(b"{")
