#!/usr/bin/env bash
# Starts a local PostgreSQL server for the fence package's tests and prints the line that
# points the tests at it:
#
#   eval "$(bash scripts/postgres.sh)"     # then: go test -race ./fence/...
#
# Debian 12 (bookworm) or later, run as root. Idempotent: on a machine where it already
# ran it only makes sure the server is up and the role and database exist. It installs the
# Debian "postgresql" package if no server is installed (apt-get update runs only then),
# creates and starts the cluster, creates the role "leasehold" (password "leasehold") and
# the database "leasehold" it owns, and waits until the server accepts connections.
# Progress goes to stderr; the only line on stdout is the export.
set -euo pipefail

ROLE=leasehold
PASSWORD=leasehold
DATABASE=leasehold

log() { printf 'postgres.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (for example: sudo bash scripts/postgres.sh)"

# newest installed server version, e.g. "15"
server_version() {
	local d v best=""
	for d in /usr/lib/postgresql/*/bin/postgres; do
		[ -x "$d" ] || continue
		v=${d#/usr/lib/postgresql/}
		v=${v%%/*}
		if [ -z "$best" ] || [ "$v" -gt "$best" ]; then best=$v; fi
	done
	printf '%s' "$best"
}

VERSION=$(server_version)
if [ -z "$VERSION" ] || ! command -v pg_ctlcluster >/dev/null || ! command -v psql >/dev/null; then
	log "PostgreSQL is not installed; installing the Debian package"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update >&2
	apt-get install -y --no-install-recommends postgresql >&2
	VERSION=$(server_version)
	[ -n "$VERSION" ] || die "apt-get installed postgresql but no server binary is in /usr/lib/postgresql/*/bin"
fi
log "PostgreSQL $VERSION"

# The package creates the "main" cluster on install; create it if it is missing (for
# example when create_main_cluster is off, or it was dropped).
if ! pg_lsclusters -h | awk -v v="$VERSION" '$1 == v && $2 == "main" { found = 1 } END { exit !found }'; then
	log "creating cluster $VERSION/main"
	pg_createcluster "$VERSION" main >&2
fi

# The socket directory lives on tmpfs on some systems and is gone after a reboot.
install -d -o postgres -g postgres -m 2775 /var/run/postgresql

status=$(pg_lsclusters -h | awk -v v="$VERSION" '$1 == v && $2 == "main" { print $4 }')
PORT=$(pg_lsclusters -h | awk -v v="$VERSION" '$1 == v && $2 == "main" { print $3 }')
if [ "$status" != online ]; then
	log "starting cluster $VERSION/main on port $PORT"
	pg_ctlcluster "$VERSION" main start >&2 || {
		log "start failed; the log says:"
		tail -n 20 "/var/log/postgresql/postgresql-$VERSION-main.log" >&2 || true
		exit 1
	}
fi

for i in $(seq 1 60); do
	if pg_isready -q -h 127.0.0.1 -p "$PORT"; then
		break
	fi
	[ "$i" -lt 60 ] || die "server on 127.0.0.1:$PORT did not become ready in 30 s"
	sleep 0.5
done

# psql as the postgres superuser over the local socket (peer authentication).
pg() { (cd / && runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -p "$PORT" "$@"); }

if [ -z "$(pg -tAc "SELECT 1 FROM pg_roles WHERE rolname = '$ROLE'")" ]; then
	log "creating role $ROLE"
	pg -c "CREATE ROLE $ROLE LOGIN PASSWORD '$PASSWORD'"
else
	# Make sure a role left by someone else can still log in with the known password.
	pg -c "ALTER ROLE $ROLE LOGIN PASSWORD '$PASSWORD'"
fi
if [ -z "$(pg -tAc "SELECT 1 FROM pg_database WHERE datname = '$DATABASE'")" ]; then
	log "creating database $DATABASE"
	pg -c "CREATE DATABASE $DATABASE OWNER $ROLE"
fi

# Prove the DSN works the way the tests will use it: TCP, password authentication.
PGPASSWORD=$PASSWORD psql -X -q -h 127.0.0.1 -p "$PORT" -U "$ROLE" -d "$DATABASE" -tAc 'SELECT 1' >/dev/null ||
	die "cannot log in as $ROLE over TCP on 127.0.0.1:$PORT; check pg_hba.conf"
log "ready on 127.0.0.1:$PORT"

printf 'export LEASEHOLD_TEST_POSTGRES=postgres://%s:%s@127.0.0.1:%s/%s?sslmode=disable\n' "$ROLE" "$PASSWORD" "$PORT" "$DATABASE"
