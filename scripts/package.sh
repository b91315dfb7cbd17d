#!/bin/bash
# `make package`: the control plane as a wheel and the host side as a
# Debian package, into out/packages/:
#
#   cutpoint-<version>-py3-none-any.whl   the control plane (API, worker,
#                                         beat, CLI); its dependencies come
#                                         from PyPI or a wheelhouse
#   cutpoint-agent_<version>_amd64.deb    /usr/bin/cutpointd,
#                                         /usr/bin/cutpoint-sync, the
#                                         cutpointd systemd unit
#
# The unit is agent/cutpointd.service with the package's binary path: one
# unit for source installs, the package and Ansible.  The package enables
# nothing: the agent needs /etc/cutpoint/agent.ini and its certificates
# first (docs/agent-protocol.md; the Ansible host role writes them).
# Depends: the Debian packages that own the libraries the binaries load.
set -euo pipefail
cd "$(dirname "$0")/.."
version=$(cat VERSION)
out=out/packages
mkdir -p "$out"

# The wheel holds the product only: its packages, its commands and its
# plug-ins, built from a copy of the tree whose setup.cfg names no test bed
# package (cutpoint.lab, .checkers, .bench), no `cutpoint-lab` command and no
# test-bed entry point.
echo "package: wheel"
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
cp -a pyproject.toml VERSION README.md api coordinator "$src/"
mkdir -p "$src/agent" && cp -a agent/client "$src/agent/"
find "$src" -name __pycache__ -prune -exec rm -rf {} + -o -name tests -prune -exec rm -rf {} +
.venv/bin/python - setup.cfg "$src/setup.cfg" <<'PY'
import configparser, sys
TESTBED = ("cutpoint.lab", "cutpoint.checkers", "cutpoint.bench")
cfg = configparser.ConfigParser(interpolation=None)
cfg.optionxform = str
cfg.read(sys.argv[1])
def keep(line):
    return line.strip() and not any(t in line for t in TESTBED)
for sec, key in (("options", "packages"), ("options", "package_dir"),
                 ("options.entry_points", "console_scripts"),
                 ("options.entry_points", "cutpoint.booters"),
                 ("options.entry_points", "cutpoint.drill_checks")):
    lines = [ln for ln in cfg[sec][key].splitlines() if keep(ln)]
    if lines:
        cfg[sec][key] = "\n" + "\n".join(lines)
    else:
        del cfg[sec][key]
for sec in [s for s in cfg.sections() if s.startswith("importlinter")]:
    cfg.remove_section(sec)
with open(sys.argv[2], "w") as f:
    cfg.write(f)
PY
.venv/bin/pip wheel -q --no-deps -w "$out" "$src" >/dev/null

echo "package: cutpoint-agent_${version}_amd64.deb"
bins=(build/agent/cutpointd build/storage/sync/cutpoint-sync)
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "package: $b is not built (make setup)" >&2; exit 1; }
done
stage=$(mktemp -d)
chmod 0755 "$stage"
trap 'rm -rf "$src" "$stage"' EXIT
install -D -m 0755 build/agent/cutpointd "$stage/usr/bin/cutpointd"
install -D -m 0755 build/storage/sync/cutpoint-sync "$stage/usr/bin/cutpoint-sync"
install -d -m 0755 "$stage/etc/cutpoint"
install -D -m 0644 docs/agent-protocol.md "$stage/usr/share/doc/cutpoint/agent-protocol.md"
sed 's|/usr/local/bin/cutpointd|/usr/bin/cutpointd|g' agent/cutpointd.service \
  | grep -v '^# Install: cp agent/cutpointd.service\|^# daemon-reload && systemctl enable' \
  > "$stage/cutpointd.service"
install -D -m 0644 "$stage/cutpointd.service" "$stage/lib/systemd/system/cutpointd.service"
rm "$stage/cutpointd.service"

deps=$(objdump -p "${bins[@]}" | awk '/NEEDED/ {print $2}' | sort -u | while read -r so; do
  pkg=$(dpkg -S "*/$so" 2>/dev/null | head -1 | cut -d: -f1)
  [ -n "$pkg" ] || { echo "package: no Debian package owns $so" >&2; exit 1; }
  echo "$pkg"
done | sort -u | paste -sd, | sed 's/,/, /g')

install -d "$stage/DEBIAN"
cat > "$stage/DEBIAN/control" <<CONTROL
Package: cutpoint-agent
Version: ${version}
Architecture: $(dpkg --print-architecture)
Maintainer: cutpoint developers <dev@cutpoint.invalid>
Section: admin
Priority: optional
Depends: ${deps}
Recommends: qemu-system-x86, libvirt-daemon-system, ceph-common
Description: cutpoint host agent: crash-consistent group snapshots of VMs on Ceph
 cutpointd pauses a group's VMs for a bounded time and cuts their RBD
 snapshots at one point; cutpoint-sync replicates RBD snapshots to a DR
 site.  Configure /etc/cutpoint/agent.ini, then enable cutpointd.service.
CONTROL
# systemd learns of a new or changed unit; a running agent is restarted on
# upgrade (its journal resumes any VM it held paused), never started on a
# first install (it has no configuration yet).
cat > "$stage/DEBIAN/postinst" <<'POSTINST'
#!/bin/sh
set -e
if [ "$1" = configure ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload || true
    if systemctl is-active --quiet cutpointd; then systemctl restart cutpointd; fi
fi
POSTINST
cat > "$stage/DEBIAN/prerm" <<'PRERM'
#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ]; then
    systemctl stop cutpointd || true
fi
PRERM
chmod 0755 "$stage/DEBIAN/postinst" "$stage/DEBIAN/prerm"
dpkg-deb --root-owner-group --build "$stage" "$out/cutpoint-agent_${version}_$(dpkg --print-architecture).deb" >/dev/null
ls -l "$out"
