#!/usr/bin/env bash
# Make a private CA and a TLS certificate for the SuperLink, signed by that CA.
#
#   deploy/make-certs.sh OUT_DIR NAME_OR_IP [NAME_OR_IP ...]
#
# Every NAME_OR_IP becomes a subjectAltName of the SuperLink certificate: list every
# address the SuperNodes and `flwr` use to reach the SuperLink (a DNS name, an IPv4
# or IPv6 address). Writes OUT_DIR/ca.crt (give it to every SuperNode and to `flwr`),
# OUT_DIR/ca.key (keep it offline), OUT_DIR/server.crt and OUT_DIR/server.key (the
# SuperLink's). An existing ca.crt/ca.key in OUT_DIR is reused, so a new SuperLink
# certificate can be issued without redistributing the CA.
set -euo pipefail

if [ "$#" -lt 2 ]; then
    echo "usage: $0 OUT_DIR NAME_OR_IP [NAME_OR_IP ...]  (the SuperLink's addresses)" >&2
    exit 2
fi
command -v openssl >/dev/null || { echo "$0: openssl not found; install it (apt-get install openssl)" >&2; exit 2; }
out=$1; shift
mkdir -p "$out"
cd "$out"

sans=""
for name in "$@"; do
    if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then
        sans="${sans:+$sans,}IP:$name"
    else
        sans="${sans:+$sans,}DNS:$name"
    fi
done

if [ ! -f ca.key ] || [ ! -f ca.crt ]; then
    openssl genrsa -out ca.key 3072 2>/dev/null
    openssl req -x509 -new -key ca.key -sha256 -days 3650 -subj "/CN=gems-fl CA" -out ca.crt
fi
openssl genrsa -out server.key 2048 2>/dev/null
openssl req -new -key server.key -subj "/CN=$1" -out server.csr
printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' \
    "$sans" > server.ext
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 825 -sha256 \
    -extfile server.ext -out server.crt 2>/dev/null
rm -f server.csr server.ext
chmod 600 ca.key server.key
echo "CA: $out/ca.crt  SuperLink: $out/server.crt $out/server.key  (SANs: $sans)"
