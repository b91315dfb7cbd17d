"""Errors of the lab, each carrying what was run and what came back."""

from __future__ import annotations


class LabError(Exception):
    """A lab operation failed; the message is one line meant for the user."""


class LabBusy(LabError):
    """Another process holds the lab lock."""


class LabNotUp(LabError):
    """No lab status exists in the state directory."""


class CommandError(LabError):
    """An external command failed: keeps argv, exit code, stdout and stderr."""

    def __init__(self, argv: list[str], returncode: int, stdout: str, stderr: str):
        self.argv = argv
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        tail = (stderr or stdout).strip().splitlines()[-3:]
        super().__init__(
            f"command failed (rc={returncode}): {' '.join(argv)}"
            + (f": {' | '.join(tail)}" if tail else "")
        )
