"""Frames of the agent protocol (agent-protocol §2).

A frame is a 4-byte big-endian length N (1 <= N <= 1 MiB), then N bytes of
UTF-8 JSON encoding exactly one object.  The functions here are pure, so the
tests can replay frames recorded from the real agent byte for byte.
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

from cutpoint.agentclient.errors import FrameError

MAX_FRAME = 1048576  # agent-protocol §2.2
HEADER = struct.Struct(">I")


def encode_frame(obj: dict[str, Any]) -> bytes:
    """One frame holding `obj` (§2.1); refuses what the agent would reject."""
    if not isinstance(obj, dict):
        raise FrameError(f"a frame holds one JSON object, not {type(obj).__name__}")
    body = json.dumps(obj, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False).encode("utf-8")
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    if b"\x00" in body:
        # §2.2: a NUL byte makes the frame BAD_FRAME; JSON escapes it as
        # \u0000 so only a bug could get here.
        raise FrameError("NUL byte in frame body")
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes) -> dict[str, Any]:
    """Parse one frame body (§2.2 checks, in the agent's order)."""
    if not body:
        raise FrameError("empty frame", body)
    if len(body) > MAX_FRAME:
        raise FrameError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}", body[:64])
    if b"\x00" in body:
        raise FrameError("NUL byte in frame body", body)
    try:
        text = body.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        raise FrameError(f"invalid UTF-8 at byte {exc.start}", body) from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FrameError(f"invalid JSON: {exc.msg} at {exc.pos}", body) from None
    if not isinstance(obj, dict):
        raise FrameError(f"frame holds a JSON {type(obj).__name__}, not an object", body)
    return obj


def check_length(n: int) -> None:
    if n == 0 or n > MAX_FRAME:
        raise FrameError(f"frame length {n} outside 1..{MAX_FRAME}", HEADER.pack(n))


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, get whole objects."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buf += data
        out: list[dict[str, Any]] = []
        while len(self._buf) >= HEADER.size:
            (n,) = HEADER.unpack_from(self._buf)
            check_length(n)
            if len(self._buf) < HEADER.size + n:
                break
            body = bytes(self._buf[HEADER.size:HEADER.size + n])
            del self._buf[:HEADER.size + n]
            out.append(decode_body(body))
        return out

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame still buffered."""
        return len(self._buf)


async def read_frame(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """Read one frame; None on a clean end of stream between frames."""
    try:
        header = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if not exc.partial:
            return None
        raise FrameError("stream ended inside a frame header", exc.partial) from None
    (n,) = HEADER.unpack(header)
    check_length(n)
    try:
        body = await reader.readexactly(n)
    except asyncio.IncompleteReadError as exc:
        raise FrameError(f"stream ended after {len(exc.partial)} of {n} body bytes",
                         exc.partial[:64]) from None
    return decode_body(body)


def check_reply(reply: dict[str, Any]) -> None:
    """Shape checks of a reply (agent-protocol §3.3/§3.4)."""
    if "id" not in reply:
        raise FrameError("reply without id")
    ok = reply.get("ok")
    if not isinstance(ok, bool):
        raise FrameError("reply without boolean ok")
    if ok:
        if not isinstance(reply.get("result"), dict):
            raise FrameError("ok reply without result object")
    else:
        err = reply.get("error")
        if (not isinstance(err, dict) or not isinstance(err.get("code"), str)
                or not isinstance(err.get("message", ""), str)):
            raise FrameError("error reply without error{code, message}")
