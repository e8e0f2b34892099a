package server

import (
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/weft-dev/weft/internal/redact"
)

// Every URL flag is checked here, and every message about one shows it
// through redact.URL, never as given: a URL that does not parse shows no
// more than its scheme, since where its password ends cannot be known.
// The drivers' own parse errors are not passed on verbatim either: they
// quote the URL.

// unparsableHint is what usually makes a URL with a password unparsable.
const unparsableHint = "not a valid URL (in a password, write % as %25, @ as %40, # as %23, / as %2F and ? as %3F; a port is a number)"

// checkRedisURL checks --redis-url as go-redis will read it.
func checkRedisURL(s string, cluster bool) error {
	const flag, env = "redis-url", "WEFT_REDIS_URL"
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return bad(flag, env, "%q: %s", redact.URL(s), unparsableHint)
	case (u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == "":
		return bad(flag, env, "%q: want redis://host:port/db or rediss://...", redact.URL(s))
	}
	if cluster {
		if _, err := redis.ParseClusterURL(s); err != nil {
			return bad(flag, env, "%q with --redis-cluster: %v (want redis://host1:port?addr=host2:port&addr=...)", redact.URL(s), err)
		}
	} else if _, err := redis.ParseURL(s); err != nil {
		return bad(flag, env, "%q: %v", redact.URL(s), err)
	}
	return nil
}

// ParseDatabaseURL parses a PostgreSQL URL flag (flag and env name it in
// the error, a *ConfigError) into a pool configuration.
func ParseDatabaseURL(flag, env, s string) (*pgxpool.Config, error) {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return nil, bad(flag, env, "%q: %s", redact.URL(s), unparsableHint)
	case (u.Scheme != "postgres" && u.Scheme != "postgresql") || u.Host == "":
		return nil, bad(flag, env, "%q: want postgres://user@host:port/db", redact.URL(s))
	}
	pc, err := pgxpool.ParseConfig(s)
	if err != nil {
		return nil, bad(flag, env, "%q: %s", redact.URL(s), pgxReason(err))
	}
	return pc, nil
}

// pgxReason is pgx's parse error without the connection string it quotes
// ("cannot parse `<string>`: <reason>"), which pgx redacts its own way.
func pgxReason(err error) string {
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, "cannot parse `"); ok {
		if _, reason, ok := strings.Cut(rest, "`: "); ok {
			return reason
		}
	}
	return "not a connection string pgx accepts"
}
