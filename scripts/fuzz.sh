#!/bin/bash
# `make fuzz`: builds each fuzz target with clang -fsanitize=fuzzer,address
# into build-fuzz/ and runs each for its share of $1 seconds (default 60):
#   fuzz_proto    frames and requests (seeds built below from commands.def)
#   fuzz_journal  the journal file parser (seeds: agent/tests/fuzz-seeds/journal)
#   fuzz_qmp      the QMP client on a monitor's byte stream (seeds:
#                 agent/tests/fuzz-seeds/qmp, from tests/qmp-replies)
#   fuzz_domxml   the libvirt driver's domain XML parser (seeds:
#                 agent/tests/fuzz-seeds/domxml)
# Exits non-zero on a crash; the crash input is left in build-fuzz/ (crash-*).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
targets=(proto journal qmp domxml)
share=$(( secs / ${#targets[@]} ))
[ "$share" -ge 1 ] || share=1
mkdir -p build-fuzz/corpus build-fuzz/corpus-journal build-fuzz/corpus-qmp \
    build-fuzz/corpus-domxml
cflags=(-g -O1 -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror
        -fsanitize=fuzzer,address,undefined -Iagent)
clang "${cflags[@]}" agent/proto.c agent/tests/fuzz_proto.c -ljansson \
    -o build-fuzz/fuzz_proto
clang "${cflags[@]}" agent/journal.c agent/tests/fuzz_journal.c -lpthread \
    -o build-fuzz/fuzz_journal
clang "${cflags[@]}" -Istorage agent/qmp.c agent/log.c agent/tests/fuzz_qmp.c \
    -ljansson -o build-fuzz/fuzz_qmp
clang "${cflags[@]}" $(pkg-config --cflags libxml-2.0) agent/domxml.c \
    agent/tests/fuzz_domxml.c $(pkg-config --libs libxml-2.0) -lpthread \
    -o build-fuzz/fuzz_domxml
cp agent/tests/fuzz-seeds/journal/* build-fuzz/corpus-journal/
cp agent/tests/fuzz-seeds/domxml/* build-fuzz/corpus-domxml/
cp agent/tests/fuzz-seeds/qmp/* build-fuzz/corpus-qmp/
# Seed corpus: well-formed frames of every command of the command table
# agent/commands.def (built, not committed; a command without a seed fails).
python3 - <<'PY'
import json, re, struct, pathlib
d = pathlib.Path("build-fuzz/corpus")
table = re.findall(r'^CMD\(\w+, "([^"]+)"', pathlib.Path("agent/commands.def").read_text(), re.M)
reqs = [
    {"id": 1, "cmd": "hello"},
    {"id": "a", "cmd": "inventory", "args": {}},
    {"id": 2, "cmd": "prepare", "args": {"txn": "t1", "vms": ["vm1", "vm2"], "lease_ms": 500}},
    {"id": 3, "cmd": "commit", "args": {"txn": "t1", "snapshots": {"vm1/disk0": "cp.g.t1"}, "budget_ms": 100}},
    {"id": 4, "cmd": "abort", "args": {"txn": "t1", "snapshots": {"vm1/disk0": "cp.g.t1"}}},
    {"id": 5, "cmd": "snapshot.delete", "args": {"disk": "vm1/disk0", "name": "x"}},
    {"id": 6, "cmd": "vm.start", "args": {"spec": {"xml": "<domain/>"}}},
    {"id": 7, "cmd": "resume", "args": {"vms": ["vm1"]}},
    {"id": 8, "cmd": "snapshot.list", "args": {"disk": "vm1/disk0"}},
    {"id": 9, "cmd": "vm.stop", "args": {"vm": "vm1"}},
    {"id": 10, "cmd": "stats"},
    {"id": 11, "cmd": "vm.start", "args": {"spec": {"vm": "vm1"}}},
]
missing = set(table) - {r["cmd"] for r in reqs}
assert table and not missing, f"fuzz seeds: no seed for {sorted(missing)}"
for i, r in enumerate(reqs):
    b = json.dumps(r).encode()
    (d / f"seed{i}").write_bytes(struct.pack(">I", len(b)) + b)
PY
cd build-fuzz
echo "== fuzz_proto ${share}s"
./fuzz_proto -max_total_time="$share" -max_len=4096 -print_final_stats=1 \
    corpus 2>&1 | tail -n 15
echo "== fuzz_journal ${share}s"
./fuzz_journal -max_total_time="$share" -max_len=4096 -print_final_stats=1 \
    corpus-journal 2>&1 | tail -n 15
echo "== fuzz_qmp ${share}s"
./fuzz_qmp -max_total_time="$share" -max_len=4096 -print_final_stats=1 \
    corpus-qmp 2>&1 | tail -n 15
echo "== fuzz_domxml ${share}s"
./fuzz_domxml -max_total_time="$share" -max_len=4096 -print_final_stats=1 \
    corpus-domxml 2>&1 | tail -n 15
