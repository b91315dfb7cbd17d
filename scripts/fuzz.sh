#!/bin/bash
# `make fuzz`: builds each libFuzzer target (clang -fsanitize=fuzzer,
# address,undefined) into build-fuzz/ and runs each for its share of
# SECONDS (default 60):
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     all targets, or the named ones
#   FUZZ_RUNS=N scripts/fuzz.sh 0 TARGET...   N executions each, no time
#                                             limit (docs/reliability.md)
#
# target         what it parses                  committed seeds
#   proto          agent frames and requests,      agent/tests/fuzz-seeds/proto
#                  every command's arguments       (cmd-<command>: all fields)
#   journal        the agent journal file          agent/tests/fuzz-seeds/journal
#   qmp            QMP client on a monitor stream  agent/tests/fuzz-seeds/qmp
#   config         the agent INI file              agent/tests/fuzz-seeds/config
#   domxml         libvirt domain XML (disks, and  agent/tests/fuzz-seeds/domxml
#                  a signed definition's policy)
#   sync-args      cutpoint-sync's command line    storage/tests/fuzz-seeds/sync-args
#   sync-progress  cutpoint-sync's progress record storage/tests/fuzz-seeds/sync-progress
#
# Each target starts from its committed seeds (a crash found once is kept
# there as a regression seed), and keeps what it learns in
# build-fuzz/corpus-<target>/.  Exits non-zero on a crash; the input is
# left in build-fuzz/<target>-crash-*, the log in build-fuzz/<target>.log.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
all=(proto journal qmp config domxml sync-args sync-progress sync-serve)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
share=$(( secs / ${#targets[@]} ))
[ "$share" -ge 1 ] || share=1

cflags=(-g -O1 -std=c11 -D_GNU_SOURCE -DCUTPOINT_VERSION="\"$(cat VERSION)\""
        -Wall -Wextra -Werror -Wno-unknown-warning-option
        -fsanitize=fuzzer,address,undefined -Iagent -Istorage -Istorage/sync)
# The config parser asks the VM driver table about `driver =`, so it links
# the drivers (and what they call), as cutpointd -n does.
agent_drivers=(agent/config.c agent/log.c agent/runcmd.c agent/vm.c
               agent/vm_qmp.c agent/vm_libvirt.c agent/lvdef.c agent/lvconn.c
               agent/lvcache.c agent/lvdomain.c agent/lvcall.c agent/lvstart.c
               agent/guest_libvirt.c agent/domxml.c agent/defpolicy.c
               agent/guest_qga.c agent/qmp.c
               agent/qga.c storage/snap.c storage/snap_rbd.c storage/snap_qmp.c
               storage/rbdsnap.c)
sync_lib=(storage/sync/sync_util.c storage/sync/sync_args.c
          storage/sync/sync_digest.c storage/sync/sync_extents.c
          storage/sync/sync_progress.c storage/sync/sync_rate.c
          storage/sync/sync_fence.c storage/sync/sync_identity.c
          storage/sync/sync_conn.c storage/sync/sync_lock.c
          storage/sync/sync_site.c storage/sync/sync_diff.c
          storage/sync/sync_verify.c storage/sync/sync_copy.c
          storage/sync/sync_plan.c storage/sync/sync_engine.c
          storage/sync/sync_serve.c)

build() {
    local t=$1 out=build-fuzz/fuzz_${1//-/_}
    case $t in
    proto) clang "${cflags[@]}" agent/proto.c agent/tests/fuzz_proto.c \
               -ljansson -o "$out" ;;
    journal) clang "${cflags[@]}" agent/journal.c agent/tests/fuzz_journal.c \
               -lpthread -o "$out" ;;
    qmp) clang "${cflags[@]}" agent/qmp.c agent/log.c agent/tests/fuzz_qmp.c \
               -ljansson -o "$out" ;;
    config) clang "${cflags[@]}" "${agent_drivers[@]}" \
               $(pkg-config --cflags libxml-2.0) agent/tests/fuzz_config.c \
               $(pkg-config --libs libxml-2.0) -ljansson -lvirt -lvirt-qemu -lrbd \
               -lrados -lpthread -o "$out" ;;
    domxml) clang "${cflags[@]}" $(pkg-config --cflags libxml-2.0) \
               agent/domxml.c agent/defpolicy.c agent/tests/fuzz_domxml.c \
               $(pkg-config --libs libxml-2.0) -lpthread -o "$out" ;;
    sync-args) clang "${cflags[@]}" "${sync_lib[@]}" \
               storage/tests/fuzz_sync_args.c -lrbd -lrados -lssl -lcrypto -lz \
               -ljansson -lpthread -o "$out" ;;
    sync-serve) clang "${cflags[@]}" "${sync_lib[@]}" \
               storage/tests/fuzz_sync_serve.c -lrbd -lrados -lssl -lcrypto -lz \
               -ljansson -lpthread -o "$out" ;;
    sync-progress) clang "${cflags[@]}" storage/sync/sync_progress.c \
               storage/sync/sync_identity.c storage/sync/sync_util.c \
               storage/tests/fuzz_sync_progress.c -lrbd -lz -ljansson \
               -o "$out" ;;
    *) echo "fuzz: unknown target $t (one of: ${all[*]})" >&2; return 2 ;;
    esac
}

seeds() {
    case $1 in
    sync-*) echo "storage/tests/fuzz-seeds/$1" ;;
    *) echo "agent/tests/fuzz-seeds/$1" ;;
    esac
}

mkdir -p build-fuzz
for t in "${targets[@]}"; do
    build "$t"
    mkdir -p "build-fuzz/corpus-$t"
done
if [[ " ${targets[*]} " == *" proto "* ]]; then
    # Every command and argument field of agent/commands.def has a seed;
    # the dictionary gives the fuzzer the table's names.
    python3 agent/tests/fuzz_seeds_check.py build-fuzz/proto.dict
fi

for t in "${targets[@]}"; do
    bin=./fuzz_${t//-/_}
    opts=(-max_len=4096 -print_final_stats=1 -artifact_prefix="$t-")
    if [ -n "${FUZZ_RUNS:-}" ]; then
        opts+=(-runs="$FUZZ_RUNS")
        echo "== fuzz_${t//-/_} ${FUZZ_RUNS} runs"
    else
        opts+=(-max_total_time="$share")
        echo "== fuzz_${t//-/_} ${share}s"
    fi
    [ "$t" != proto ] || opts+=(-dict=proto.dict)
    t0=$(date +%s)
    rc=0
    (cd build-fuzz && "$bin" "${opts[@]}" "corpus-$t" "../$(seeds "$t")") \
        > "build-fuzz/$t.log" 2>&1 || rc=$?
    if [ $rc -ne 0 ]; then
        tail -n 60 "build-fuzz/$t.log"
        echo "== fuzz_${t//-/_} FAILED (rc=$rc): build-fuzz/$t.log," \
             "input in build-fuzz/$t-crash-*" >&2
        exit $rc
    fi
    grep -E '^(Done|stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb))' \
        "build-fuzz/$t.log"
    echo "== fuzz_${t//-/_} ok in $(( $(date +%s) - t0 )) s wall"
done
