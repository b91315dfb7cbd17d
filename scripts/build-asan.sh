#!/bin/bash
# Configures and builds the C code again under AddressSanitizer and
# UndefinedBehaviorSanitizer in build-asan/, for `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build-asan/build.ninja ]; then
    meson setup build-asan -Db_sanitize=address,undefined -Db_lundef=false \
        -Dstatic_workloads=false >/dev/null
fi
ninja -C build-asan >/dev/null
