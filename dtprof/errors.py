"""DtprofError: a user-facing problem, shown as one line on stderr with exit code 2."""


class DtprofError(Exception):
    """Bad input or a bad request: the message names the file and what is wrong."""

    def __init__(self, message: str) -> None:
        # one line whatever the cause says (pyarrow's messages span several)
        super().__init__(" ".join(str(message).split()))
