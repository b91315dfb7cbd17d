#!/bin/bash
# Issue one certificate from the deployment CA.
#   cutpoint-ca-issue.sh CADIR NAME ROLE DAYS [IP ...] -> CADIR/NAME.pem, NAME.key
# EC P-256, CN=NAME, SAN DNS:NAME plus the IPs plus the role as the URI
# spiffe://cutpoint/ROLE, serverAuth+clientAuth (the agent protocol uses one
# certificate per party for both directions).  ROLE is what the agents allow
# the holder to run (agent-protocol §1.5):
#   coordinator  every command (the control plane, the coordinator CLI, failover)
#   operator     the read-only commands (hello, inventory, snapshot.list, stats)
#   agent        a host's own agent certificate: it drives no other agent
# Idempotent: an existing certificate with that role is kept (rotation retires
# the whole CA); one without it (issued before roles existed) is re-issued.
# Prints the certificate's serial, the one `cutpoint host revoke` lists.
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 CADIR NAME coordinator|operator|agent DAYS [IP ...]" >&2; exit 2; }
dir=$1 name=$2 role=$3 days=$4; shift 4
[[ "$name" =~ ^[A-Za-z0-9._-]+$ ]] || { echo "bad name: $name" >&2; exit 2; }
case "$role" in coordinator|operator|agent) ;; *) echo "bad role: $role (coordinator, operator or agent)" >&2; exit 2;; esac
[[ "$days" =~ ^[0-9]+$ ]] || { echo "bad days: $days" >&2; exit 2; }
[ -f "$dir/ca.pem" ] && [ -f "$dir/ca.key" ] || { echo "no CA in $dir" >&2; exit 2; }
uri="spiffe://cutpoint/$role"
if [ -f "$dir/$name.pem" ] &&
   openssl x509 -in "$dir/$name.pem" -noout -ext subjectAltName 2>/dev/null | grep -qF "URI:$uri"; then
    exit 0
fi
san="DNS:$name,URI:$uri"
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
# -CAserial in the CA directory: serials stay unique across issues, so a
# revoked serial names one certificate only.
openssl x509 -req -in "$tmp/csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" \
    -CAserial "$dir/ca.srl" -CAcreateserial -out "$tmp/pem" -days "$days" \
    -extfile "$tmp/ext" 2>/dev/null
install -m 600 "$tmp/key" "$dir/$name.key"
install -m 644 "$tmp/pem" "$dir/$name.pem"
echo "issued $name role=$role $(openssl x509 -in "$dir/$name.pem" -noout -serial)"
