"""The one place DR orchestration runs the `rbd` command-line tool.

    rbd(site, "snap", "ls", "--format", "json", "rbd/img")  -> stdout
    rbd_argv(site, "export", "--no-progress", "rbd/img@s", "-")  -> argv

A site is a dict naming its Ceph access: `ceph_conf`, `client_id`
(default `admin`), `keyring` (optional: ceph.conf may name one) and `pool`.
Every call has a timeout; a non-zero exit raises `RbdError` with the argv,
the exit status and stderr.  Replication, drills, failover and the drill
checks reach Ceph only through here, so moving them to the librados/librbd
bindings changes this module and no caller's logic.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from typing import Any


class RbdError(RuntimeError):
    """`rbd` failed: carries what was run and what it said."""

    def __init__(self, message: str, argv: Sequence[str] = (), returncode: int | None = None,
                 stderr: str = "") -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(message)

    @property
    def not_found(self) -> bool:
        """The image or snapshot named does not exist (ENOENT)."""
        return "No such file" in self.stderr or "does not exist" in self.stderr


def rbd_argv(site: dict[str, Any], *args: str) -> list[str]:
    """argv of `rbd ARGS` against `site`."""
    argv = ["rbd", "-c", site["ceph_conf"], "--id", site.get("client_id", "admin")]
    if site.get("keyring"):
        argv += ["--keyring", site["keyring"]]
    return argv + list(args)


def rbd(site: dict[str, Any], *args: str, timeout: float = 120) -> str:
    """Run `rbd ARGS` against `site`; its stdout, or RbdError."""
    argv = rbd_argv(site, *args)
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RbdError(f"rbd {' '.join(args)}: no answer within {timeout:g}s", argv, None,
                       "timeout") from exc
    if cp.returncode != 0:
        raise RbdError(f"rbd {' '.join(args)}: {cp.stderr.strip()[-400:]}", argv,
                       cp.returncode, cp.stderr)
    return cp.stdout
