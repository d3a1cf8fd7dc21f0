#!/usr/bin/env bash
# A private PostgreSQL cluster on 127.0.0.1 for the tests and the replicas preset: installs PostgreSQL
# (Debian package) when missing, initialises a cluster once, starts it if it is not running, creates the
# database ($LIVELOOP_PG_DB, default liveloop_test).
#   scripts/postgres.sh start     -> prints the SQLAlchemy URL on stdout (no password in it)
#   scripts/postgres.sh passfile  -> prints the path of the libpq password file (for PGPASSFILE)
#   scripts/postgres.sh stop
# Authentication: scram-sha-256 over TCP (127.0.0.1 and ::1 only), peer on the Unix socket (which lives
# in the 0700 cluster directory: only the cluster's OS user reaches it). The superuser `postgres` has a
# random password generated once into $LIVELOOP_PG_SECRETS (default: <cluster dir>-auth, 0700, ours):
# `password` and `pgpass` (libpq's password file format), both 0600. The password is never printed:
# clients read it through PGPASSFILE. A cluster an older version of this script initialised with
# `trust` is converted on its next `start`: password set, pg_hba.conf rewritten, configuration reloaded.
set -euo pipefail
umask 077   # what this script makes (the secrets, the server's log) is its user's alone
PORT=${LIVELOOP_PG_PORT:-55432}
DIR=${LIVELOOP_PG_DIR:-/tmp/liveloop-pg-$PORT}
SECRETS=${LIVELOOP_PG_SECRETS:-$DIR-auth}
DB=${LIVELOOP_PG_DB:-liveloop_test}   # the tests' database; configs/serve/ray.toml's is liveloop
PGPASS=$SECRETS/pgpass

find_bin() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  done
  return 1
}

as_pg() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

die() { echo "[postgres] $*" >&2; exit 1; }

# $1 a directory that must be ours alone: made 0700, refused when it is a link or another user's
own_dir() {
  local dir=$1 owner=$2
  [ -L "$dir" ] && die "$dir is a symbolic link: refusing it (remove it, or set LIVELOOP_PG_DIR / LIVELOOP_PG_SECRETS)"
  [ -e "$dir" ] || mkdir -m 700 "$dir"
  [ -d "$dir" ] || die "$dir is not a directory"
  [ "$(stat -c %U "$dir")" = "$owner" ] || [ "$(stat -c %u "$dir")" = "$(id -u "$owner")" ] \
    || die "$dir belongs to $(stat -c %U "$dir"), not $owner: refusing it (remove it, or set LIVELOOP_PG_DIR / LIVELOOP_PG_SECRETS)"
  chmod 700 "$dir"
}

# the generated password and libpq's password file for it, made once
secrets() {
  own_dir "$SECRETS" "$(id -un)"
  if [ ! -s "$SECRETS/password" ]; then
    # letters and digits only: nothing to escape in SQL or in the pgpass format
    head -c 48 /dev/urandom | base64 -w0 | tr -dc 'A-Za-z0-9' > "$SECRETS/password"
  fi
  PASSWORD=$(cat "$SECRETS/password")
  printf '127.0.0.1:%s:*:postgres:%s\nlocalhost:%s:*:postgres:%s\n' "$PORT" "$PASSWORD" "$PORT" "$PASSWORD" > "$PGPASS"
  chmod 600 "$SECRETS/password" "$PGPASS"
}

# the cluster's authentication, as it must be (rewritten whatever was there: an old `trust` one too)
hba() {
  local os_user
  os_user=$(as_pg id -un)
  printf '%s\n' \
    "# written by liveloop's scripts/postgres.sh: peer on the socket, scram-sha-256 on loopback, nothing else" \
    "local all all peer map=owner" \
    "host all all 127.0.0.1/32 scram-sha-256" \
    "host all all ::1/128 scram-sha-256" | as_pg tee "$DIR/pg_hba.conf.new" >/dev/null
  printf 'owner %s postgres\n' "$os_user" | as_pg tee "$DIR/pg_ident.conf.new" >/dev/null
  as_pg mv "$DIR/pg_ident.conf.new" "$DIR/pg_ident.conf"
  as_pg mv "$DIR/pg_hba.conf.new" "$DIR/pg_hba.conf"
}

hba_current() {
  as_pg grep -q "^# written by liveloop's scripts/postgres.sh" "$DIR/pg_hba.conf" \
    && ! as_pg grep -Eq '^[^#]*[[:space:]](trust|password|md5)[[:space:]]*$' "$DIR/pg_hba.conf"
}

# the superuser's password, over the socket (the statement on stdin: never on a command line or in a log)
set_password() {
  printf "SET log_statement = 'none'; SET log_min_error_statement = 'panic'; SET log_min_duration_statement = -1; SET password_encryption = 'scram-sha-256';\nALTER ROLE postgres PASSWORD '%s';\n" "$PASSWORD" \
    | as_pg "$BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$DIR" -p "$PORT" -U postgres -d postgres >/dev/null
}

running() { as_pg "$BIN/pg_ctl" -D "$DIR" status >/dev/null 2>&1; }

sql() { PGPASSFILE=$PGPASS "$BIN/psql" -X -w -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -tAc "$1"; }

case "${1:-start}" in
  start)
    BIN=$(find_bin || true)
    if [ -z "$BIN" ]; then
      echo "[postgres] installing PostgreSQL (apt)" >&2
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq >&2 && apt-get install -y -qq postgresql >&2
      BIN=$(find_bin)
    fi
    secrets
    PG_USER=postgres; [ "$(id -u)" = 0 ] || PG_USER=$(id -un)
    if [ ! -f "$DIR/PG_VERSION" ]; then
      own_dir "$DIR" "$(id -un)"
      [ "$(id -u)" = 0 ] && chown postgres:postgres "$DIR"
      # no connection is accepted until pg_hba.conf below is written (the server starts after it)
      as_pg "$BIN/initdb" -D "$DIR" -U postgres --auth-local=peer --auth-host=reject >/dev/null
    fi
    own_dir "$DIR" "$PG_USER"
    if running; then
      if ! hba_current; then  # an old trust cluster, running: its password first, then close the door
        echo "[postgres] $DIR accepted connections without a password: setting one and rewriting pg_hba.conf" >&2
        set_password
        hba
        as_pg "$BIN/pg_ctl" -D "$DIR" reload >/dev/null
      fi
    else
      if ! hba_current; then
        [ -f "$DIR/server.log" ] && echo "[postgres] $DIR accepted connections without a password: rewriting pg_hba.conf" >&2
        hba
      fi
      as_pg "$BIN/pg_ctl" -D "$DIR" -l "$DIR/server.log" -w -t 60 \
        -o "-p $PORT -k $DIR -h 127.0.0.1 -c fsync=on -c max_connections=200" start >/dev/null
    fi
    set_password  # idempotent; sets it on a fresh cluster, and after a lost or replaced secrets directory
    # the door as it must be: a connection without the password is refused, one with it accepted
    for try in 1 2 3 4 5 6 7 8 9 10; do  # (a reload takes effect a moment after pg_ctl returns)
      env -u PGPASSWORD PGPASSFILE="$SECRETS/none" "$BIN/psql" -X -w -h 127.0.0.1 -p "$PORT" -U postgres -d postgres \
        -tAc "SELECT 1" >/dev/null 2>&1 || break
      [ "$try" = 10 ] && die "127.0.0.1:$PORT still accepts connections without a password (is pg_hba.conf in $DIR ours?)"
      sleep 0.5
    done
    sql "SELECT 1" >/dev/null || die "127.0.0.1:$PORT refuses the password in $PGPASS"
    if ! sql "SELECT 1 FROM pg_database WHERE datname='$DB'" | grep -q 1; then
      sql "CREATE DATABASE \"$DB\"" >/dev/null
    fi
    echo "postgresql+psycopg://postgres@127.0.0.1:$PORT/$DB"
    ;;
  passfile)
    echo "$PGPASS"
    ;;
  stop)
    BIN=$(find_bin) || exit 0
    as_pg "$BIN/pg_ctl" -D "$DIR" -m fast stop >/dev/null 2>&1 || true
    ;;
  *)
    echo "usage: $0 start|passfile|stop" >&2
    exit 2
    ;;
esac
