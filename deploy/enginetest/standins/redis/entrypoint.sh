#!/bin/sh
# What the official Redis image's entrypoint does that weft's compose
# files rely on: `redis-server ...` (or bare options, or a .conf file) runs
# as the redis user, owning its working directory; any other command runs
# as given.
#
# The official image builds Redis with protected mode off, so other
# containers reach a Redis without a password; Debian's build has it on.
# So the server starts from a file that sets it off and then includes the
# config file given, if any: that file and the command line's options
# still override it, as they override a built-in default.
set -e
case "$1" in
-* | *.conf) set -- redis-server "$@" ;;
esac
if [ "$1" = redis-server ]; then
	shift
	defaults=$(mktemp /tmp/redis-defaults.XXXXXX)
	echo 'protected-mode no' >"$defaults"
	case "$1" in
	"" | -*) ;;
	*) echo "include $1" >>"$defaults"; shift ;;
	esac
	set -- redis-server "$defaults" "$@"
	if [ "$(id -u)" = 0 ]; then
		chown redis "$defaults"
		find . \! -user redis -exec chown redis '{}' +
		exec setpriv --reuid=redis --regid=redis --init-groups "$@"
	fi
fi
exec "$@"
