#!/bin/bash
# Idempotent setup for a fresh Debian 12 machine, run as root by `make`:
# Debian packages, the Python .venv, and the C build.  A second run only
# checks and skips what is already in place.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
log() { printf 'setup: %s\n' "$*"; }

if [ "$(id -u)" != 0 ]; then
    echo "setup: must run as root (the lab needs namespaces, taps and Ceph)" >&2
    exit 1
fi

# 1. Debian packages: install only what is missing.
mapfile -t wanted < <(grep -v '^\s*#' scripts/debian-packages.txt | grep -v '^\s*$')
missing=()
for p in "${wanted[@]}"; do
    st=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    [ "$st" = "install ok installed" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${#missing[@]} Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
    log "Debian packages: all ${#wanted[@]} present"
fi
# 2. Python virtualenv, rebuilt only when setup.cfg (or VERSION) changes.
PY=/usr/bin/python3
stamp=.venv/.setup-cfg.sha256
want=$(sha256sum setup.cfg pyproject.toml VERSION | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ]; then
    log "creating .venv"
    $PY -m venv .venv
fi
if [ "$(cat $stamp 2>/dev/null)" != "$want" ]; then
    log "installing Python packages into .venv"
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -e '.[dev]'
    echo "$want" > $stamp
else
    log ".venv: up to date"
fi
# The control plane reaches Ceph through Debian's librados/librbd bindings
# (python3-rados, python3-rbd): they must match the installed librados, so
# they are not on PyPI.  Link exactly those two extension modules into
# .venv instead of opening it to every system package.
purelib=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
suffix=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
for mod in rados rbd; do
    src=/usr/lib/python3/dist-packages/$mod$suffix
    dst=$purelib/$mod$suffix
    if [ ! -f "$src" ]; then
        echo "setup: $src is missing (Debian package python3-$mod)" >&2; exit 1
    fi
    if [ "$(readlink "$dst" 2>/dev/null)" != "$src" ]; then
        ln -sfn "$src" "$dst"
        log ".venv: linked $mod from python3-$mod"
    fi
done
.venv/bin/python -c 'import rados, rbd' || {
    echo "setup: .venv cannot import rados and rbd" >&2; exit 1; }

# 3. C build (Meson + Ninja, warnings as errors).  Ninja itself skips
#    up-to-date targets.
if [ ! -f build/build.ninja ]; then
    log "configuring C build in build/"
    rm -rf build
    meson setup build --buildtype=debugoptimized >/dev/null || {
        rm -rf build; echo "setup: meson setup failed" >&2; exit 1; }
fi
ninja -C build >/dev/null
log "C build: up to date ($(ls build/agent/cutpointd 2>/dev/null || echo 'no agent yet'))"

# 4. The web console's one third-party asset, htmx, from npm's registry:
#    pinned by version and by the SHA-256 of the registry's tarball, cached
#    outside the repository, and unpacked into a git-ignored path that the
#    console serves (api/console/static/).  Never committed.
HTMX_VERSION=2.0.8
HTMX_SHA256=51351b2ac4b3bc065692a4dd1349a82f90bf7c526134937ccb25d3932c8ce954
htmx_cache=${CUTPOINT_ASSET_CACHE:-/var/cache/cutpoint/npm}/htmx.org-$HTMX_VERSION.tgz
htmx_dst=api/console/static/htmx.min.js
htmx_stamp=api/console/static/.htmx.sha256
if [ "$(cat $htmx_stamp 2>/dev/null)" != "$HTMX_SHA256" ] || [ ! -f $htmx_dst ]; then
    if ! echo "$HTMX_SHA256  $htmx_cache" | sha256sum -c --status 2>/dev/null; then
        log "fetching htmx.org $HTMX_VERSION from registry.npmjs.org"
        mkdir -p "$(dirname "$htmx_cache")"
        curl -fsSL --retry 3 -o "$htmx_cache.part" \
            "https://registry.npmjs.org/htmx.org/-/htmx.org-$HTMX_VERSION.tgz"
        if ! echo "$HTMX_SHA256  $htmx_cache.part" | sha256sum -c --status; then
            rm -f "$htmx_cache.part"
            echo "setup: htmx.org-$HTMX_VERSION.tgz does not match its pinned SHA-256" >&2
            exit 1
        fi
        mv "$htmx_cache.part" "$htmx_cache"
    fi
    mkdir -p "$(dirname $htmx_dst)"
    tar -xzf "$htmx_cache" -O package/dist/htmx.min.js > $htmx_dst.part
    mv $htmx_dst.part $htmx_dst
    echo "$HTMX_SHA256" > $htmx_stamp
    log "web console: htmx $HTMX_VERSION in $htmx_dst"
else
    log "web console: htmx $HTMX_VERSION present"
fi
