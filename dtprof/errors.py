"""DtprofError: a user-facing problem, shown as one line on stderr with exit code 2."""


class DtprofError(Exception):
    """Bad input or a bad request: the message names the file and what is wrong."""
