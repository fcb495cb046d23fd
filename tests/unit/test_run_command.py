"""``dtprof run``'s command line and start-up hook, without torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dtprof.cli import main
from dtprof.commands.own_process import BLAS_THREAD_VARIABLES
from dtprof.commands.run import STARTUP


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def test_bad_commands_are_one_line_and_leave_no_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "trace"
    code, err = _main(["run", "--trace", str(trace), "--", "no-such-command-here"], capsys)
    assert code == 2 and err == "dtprof: error: no-such-command-here: no such command\n"
    code, err = _main(["run", "--trace", str(trace)], capsys)
    assert code == 2 and "no command to run" in err and err.count("\n") == 1
    assert not trace.exists()
    (trace / "rank=00000").mkdir(parents=True)
    code, err = _main(["run", "--trace", str(trace), "--", sys.executable, "-c", "0"], capsys)
    assert code == 2 and "already holds a trace" in err


def test_the_command_runs_with_the_start_up_hook_and_its_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE'] = 'ran'\n")
    probe = (
        "import os, sys\n"
        "assert sys.path[1] == os.environ['EXPECTED_FIRST'], sys.path\n"
        "assert os.environ['USER_SITE'] == 'ran'\n"
        "assert 'trace' in os.environ['DTPROF_RUN']\n"
        "sys.exit(3)\n"
    )
    env = {"PYTHONPATH": str(site), "EXPECTED_FIRST": str(STARTUP)}
    os.environ.update(env)
    try:
        code, err = _main(
            ["run", "--trace", str(tmp_path / "t"), "--", sys.executable, "-c", probe], capsys
        )
    finally:
        for key in env:
            del os.environ[key]
    assert code == 3, err
    assert "nothing recorded" in err  # no torch, no optimizer
    assert os.environ.get("PYTHONPATH") != str(STARTUP)  # this process's own is untouched


def test_the_start_up_hook_calls_back_once_a_watched_module_ran(tmp_path: Path) -> None:
    (tmp_path / "watched.py").write_text("VALUE = 42\n")
    probe = (
        "import sys\n"
        f"sys.path.insert(0, {str(STARTUP)!r})\n"
        "import sitecustomize as s\n"
        "seen = []\n"
        "sys.meta_path.insert(0, s.AfterImport({'watched': lambda m: seen.append(m.VALUE)}))\n"
        "import watched\n"
        "import watched\n"
        "print(seen)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "[42]"


def test_the_job_keeps_its_environment_where_other_commands_tune_theirs(tmp_path: Path) -> None:
    """dtprof's own commands load numpy without OpenBLAS's spinning threads or its huge page
    requests and read profiler traces with Arrow's jemalloc; the job that ``dtprof run`` starts
    sees none of these settings."""
    tuned = ("OPENBLAS_NUM_THREADS", "NUMPY_MADVISE_HUGEPAGE", "ARROW_DEFAULT_MEMORY_POOL")
    # none of the thread counts a user may set (the full suite ran with OMP_NUM_THREADS set)
    unset = (*tuned, *BLAS_THREAD_VARIABLES)
    env = {k: v for k, v in os.environ.items() if k not in unset}
    probe = f"import os; print([os.environ.get(k) for k in {tuned!r}])"
    job = [sys.executable, "-m", "dtprof", "run", "--trace", str(tmp_path / "t"), "--"]
    done = subprocess.run(
        [*job, sys.executable, "-c", probe], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[None, None, None]"
    own = (
        "import os, sys\n"
        "from dtprof.commands import own_process\n"
        "own_process.OWN = True\n"
        "own_process.no_blas_threads()\n"
        "own_process.no_huge_page_requests()\n"
        "import numpy\n"
        "print(os.environ.get('OPENBLAS_NUM_THREADS'), len(os.listdir('/proc/self/task')),\n"
        "      os.environ.get('NUMPY_MADVISE_HUGEPAGE'))\n"
    )
    done = subprocess.run([sys.executable, "-c", own], env=env, capture_output=True, text=True)
    assert done.stdout.split() == ["1", "1", "0"], done.stderr  # one thread: no OpenBLAS thread
    user_set = {**env, "OPENBLAS_NUM_THREADS": "2", "NUMPY_MADVISE_HUGEPAGE": "1"}
    done = subprocess.run([sys.executable, "-c", own], env=user_set, capture_output=True, text=True)
    blas, _, huge = done.stdout.split()
    assert (blas, huge) == ("2", "1"), done.stderr  # the user's own settings stay
