# A throwaway PostgreSQL server for the tests and the chaos run, sourced by scripts/test and
# scripts/chaos. `start_test_pg` installs PostgreSQL when missing (Debian's package), initdbs a
# cluster as an unprivileged user, serves it on 127.0.0.1 on a free port and exports
# PROBEOK_TEST_PG_URL; `stop_test_pg` stops and removes it (call it from the EXIT trap).
# Nothing happens when PROBEOK_TEST_PG_URL already names a server.

pg_dir=
pg_bin=

as_pg() {
  if [[ $(id -u) -eq 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start_test_pg() {
  [[ -n "${PROBEOK_TEST_PG_URL:-}" ]] && return 0
  pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [[ -z "$pg_bin" ]]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql
    pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  fi
  if [[ $(id -u) -eq 0 ]] && ! id postgres >/dev/null 2>&1; then
    useradd --system --no-create-home --shell /usr/sbin/nologin postgres
  fi
  pg_dir=$(mktemp -d)
  [[ $(id -u) -eq 0 ]] && chown postgres "$pg_dir"
  as_pg "$pg_bin/initdb" -D "$pg_dir/data" -U probeok --auth=trust -E UTF8 --locale=C >/dev/null
  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  as_pg "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/server.log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$pg_dir -c max_connections=300 -c log_lock_waits=on" \
    start >/dev/null
  "$pg_bin/psql" -q -h 127.0.0.1 -p "$port" -U probeok -d postgres -c 'CREATE DATABASE probeok'
  export PROBEOK_TEST_PG_URL="postgres://probeok@127.0.0.1:$port/probeok"
}

stop_test_pg() {
  if [[ -n "$pg_dir" ]]; then
    as_pg "$pg_bin/pg_ctl" -D "$pg_dir/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$pg_dir"
  fi
}
