#!/bin/bash
# Issue one certificate from the deployment CA.
#   cutpoint-ca-issue.sh CADIR NAME DAYS [IP ...] -> CADIR/NAME.pem, NAME.key
# EC P-256, CN=NAME, SAN DNS:NAME plus the IPs, serverAuth+clientAuth (the
# agent protocol uses one certificate per party for both directions).
# Idempotent: an existing certificate is kept (rotation retires the whole CA).
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 CADIR NAME DAYS [IP ...]" >&2; exit 2; }
dir=$1 name=$2 days=$3; shift 3
[[ "$name" =~ ^[A-Za-z0-9._-]+$ ]] || { echo "bad name: $name" >&2; exit 2; }
[ -f "$dir/ca.pem" ] && [ -f "$dir/ca.key" ] || { echo "no CA in $dir" >&2; exit 2; }
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
    -CAcreateserial -out "$tmp/pem" -days "$days" -extfile "$tmp/ext" 2>/dev/null
install -m 600 "$tmp/key" "$dir/$name.key"
install -m 644 "$tmp/pem" "$dir/$name.pem"
echo "issued $name"
