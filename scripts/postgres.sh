#!/usr/bin/env bash
# A private PostgreSQL cluster on 127.0.0.1 for the tests and the replicas preset: installs PostgreSQL
# (Debian package) when missing, initialises a cluster once, starts it if it is not running, creates the
# database ($LIVELOOP_PG_DB, default liveloop_test).
#   scripts/postgres.sh start   -> prints the SQLAlchemy URL on stdout
#   scripts/postgres.sh stop
set -euo pipefail
PORT=${LIVELOOP_PG_PORT:-55432}
DIR=${LIVELOOP_PG_DIR:-/tmp/liveloop-pg-$PORT}
DB=${LIVELOOP_PG_DB:-liveloop_test}   # the tests' database; configs/ray.toml's is liveloop

find_bin() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  done
  return 1
}

BIN=$(find_bin || true)
if [ -z "$BIN" ]; then
  echo "[postgres] installing PostgreSQL (apt)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2 && apt-get install -y -qq postgresql >&2
  BIN=$(find_bin)
fi

as_pg() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

case "${1:-start}" in
  start)
    if [ ! -f "$DIR/PG_VERSION" ]; then
      mkdir -p "$DIR"
      [ "$(id -u)" = 0 ] && chown postgres:postgres "$DIR"
      as_pg "$BIN/initdb" -D "$DIR" -U postgres -A trust >/dev/null
    fi
    if ! as_pg "$BIN/pg_ctl" -D "$DIR" status >/dev/null 2>&1; then
      as_pg "$BIN/pg_ctl" -D "$DIR" -l "$DIR/server.log" -w -t 60 \
        -o "-p $PORT -k $DIR -h 127.0.0.1 -c fsync=on -c max_connections=200" start >/dev/null
    fi
    if ! as_pg "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='$DB'" | grep -q 1; then
      as_pg "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres "$DB"
    fi
    echo "postgresql+psycopg://postgres@127.0.0.1:$PORT/$DB"
    ;;
  stop)
    as_pg "$BIN/pg_ctl" -D "$DIR" -m fast stop >/dev/null 2>&1 || true
    ;;
  *)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
