"""Records what a real qemu-guest-agent answers to the commands of
vm.guest_ping and vm.guest_exec, for the replay tests (test_guest.c).

Runs Debian's `qemu-ga` (package qemu-guest-agent) on this machine,
listening on a UNIX socket of a temporary directory (`-m unix-listen`),
and talks to it as cutpointd does: guest-sync-delimited, then the
command.  The agent runs the commands on this machine, so only harmless
ones are sent (sh -c of echo/printf/sleep/exit).  Writes
agent/tests/qga-replies/guest.json: {scenario: [[dir, text], ...]}, the
format of dr-tests/tests/data/qga_transcript.json ("sent" lines the
client must send, "received" bytes as latin-1 text; U+00FF is the 0xFF
delimiter).  pid values are whatever the real agent gave.

Usage: python3 agent/tests/record_qga.py
"""

from __future__ import annotations

import json
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "qga-replies" / "guest.json"


class Rec:
    def __init__(self, path: str) -> None:
        self.s = socket.socket(socket.AF_UNIX)
        self.s.connect(path)
        self.s.settimeout(10)
        self.buf = b""
        self.steps: list[list[str]] = []

    def send(self, cmd: str, args: dict | None = None) -> None:
        msg = {"execute": cmd, **({"arguments": args} if args is not None else {})}
        data = (json.dumps(msg) + "\n").encode()
        self.steps.append(["sent", data.decode("latin-1")])
        self.s.sendall(data)

    def line(self, delim: bool = False) -> dict:
        while b"\n" not in self.buf:
            chunk = self.s.recv(1 << 20)
            assert chunk, "qemu-ga closed the connection"
            self.buf += chunk
        i = self.buf.index(b"\n") + 1
        raw, self.buf = self.buf[:i], self.buf[i:]
        self.steps.append(["received", raw.decode("latin-1")])
        return json.loads(raw.lstrip(b"\xff"))

    def sync(self) -> None:
        n = random.randrange(1, 1 << 31)
        self.send("guest-sync-delimited", {"id": n})
        assert self.line()["return"] == n

    def call(self, cmd: str, args: dict | None = None) -> dict:
        self.send(cmd, args)
        return self.line()

    def exec_wait(self, args: dict, polls_before_exit: int = 0) -> dict:
        """guest-exec, then status until exited (status lines recorded)."""
        pid = self.call("guest-exec", args)["return"]["pid"]
        while True:
            st = self.call("guest-exec-status", {"pid": pid})["return"]
            if st["exited"]:
                return st
            time.sleep(0.2)


def main() -> None:
    qga = shutil.which("qemu-ga") or "/usr/sbin/qemu-ga"
    d = tempfile.mkdtemp(prefix="cp-qga-rec-")
    sock = os.path.join(d, "qga.sock")
    p = subprocess.Popen([qga, "-m", "unix-listen", "-p", sock, "-t", d],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    out: dict[str, list[list[str]]] = {}
    try:
        for _ in range(100):
            if os.path.exists(sock):
                break
            time.sleep(0.05)

        def scenario(name: str, fn) -> None:
            r = Rec(sock)
            r.sync()
            fn(r)
            out[name] = r.steps
            r.s.close()

        scenario("ping", lambda r: r.call("guest-ping"))
        # output on both streams, exit 3; stdin given (input-data)
        scenario("exec", lambda r: r.exec_wait({
            "path": "/bin/sh", "arg": ["-c", "cat; echo out-line; echo err-line >&2; exit 3"],
            "input-data": "aW5wdXQtbGluZQo=", "capture-output": True}))
        # still running at the first status: a poll that says exited=false
        scenario("exec_slow", lambda r: r.exec_wait({
            "path": "/bin/sh", "arg": ["-c", "sleep 0.5; printf 'caf\\303\\251 \\377'"],
            "capture-output": True}))
        # a program that does not exist: qemu-ga's error reply
        scenario("exec_missing", lambda r: r.call("guest-exec", {
            "path": "/nonexistent/prog", "capture-output": True}))
        # 100000 bytes of output: more than the agent keeps
        scenario("exec_big", lambda r: r.exec_wait({
            "path": "/bin/sh", "arg": ["-c", "head -c 100000 /dev/zero | tr '\\0' x"],
            "capture-output": True}))
        # a process that never ends within the test's deadline
        def long(r: Rec) -> None:
            pid = r.call("guest-exec", {"path": "/bin/sleep", "arg": ["30"],
                                        "capture-output": True})["return"]["pid"]
            r.call("guest-exec-status", {"pid": pid})
            os.kill(pid, 9)  # ours: qemu-ga ran it on this machine
        scenario("exec_long", long)
    finally:
        p.terminate()
        p.wait(10)
        shutil.rmtree(d, ignore_errors=True)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT}: {', '.join(f'{k} ({len(v)} steps)' for k, v in out.items())}")


if __name__ == "__main__":
    main()
