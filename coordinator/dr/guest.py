"""Calls into a booted VM's guest through the agent that started it.

    ping(tls, agent, vm, timeout_s)                      -> seconds it took
    run(tls, agent, vm, path, args, input, timeout_s)    -> ExecResult

Both go through the agent's `vm.guest_ping` / `vm.guest_exec`
(docs/agent-protocol.md 4.12: qemu-guest-agent through the agent's
driver), over mutual TLS with the agent's certificate pinned, as every
call to an agent is.  A drill's readiness rule (readiness.py) and its
in-guest checks (checks_guest.py) use them.  Errors are `GuestError`, with
the agent's code (GUEST_ERROR, GUEST_TIMEOUT, UNKNOWN_VM, ...) or the
client's (CONNECT, TIMEOUT).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from cutpoint.coordinator.dr.boot import AgentRef


class GuestError(RuntimeError):
    def __init__(self, code: str, message: str) -> None:
        self.code = code
        super().__init__(f"{code}: {message}")


@dataclass(frozen=True)
class ExecResult:
    exitcode: int | None
    signal: int | None
    stdout: str
    stderr: str
    seconds: float
    truncated: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"exitcode": self.exitcode, "signal": self.signal, "stdout": self.stdout,
                "stderr": self.stderr, "seconds": round(self.seconds, 3),
                "truncated": self.truncated}


async def _call(tls: tuple[str, str, str], agent: AgentRef, cmd: str, args: dict[str, Any],
                timeout_s: float) -> dict[str, Any]:
    from cutpoint.agentclient import AgentClient, AgentError
    from cutpoint.agentclient.tls import client_context

    try:
        async with AgentClient(agent.address, agent.port, ssl_context=client_context(*tls),
                               cert_sha256=agent.cert_sha256, connect_timeout=10,
                               call_timeout=timeout_s + 10) as c:
            r: dict[str, Any] = await c.call(cmd, args, timeout=timeout_s + 10)
            return r
    except AgentError as exc:
        raise GuestError(exc.code, f"{cmd} on {agent}: {exc.message}") from exc


def _ms(timeout_s: float) -> int:
    return max(1, min(600000, int(timeout_s * 1000)))


def ping(tls: tuple[str, str, str], agent: AgentRef, vm: str, timeout_s: float = 5) -> float:
    r = asyncio.run(_call(tls, agent, "vm.guest_ping", {"vm": vm, "timeout_ms": _ms(timeout_s)},
                          timeout_s))
    return float(r.get("ping_ms", 0)) / 1000


def run(tls: tuple[str, str, str], agent: AgentRef, vm: str, path: str,
        args: list[str] | None = None, input: str | None = None,
        timeout_s: float = 30) -> ExecResult:
    a: dict[str, Any] = {"vm": vm, "path": path, "timeout_ms": _ms(timeout_s)}
    if args:
        a["args"] = list(args)
    if input is not None:
        a["input"] = input
    r = asyncio.run(_call(tls, agent, "vm.guest_exec", a, timeout_s))
    return ExecResult(r.get("exitcode"), r.get("signal"), r.get("stdout", ""),
                      r.get("stderr", ""), float(r.get("exec_ms", 0)) / 1000,
                      bool(r.get("stdout_truncated") or r.get("stderr_truncated")))
