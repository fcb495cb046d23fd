"""Where a command's rendered report goes: a file (``-o``), else standard output."""

from __future__ import annotations

from dtprof.errors import DtprofError


def deliver(text: str, path: str | None, what: str) -> None:
    """Write ``text`` to ``path`` (a one-line error naming it and ``what`` if it cannot be
    written), or print it where no path is given."""
    if not path:
        print(text)
        return
    try:
        with open(path, "w") as f:
            f.write(text + "\n")
    except OSError as exc:
        raise DtprofError(f"{path}: cannot write the {what} ({exc.strerror})") from None
