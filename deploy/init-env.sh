#!/bin/sh
# First start of the Docker Compose stack: writes the stack's credentials, each random, to
# deploy/.env (or the file given), 0600. Compose reads that file for docker-compose.yml's
# ${VARIABLES}; the file has no defaults, so `docker compose up` refuses to start without it.
# An existing file is kept as it is: Postgres and MinIO take their passwords only when their
# volumes are first made, so new ones would lock the stack out of its own data.
set -eu

out=${1:-"$(dirname "$0")/.env"}
if [ -e "$out" ]; then
    echo "$out exists; kept (delete it and the stack's volumes to start afresh)"
    exit 0
fi

# 32 random bytes as hex: safe in a URL (the DSNs) and in a shell word.
hex() { od -An -N32 -tx1 /dev/urandom | tr -d ' \n'; }
# A Fernet key (TRACE_SECRETS_KEY, which encrypts secrets at rest): 32 random bytes, URL-safe
# base64.
fernet() { head -c 32 /dev/urandom | base64 | tr '+/' '-_' | tr -d '\n'; }

umask 077
tmp="$out.tmp.$$"
trap 'rm -f "$tmp"' EXIT
cat > "$tmp" <<ENV
# Made by deploy/init-env.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ). Keep it secret; back it up with
# the stack's volumes (TRACE_SECRETS_KEY decrypts the secrets stored in Postgres).
TRACE_POSTGRES_PASSWORD=$(hex)
TRACE_PG_SINK_PASSWORD=$(hex)
TRACE_PG_QUERY_PASSWORD=$(hex)
TRACE_MINIO_ROOT_PASSWORD=$(hex)
TRACE_S3_SECRET_ACCESS_KEY=$(hex)
TRACE_INTERNAL_TOKEN=$(hex)
TRACE_SECRETS_KEY=$(fernet)
ENV
mv "$tmp" "$out"
trap - EXIT
echo "wrote $out"
