"""Accelerator boot probe: KVM only if a guest really boots under it.

`/dev/kvm` can open and KVM_CREATE_VM succeed while guests hang (LAB-NOTES),
so the probe boots the tiny image with `cp.workload=probe` under KVM and
waits for the line CP-PROBE-OK on the serial console.  The guest prints it
about 2 s after boot under KVM; the probe gives up after PROBE_TIMEOUT and
the lab uses TCG.  The verdict is cached per kernel in the image cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from cutpoint.lab import config as C
from cutpoint.lab.proc import MARK

PROBE_TIMEOUT = 8.0
KVM_CPU = "kvm64"


def _cache_file(kernel: str, cache: Path) -> Path:
    st = os.stat(kernel)
    key = hashlib.sha256(f"{kernel}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache / f"accel-{key}.json"


def boot_probe(kernel: str, initrd: str, timeout: float = PROBE_TIMEOUT) -> tuple[bool, str]:
    """Boot under KVM; (ok, why)."""
    argv = ["qemu-system-x86_64", "-name", "guest=probe,process=cplab-probe", "-nodefaults", "-no-user-config", "-machine", "pc,accel=kvm",
            "-cpu", KVM_CPU, "-m", "128", "-display", "none", "-serial", "stdio", "-no-reboot",
            "-kernel", kernel, "-initrd", initrd,
            "-append", "console=ttyS0 quiet panic=-1 cp.workload=probe"]
    env = dict(os.environ, **{MARK: "probe"})
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    t0 = time.monotonic()
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        return False, f"no CP-PROBE-OK within {timeout:.0f}s under KVM (guest hangs)"
    text = out.decode(errors="replace")
    if "CP-PROBE-OK" in text:
        return True, f"booted under KVM in {time.monotonic() - t0:.1f}s"
    last = text.strip().splitlines()[-1:] or ["no output"]
    return False, f"QEMU exited rc={p.returncode} under KVM: {last[0]}"


def choose_accel(kernel_src: str, image: dict[str, Any], forced: str | None = None,
                 cache: str | Path = C.IMAGE_CACHE, log: Any = print) -> dict[str, Any]:
    """{"accel": "kvm"|"tcg", "why": ..., "cached": bool}."""
    forced = forced or os.environ.get("CUTPOINT_LAB_ACCEL") or None
    if forced:
        return {"accel": forced, "why": "forced", "cached": False}
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return {"accel": "tcg", "why": "/dev/kvm not usable", "cached": False}
    f = _cache_file(kernel_src, Path(cache))
    try:
        v = json.loads(f.read_text())
        v["cached"] = True
        return v
    except (OSError, ValueError):
        pass
    log(f"probe: booting the tiny guest under KVM (up to {PROBE_TIMEOUT:.0f}s)")
    ok, why = boot_probe(image["kernel"], image["initrd"])
    v = {"accel": "kvm" if ok else "tcg", "why": why, "kernel": kernel_src}
    f.parent.mkdir(parents=True, exist_ok=True)
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps(v) + "\n")
    os.replace(tmp, f)
    log(f"probe: {v['accel']} ({why})")
    v["cached"] = False
    return v
