#!/usr/bin/env bash
# Make test TLS credentials in DIR with openssl: a CA, a server certificate for
# localhost/127.0.0.1/::1 and a client certificate it signed, laid out as qemu-nbd,
# nbdkit, libnbd and `alignfs nbd --tls-certificates` take them:
#   DIR/ca-cert.pem  DIR/server-cert.pem  DIR/server-key.pem
#   DIR/client/{ca-cert.pem,client-cert.pem,client-key.pem}   (a client's directory)
# and a TLS-PSK key file for identity "alice", DIR/keys.psk (psktool's format).
# For tests and trials; an operator uses their own CA. Usage: tls-credentials.sh DIR
set -euo pipefail
dir=${1:?usage: tls-credentials.sh DIR}
mkdir -p "$dir/client"
cd "$dir"
quiet() { "$@" >/dev/null 2>&1 || { echo "tls-credentials: $* failed" >&2; "$@"; exit 1; }; }
quiet openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=alignfs test CA" \
    -keyout ca-key.pem -out ca-cert.pem
sign() { # NAME SUBJECT EXTENSIONS
    quiet openssl req -newkey rsa:2048 -nodes -subj "$2" -keyout "$1-key.pem" -out "$1.csr"
    printf '%s\n' "$3" >"$1.ext"
    quiet openssl x509 -req -in "$1.csr" -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial -days 30 \
        -extfile "$1.ext" -out "$1-cert.pem"
    rm -f "$1.csr" "$1.ext"
}
sign server "/CN=localhost" "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1
extendedKeyUsage=serverAuth
keyUsage=digitalSignature,keyEncipherment"
sign client "/O=alignfs/CN=test client" "extendedKeyUsage=clientAuth
keyUsage=digitalSignature,keyEncipherment"
mv client-cert.pem client-key.pem client/
cp ca-cert.pem client/
printf 'alice:%s\n' "$(openssl rand -hex 32)" >keys.psk
chmod 600 server-key.pem client/client-key.pem keys.psk ca-key.pem
