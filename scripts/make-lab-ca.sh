#!/bin/bash
# Lab certificate authority for the agent protocol's mutual TLS.
#   scripts/make-lab-ca.sh DIR                 -> DIR/ca.pem, DIR/ca.key
#   scripts/make-lab-ca.sh DIR issue NAME IP.. -> DIR/NAME.pem, DIR/NAME.key
# Keys are EC P-256.  Certificates carry CN=NAME and SANs DNS:NAME plus the
# IPs, and are usable for both TLS server and client auth.  Idempotent: an
# existing CA or certificate is kept.  Never commit the output.
set -euo pipefail
usage() { echo "usage: $0 DIR [issue NAME [IP ...]]" >&2; exit 2; }
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
[ "$1" = issue ] && [ $# -ge 2 ] || usage
name=$2; shift 2
[[ "$name" =~ ^[A-Za-z0-9._-]+$ ]] || { echo "bad name: $name" >&2; exit 2; }
[ -f "$dir/$name.pem" ] && exit 0
san="DNS:$name"
for ip in "$@"; do san="$san,IP:$ip"; done
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$tmp/key" -out "$tmp/csr" -subj "/CN=$name" 2>/dev/null
cat > "$tmp/ext" <<EXT
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$san
EXT
openssl x509 -req -in "$tmp/csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAcreateserial -out "$tmp/pem" -days 825 -extfile "$tmp/ext" 2>/dev/null
install -m 600 "$tmp/key" "$dir/$name.key"
install -m 644 "$tmp/pem" "$dir/$name.pem"
