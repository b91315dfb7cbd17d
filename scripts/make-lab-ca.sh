#!/bin/bash
# Lab certificate authority for the agent protocol's mutual TLS.
#   scripts/make-lab-ca.sh DIR                 -> DIR/ca.pem, DIR/ca.key
#   scripts/make-lab-ca.sh DIR issue NAME ROLE IP.. -> DIR/NAME.pem, DIR/NAME.key
# ROLE: coordinator, operator or agent (what the agents let the holder run).
# Keys are EC P-256.  Certificates are issued by the deployment's own issue
# script (ansible/roles/cutpoint_ca/files/cutpoint-ca-issue.sh: CN=NAME, SANs
# DNS:NAME, the IPs and URI:spiffe://cutpoint/ROLE, server and client auth),
# so the lab's certificates are made exactly as a deployment's are.
# Idempotent: an existing CA, or certificate with that role, is kept.  Never
# commit the output.
set -euo pipefail
ISSUE="$(cd "$(dirname "$0")/.." && pwd)/ansible/roles/cutpoint_ca/files/cutpoint-ca-issue.sh"
usage() { echo "usage: $0 DIR [issue NAME ROLE [IP ...]]" >&2; exit 2; }
[ $# -ge 1 ] || usage
dir=$1; shift
mkdir -p "$dir"; chmod 700 "$dir"
if [ ! -f "$dir/ca.pem" ]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
        -nodes -keyout "$dir/ca.key" -out "$dir/ca.pem" -days 3650 \
        -subj "/CN=cutpoint lab CA" \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    chmod 600 "$dir/ca.key"
fi
[ $# -eq 0 ] && exit 0
[ "$1" = issue ] && [ $# -ge 3 ] || usage
name=$2 role=$3; shift 3
# 825 days: the longest validity TLS clients accept for a leaf certificate.
"$ISSUE" "$dir" "$name" "$role" 825 "$@" >/dev/null
