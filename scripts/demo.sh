#!/bin/bash
# `make demo`: bring the lab up, show it working, tear it down, and say
# what was done at each step.  The whole run holds the lab lock, so no test
# or other demo can touch the lab meanwhile (docs/lab.md, "The lab lock").
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
LOCK=/run/lock/cutpoint-lab.lock
step() { printf '\n==> %s\n' "$*"; }

# A caller that already holds the lock (and says so) keeps it for us.
if [ "${CUTPOINT_LAB_LOCK_HELD:-0}" != 1 ]; then
    mkdir -p "$(dirname "$LOCK")"
    exec 9>>"$LOCK"
    if ! flock -n 9; then
        echo "demo: the lab is busy ($(cat "$LOCK" 2>/dev/null || echo '?')); waiting for it"
        flock 9
    fi
    echo "pid $$ (scripts/demo.sh)" > "$LOCK"
    export CUTPOINT_LAB_LOCK_HELD=1
fi
trap 'step "tearing the lab down (exit)"; cutpoint-lab down || true' EXIT

step "lab up: 2 primary hosts x 2 libvirt guests x 2 RBD disks, workload labcheck"
t0=$(date +%s%N)
cutpoint-lab up --driver libvirt --hosts 2 --vms-per-host 2 --disks 2 --workload labcheck
t1=$(date +%s%N)
echo "demo: lab up took $(( (t1 - t0) / 1000000 )) ms"

step "lab status"
cutpoint-lab status

step "each host's libvirtd: its domains, and one domain's RBD disks and cephx secret"
python - <<'PY'
import subprocess
from cutpoint.lab.status import load_status

s = load_status()
for name, h in s["libvirt"]["hosts"].items():
    if h["site"] != "primary":
        continue
    print(f"$ virsh -c '{h['uri']}' list")
    print(subprocess.run(["virsh", "-c", h["uri"], "list"], capture_output=True, text=True,
                         check=True).stdout.rstrip())
vm = s["vms"][0]
print(f"$ virsh -c '{vm['uri']}' domblklist {vm['name']} --details")
print(subprocess.run(["virsh", "-c", vm["uri"], "domblklist", vm["name"], "--details"],
                     capture_output=True, text=True, check=True).stdout.rstrip())
xml = subprocess.run(["virsh", "-c", vm["uri"], "dumpxml", vm["name"]], capture_output=True,
                     text=True, check=True).stdout
print("  disk auth: " + " ".join(line.strip() for line in xml.splitlines()
                                 if "<auth " in line or "<secret " in line)[:200])
PY

step "waiting for every guest's labcheck (disk patterns, pings to the other guests)"
python - <<'PY'
import subprocess, sys
from cutpoint.lab.ceph import rbd_cmd
from cutpoint.lab.errors import LabError
from cutpoint.lab.labcheck import PATTERN_BYTES, expected_pattern, wait_done
from cutpoint.lab.status import load_status

s = load_status()
try:
    recs = wait_done(s, timeout=240)
except LabError as exc:
    sys.exit(f"demo: {exc}")
host_of = {vm["address"]: vm["host"] for vm in s["vms"]}
bad = 0
for vm in s["vms"]:
    for r in recs[vm["name"]]:
        if r["kind"] == "disk":
            d = vm["disks"][int(r["index"])]
            data = subprocess.run(rbd_cmd(s["sites"]["primary"], "export", "--no-progress",
                                          f"{d['pool']}/{d['image']}", "-"),
                                  capture_output=True, check=True).stdout[:PATTERN_BYTES]
            first = data.split(b"\n")[0].decode(errors="replace")
            ok = r["result"] == "ok" and data == expected_pattern(vm["name"], int(r["index"]))
            bad += not ok
            print(f"  {vm['name']} {r['dev']}: guest wrote and re-read {r['bytes']} B ({r['result']}); "
                  f"host reads {PATTERN_BYTES} B of {first!r} lines from rbd/{d['image']}: "
                  f"{'OK' if ok else 'MISMATCH'}")
        elif r["kind"] == "ping":
            where = "other host" if host_of.get(r["to"]) != vm["host"] else "same host"
            bad += r["result"] != "ok"
            print(f"  {vm['name']} ({vm['host']}) -> {r['to']} ({host_of.get(r['to'])}, {where}): "
                  f"ping {r['result']}")
print(f"demo: labcheck {'passed' if not bad else f'FAILED ({bad} problems)'}")
sys.exit(1 if bad else 0)
PY

step "lab down"
trap - EXIT
cutpoint-lab down
step "after lab down: lab processes, namespaces and links"
echo "  processes: $(pgrep -fc 'guest=(primary|dr)-h[0-9]+-vm|process=cplab-' || true) QEMU guests," \
     "$(pgrep -fc 'libvirt/(primary|dr)-h[0-9]+/libvirtd' || true) lab libvirtds," \
     "$(pgrep -fc '/ceph/(primary|dr)/ceph.conf' || true) Ceph daemons"
echo "  namespaces: $(ip netns list | grep -cE '^(primary|dr)-h' || true)"
echo "  links: $(ip -o link | grep -cE 'cpbr0|cpv[pd][0-9]' || true)"
step "control plane + DR: scheduled group snapshots replicated to site dr, then a drill at DR"
cutpoint-lab demo --seconds "${CUTPOINT_DEMO_SECONDS:-30}"
echo "demo: done"
