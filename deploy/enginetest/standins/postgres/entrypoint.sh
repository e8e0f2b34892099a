#!/bin/sh
# What the official PostgreSQL image's entrypoint does, for the settings
# weft's compose file and an operator's usual ones use: as root, make
# $PGDATA the postgres user's and rerun as that user; on an empty $PGDATA,
# refuse to start without POSTGRES_PASSWORD unless
# POSTGRES_HOST_AUTH_METHOD=trust, run initdb (POSTGRES_USER,
# POSTGRES_PASSWORD, POSTGRES_INITDB_ARGS), accept connections from every
# address with POSTGRES_HOST_AUTH_METHOD, create POSTGRES_DB, then start
# the server listening on every interface.
set -e
case "$1" in
-*) set -- postgres "$@" ;;
esac
if [ "$1" != postgres ]; then
	exec "$@"
fi
if [ "$(id -u)" = 0 ]; then
	mkdir -p "$PGDATA"
	chown postgres:postgres "$PGDATA"
	chmod 700 "$PGDATA"
	exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	user=${POSTGRES_USER:-postgres}
	method=${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}
	if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$method" != trust ]; then
		cat >&2 <<-'EOM'
		Error: Database is uninitialized and superuser password is not specified.
		       You must specify POSTGRES_PASSWORD to a non-empty value for the
		       superuser. For example, "-e POSTGRES_PASSWORD=password" on "docker run".

		       You may also use "POSTGRES_HOST_AUTH_METHOD=trust" to allow all
		       connections without a password. This is *not* recommended.
		EOM
		exit 1
	fi
	pwfile=
	if [ -n "${POSTGRES_PASSWORD:-}" ]; then
		pwfile=$(mktemp)
		printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
	fi
	# shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of options
	initdb --username="$user" ${pwfile:+--pwfile="$pwfile"} --auth-local=trust --auth-host="$method" $POSTGRES_INITDB_ARGS
	[ -z "$pwfile" ] || rm -f "$pwfile"
	printf '\nhost all all all %s\n' "$method" >>"$PGDATA/pg_hba.conf"
	printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
	db=${POSTGRES_DB:-$user}
	if [ "$db" != postgres ]; then
		pg_ctl -D "$PGDATA" -w -o "-c listen_addresses=''" start
		psql -v ON_ERROR_STOP=1 --username="$user" --dbname=postgres -c "CREATE DATABASE \"$db\""
		pg_ctl -D "$PGDATA" -m fast -w stop
	fi
	echo "PostgreSQL init process complete; ready for start up."
fi
exec "$@"
