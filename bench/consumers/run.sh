#!/usr/bin/env bash
# The consumers' pass: weft's Consumer and groups beside River, NATS
# JetStream and a raw SKIP LOCKED loop (bench/consumers, a module of its
# own so the library's go.mod stays lean), on private servers this script
# starts and stops: PostgreSQL on :25442 (synchronous commits; initdb runs
# as 'postgres' since it refuses root), Redis on :26389, and a
# nats-server on :24222 the run starts itself (JetStream, file storage).
# The ports sit below Linux's ephemeral range (32768-60999): a port in it
# may be held by some client's connection, and the server then cannot
# bind it.
#
#   bench/consumers/run.sh            # 3 interleaved passes; writes bench/consumers/results.{jsonl,md}
#   bench/consumers/run.sh -quick     # 1 short pass (a smoke run), writes nothing
#
# Other flags go to `consumers run` (-passes, -peers, -scenarios).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SCRATCH=${SCRATCH:-$(mktemp -d /tmp/weft-consumers-XXXXXX)}
PGBIN=${PGBIN:-$(dirname "$(dpkg -L postgresql-15 2>/dev/null | grep '/bin/initdb$' | head -1)")}
PGPORT=${PGPORT:-25442}
REDISPORT=${REDISPORT:-26389}
NATSPORT=${NATSPORT:-24222}
GO=${GO:-go}

mkdir -p "$SCRATCH/pg" "$SCRATCH/redis"
chmod a+x "$SCRATCH"
chown postgres:postgres "$SCRATCH/pg"
su postgres -c "$PGBIN/initdb -D $SCRATCH/pg/data -A trust -U postgres" >"$SCRATCH/initdb.log"
cat >>"$SCRATCH/pg/data/postgresql.conf" <<EOC
port = $PGPORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '$SCRATCH/pg'
max_connections = 400
synchronous_commit = on
EOC
stop() {
  su postgres -c "$PGBIN/pg_ctl -D $SCRATCH/pg/data -m fast stop" >/dev/null || true
  if [ -f "$SCRATCH/redis/redis.pid" ]; then kill "$(cat "$SCRATCH/redis/redis.pid")" || true; fi
  rm -rf "$SCRATCH"
}
trap stop EXIT
if ! su postgres -c "$PGBIN/pg_ctl -D $SCRATCH/pg/data -l $SCRATCH/pg/log.txt -w start" >/dev/null; then
  cat "$SCRATCH/pg/log.txt" >&2
  exit 1
fi
redis-server --port "$REDISPORT" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
  --pidfile "$SCRATCH/redis/redis.pid" --logfile "$SCRATCH/redis/redis.log" --dir "$SCRATCH/redis"
for _ in $(seq 50); do redis-cli -p "$REDISPORT" ping >/dev/null 2>&1 && break; sleep 0.1; done

(cd "$ROOT/bench/consumers" && "$GO" build -o "$SCRATCH/consumers" .)
out=(-out "$ROOT/bench/consumers")
for a in "$@"; do [ "$a" = -quick ] && out=(); done
"$SCRATCH/consumers" run -pg "postgres://postgres@127.0.0.1:$PGPORT/postgres?sslmode=disable" \
  -redis "redis://127.0.0.1:$REDISPORT" -pg-pidfile "$SCRATCH/pg/data/postmaster.pid" \
  -redis-pidfile "$SCRATCH/redis/redis.pid" -scratch "$SCRATCH" -nats-port "$NATSPORT" \
  -commit "$(git -C "$ROOT" rev-parse --short HEAD)" "${out[@]}" "$@"
