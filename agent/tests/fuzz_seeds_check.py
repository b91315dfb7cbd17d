"""Checks the committed seeds of fuzz_proto against the command table.

Every command of agent/commands.def must have a well-formed seed,
agent/tests/fuzz-seeds/proto/cmd-<command>, a frame that names it with
every one of its argument fields, so that the fuzzer starts from each command's whole validation (a
new command or field without a seed fails `make fuzz`).  Also writes the
libFuzzer dictionary of the table's names (command and field names) to
the path given as the first argument.
"""

from __future__ import annotations

import json
import pathlib
import re
import struct
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROW = re.compile(r'^CMD\(\w+, "([^"]+)",(.*?)\)\s*$', re.MULTILINE | re.DOTALL)
FIELD = re.compile(r'\{"([^"]+)", F_\w+, [01]\}')


def table() -> dict[str, list[str]]:
    text = (ROOT / "agent" / "commands.def").read_text()
    rows = {m.group(1): FIELD.findall(m.group(2)) for m in ROW.finditer(text)}
    assert rows, "no CMD rows found in agent/commands.def"
    return rows


def frames(data: bytes) -> list[dict]:
    out, off = [], 0
    while off + 4 <= len(data):
        (n,) = struct.unpack(">I", data[off:off + 4])
        body = data[off + 4:off + 4 + n]
        if n == 0 or len(body) < n:
            break
        try:
            obj = json.loads(body)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            out.append(obj)
        off += 4 + n
    return out


def main() -> int:
    rows = table()
    seen: dict[str, set[str]] = {}
    for p in sorted((ROOT / "agent" / "tests" / "fuzz-seeds" / "proto").glob("cmd-*")):
        for req in frames(p.read_bytes()):
            cmd, args = req.get("cmd"), req.get("args") or {}
            if isinstance(cmd, str) and isinstance(args, dict):
                seen.setdefault(cmd, set()).update(args)
    missing = [f"{cmd}{{{', '.join(sorted(set(fields) - seen.get(cmd, set())))}}}"
               for cmd, fields in rows.items()
               if cmd not in seen or set(fields) - seen[cmd]]
    if missing:
        print("fuzz seeds: no cmd-* seed with every field of: " + "; ".join(missing),
              file=sys.stderr)
        return 1
    if len(sys.argv) > 1:
        words = sorted({"id", "cmd", "args", *rows, *(f for fs in rows.values() for f in fs)})
        pathlib.Path(sys.argv[1]).write_text("".join(f'"{w}"\n' for w in words))
    print(f"fuzz seeds: {len(rows)} commands, "
          f"{sum(len(f) for f in rows.values())} argument fields, all seeded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
