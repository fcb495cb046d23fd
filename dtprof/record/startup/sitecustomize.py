"""Start-up hook of the processes that ``dtprof run`` starts (this folder is first on their
PYTHONPATH, and holds nothing else, so that it shadows no module of the user's).

Python imports ``sitecustomize`` at start-up. This one does nothing unless DTPROF_RUN is set
and DTPROF_DISABLE is not; then it waits, at no cost, for the process to import torch, and
hands over to ``dtprof.record.auto``. A ``sitecustomize`` of the user's own, further along
the path, is run after it, as Python would have run it.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))


class AfterImport:
    """A finder that finds nothing itself: it lets the other finders find a watched module,
    and calls back once that module has run (once per name)."""

    def __init__(self, callbacks: dict[str, Callable[[ModuleType], None]]) -> None:
        self.callbacks = callbacks

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        callback = self.callbacks.get(name)
        if callback is None:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        del self.callbacks[name]
        run_module = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            callback(module)

        loader.exec_module = exec_module  # this spec's own loader
        return spec


def _hand_over(what: str) -> Callable[[ModuleType], None]:
    def call(module: ModuleType) -> None:
        try:
            from dtprof.record import auto

            getattr(auto, what)(module)
        except Exception as exc:  # recording must never stop the user's process
            print(f"dtprof run: not recording this process: {exc}", file=sys.stderr)

    return call


def _users_sitecustomize() -> None:
    """Run the sitecustomize this one shadows, if there is one further along the path."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[__name__] = module
    spec.loader.exec_module(module)


if os.environ.get("DTPROF_RUN") and os.environ.get("DTPROF_DISABLE", "") in ("", "0"):
    sys.meta_path.insert(
        0,
        AfterImport(
            {
                "torch": _hand_over("torch_imported"),
                "torch.distributed.pipelining.schedules": _hand_over("pipelining_imported"),
            }
        ),
    )
_users_sitecustomize()
