package server

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/weft-dev/weft/internal/httpx"
	"github.com/weft-dev/weft/internal/instance"
	"github.com/weft-dev/weft/internal/redact"
	"github.com/weft-dev/weft/internal/shard"
)

// Config is what every weft process is configured with: each field is a
// flag with an environment variable (parsed by kong in cmd/*). The zero
// value is not valid; defaults come from the flag definitions, which point
// at Redis and PostgreSQL on 127.0.0.1.
type Config struct {
	Cluster           string        `help:"Cluster name; the Redis channels are weft:<cluster> and weft:<cluster>/<stream>." env:"WEFT_CLUSTER" default:"weft"`
	RedisURL          string        `name:"redis-url" help:"Redis URL (redis:// or rediss://, with user:password for AUTH); with --redis-cluster, seed nodes: redis://host1:port?addr=host2:port&addr=..." env:"WEFT_REDIS_URL" default:"redis://127.0.0.1:6379/0"`
	RedisCluster      bool          `name:"redis-cluster" help:"--redis-url is a Redis Cluster (7+): each stream's channel lives on the master of its slot (sharded pub/sub)." env:"WEFT_REDIS_CLUSTER"`
	DatabaseURL       string        `name:"database-url" help:"PostgreSQL URL." env:"WEFT_DATABASE_URL" default:"postgres://postgres@127.0.0.1:5432/weft?sslmode=disable"`
	DatabaseReadURL   string        `name:"database-read-url" help:"PostgreSQL streaming replica for readers' range reads (sync, catch-up); empty: the primary serves them." env:"WEFT_DATABASE_READ_URL"`
	HTTPAddr          string        `name:"http-addr" help:"Address the HTTP server listens on (client API, /_weft/, /metrics, health)." env:"WEFT_HTTP_ADDR" default:"127.0.0.1:8080"`
	AdminAddr         string        `name:"admin-addr" help:"Serve the operator's routes (recompute, the master's /_weft/v1/writers, /status, /metrics) on this address of their own, and no longer on --http-addr; empty: on --http-addr." env:"WEFT_ADMIN_ADDR"`
	AdminWeft         bool          `name:"admin-weft" help:"With --admin-addr: serve /_weft/ (between instances) there too, and not on --http-addr; --advertise-url then defaults to http://<admin-addr>." env:"WEFT_ADMIN_WEFT"`
	StatusAuth        bool          `name:"status-auth" help:"/status and /metrics require the bearer secret, like every /_weft/ route (default: they answer anyone who reaches their listener)." env:"WEFT_STATUS_AUTH"`
	AdvertiseURL      string        `name:"advertise-url" help:"How other instances reach this one; default http://<http-addr> (http://<admin-addr> with --admin-weft; https:// with --tls-cert)." env:"WEFT_ADVERTISE_URL"`
	TLSCert           string        `name:"tls-cert" help:"PEM certificate (chain) file: every HTTP listener serves HTTPS only, with --tls-key; also presented to other instances that ask for a client certificate." env:"WEFT_TLS_CERT"`
	TLSKey            string        `name:"tls-key" help:"PEM private key file of --tls-cert." env:"WEFT_TLS_KEY"`
	TLSClientCA       string        `name:"tls-client-ca" help:"PEM CA file: every HTTP listener requires a client certificate it signed (mutual TLS)." env:"WEFT_TLS_CLIENT_CA"`
	TLSCA             string        `name:"tls-ca" help:"PEM CA file the calls to other instances (catch-up, forwarding) and to a rediss:// --redis-url trust; default: the system's roots." env:"WEFT_TLS_CA"`
	Name              string        `help:"Stable role name of this instance (a writer name for writers)." env:"WEFT_NAME" default:"${default_name}"`
	Secret            string        `help:"Shared secret for /_weft/ endpoints between instances." env:"WEFT_SECRET"`
	SecretFile        string        `name:"secret-file" help:"Read --secret from this file (one line; a trailing newline is dropped), as Docker and Kubernetes secrets are mounted: it stays out of ps and the environment." env:"WEFT_SECRET_FILE" type:"path"`
	SecretPrevious    string        `name:"secret-previous" help:"Also accept this secret (Redis lines signed with it, bearers that carry it), never send it: rotating --secret without a stop (docs/SECURITY.md)." env:"WEFT_SECRET_PREVIOUS"`
	SecretPrevFile    string        `name:"secret-previous-file" help:"Read --secret-previous from this file (one line)." env:"WEFT_SECRET_PREVIOUS_FILE"`
	Insecure          bool          `help:"Allow running without --secret (development only)." env:"WEFT_INSECURE"`
	EventWriters      []string      `name:"event-writers" help:"Writer names that persist room events, in any order: the shard map's first version (after that, master writers add/remove change it in the database)." env:"WEFT_EVENT_WRITERS" default:"persister1,persister2" sep:","`
	EventWriter       bool          `name:"event-writer" help:"Hold an events writer under --name although the shard map does not list it (yet), so that master writers add can give it rooms at runtime." env:"WEFT_EVENT_WRITER"`
	TypingWriter      string        `name:"typing-writer" help:"Writer name of the typing stream." env:"WEFT_TYPING_WRITER" default:"master"`
	AnnounceInterval  time.Duration `name:"announce-interval" help:"Idle writers announce their position at least this often (>= 50ms)." env:"WEFT_ANNOUNCE_INTERVAL" default:"1s"`
	LeaseTTL          time.Duration `name:"lease-ttl" help:"Writer lease: a writer silent this long is sealed by the master." env:"WEFT_LEASE_TTL" default:"10s"`
	SealDead          time.Duration `name:"seal-dead" help:"The master looks this often for writers whose process ended (their liveness session is gone) and seals them at once (>= 50ms); negative: never, the lease only." env:"WEFT_SEAL_DEAD" default:"250ms"`
	HeartbeatInterval time.Duration `name:"heartbeat-interval" help:"Every instance announces itself this often; one not heard from for 3 heartbeats is forgotten." env:"WEFT_HEARTBEAT_INTERVAL" default:"5s"`
	LogFormat         string        `name:"log-format" help:"Log format: text or json." env:"WEFT_LOG_FORMAT" default:"text"`
	LogLevel          string        `name:"log-level" help:"Log level: debug, info, warn or error." env:"WEFT_LOG_LEVEL" default:"info"`
	MaxLongPolls      int           `name:"max-long-polls" help:"Syncs and room state reads in progress at once on this instance, waiting or not (1..1000000); beyond, one answers 503 with Retry-After." env:"WEFT_MAX_LONG_POLLS" default:"10000"`
	MaxAnswerBytes    int           `name:"max-answer-bytes" help:"Bytes of one sync answer or room state page (65536..67108864); it stops there with a token to go on." env:"WEFT_MAX_ANSWER_BYTES" default:"1048576"`
	MaxAnswers        int           `name:"max-answers" help:"Sync answers and state pages read and written at once (1..10000); more wait for a slot." env:"WEFT_MAX_ANSWERS" default:"64"`
	WriteTimeout      time.Duration `name:"write-timeout" help:"How long a client may take to read each 64 KiB of a sync answer or state page before it is disconnected (1s..10m)." env:"WEFT_WRITE_TIMEOUT" default:"15s"`

	secretFrom string // the SecretFile Secret was read from
	prevFrom   string // the SecretPrevFile SecretPrevious was read from
}

// Bounds of the answer flags: an answer holds at least 64 KiB (a whole
// event fits), and at most 64 MiB.
const (
	MinAnswerBytes  = 64 << 10
	MaxAnswerBytes  = 64 << 20
	MaxAnswersLimit = 10000
)

// MaxLongPollsLimit bounds --max-long-polls: each waiting sync holds a
// connection and a goroutine.
const MaxLongPollsLimit = 1000000

// ConfigError names the flag (and its environment variable) at fault.
type ConfigError struct {
	Flag, Env, Problem string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("config: --%s (%s): %s", e.Flag, e.Env, e.Problem)
}

func bad(flag, env, format string, args ...any) error {
	return &ConfigError{Flag: flag, Env: env, Problem: fmt.Sprintf(format, args...)}
}

// loadSecretFile sets Secret from SecretFile, once: Validate runs more
// than once on one Config.
func (c *Config) loadSecretFile() error {
	if c.SecretFile == "" || c.secretFrom == c.SecretFile {
		return nil
	}
	if c.Secret != "" {
		return bad("secret-file", "WEFT_SECRET_FILE", "given with --secret (WEFT_SECRET): set one of them")
	}
	b, err := os.ReadFile(c.SecretFile)
	if err != nil {
		return bad("secret-file", "WEFT_SECRET_FILE", "%v", err)
	}
	s := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if s == "" {
		return bad("secret-file", "WEFT_SECRET_FILE", "%s is empty", c.SecretFile)
	}
	if p := httpx.SecretProblem(s); p != "" {
		return bad("secret-file", "WEFT_SECRET_FILE", "the secret in %s: %s", c.SecretFile, p)
	}
	c.Secret, c.secretFrom = s, c.SecretFile
	return nil
}

// validatePrevious reads --secret-previous-file once and checks the
// previous secret.
func (c *Config) validatePrevious() error {
	if c.SecretPrevFile != "" && c.prevFrom != c.SecretPrevFile {
		if c.SecretPrevious != "" {
			return bad("secret-previous-file", "WEFT_SECRET_PREVIOUS_FILE", "given with --secret-previous (WEFT_SECRET_PREVIOUS): set one of them")
		}
		b, err := os.ReadFile(c.SecretPrevFile)
		if err != nil {
			return bad("secret-previous-file", "WEFT_SECRET_PREVIOUS_FILE", "%v", err)
		}
		c.SecretPrevious, c.prevFrom = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r"), c.SecretPrevFile
		if c.SecretPrevious == "" {
			return bad("secret-previous-file", "WEFT_SECRET_PREVIOUS_FILE", "%s is empty", c.SecretPrevFile)
		}
	}
	switch {
	case c.SecretPrevious == "":
		return nil
	case c.Secret == "":
		return bad("secret-previous", "WEFT_SECRET_PREVIOUS", "set without --secret: it is accepted besides --secret while a rotation lasts")
	case c.SecretPrevious == c.Secret:
		return bad("secret-previous", "WEFT_SECRET_PREVIOUS", "the same as --secret")
	}
	if p := httpx.SecretProblem(c.SecretPrevious); p != "" {
		return bad("secret-previous", "WEFT_SECRET_PREVIOUS", "%s", p)
	}
	return nil
}

// Validate checks every field and names the first bad one.
func (c *Config) Validate() error {
	if c.Cluster == "" || strings.ContainsAny(c.Cluster, " \t\r\n") || len(c.Cluster) > 64 {
		return bad("cluster", "WEFT_CLUSTER", "%q: want 1-64 characters without spaces", c.Cluster)
	}
	if err := checkRedisURL(c.RedisURL, c.RedisCluster); err != nil {
		return err
	}
	if _, err := ParseDatabaseURL("database-url", "WEFT_DATABASE_URL", c.DatabaseURL); err != nil {
		return err
	}
	if c.DatabaseReadURL != "" {
		if _, err := ParseDatabaseURL("database-read-url", "WEFT_DATABASE_READ_URL", c.DatabaseReadURL); err != nil {
			return err
		}
	}
	if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
		return bad("http-addr", "WEFT_HTTP_ADDR", "%q: %v", c.HTTPAddr, err)
	}
	if err := c.validateAdmin(); err != nil {
		return err
	}
	if err := c.validateTLS(); err != nil {
		return err
	}
	if c.AdvertiseURL != "" {
		u, err := url.Parse(c.AdvertiseURL)
		switch {
		case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
			return bad("advertise-url", "WEFT_ADVERTISE_URL", "%q: want http(s)://host:port", redact.URL(c.AdvertiseURL))
		case u.User != nil:
			return bad("advertise-url", "WEFT_ADVERTISE_URL", "%q: want no user or password: every instance reads it, and /status shows it",
				redact.URL(c.AdvertiseURL))
		}
	}
	if err := instance.ValidName(c.Name); err != nil {
		return bad("name", "WEFT_NAME", "%v", err)
	}
	if err := c.loadSecretFile(); err != nil {
		return err
	}
	if c.Secret == "" && !c.Insecure {
		return bad("secret", "WEFT_SECRET", "empty: set a shared secret (or --secret-file), or --insecure for development")
	}
	if p := httpx.SecretProblem(c.Secret); p != "" {
		return bad("secret", "WEFT_SECRET", "%s", p)
	}
	if err := c.validatePrevious(); err != nil {
		return err
	}
	if c.StatusAuth && c.Secret == "" {
		return bad("status-auth", "WEFT_STATUS_AUTH", "needs a secret (--secret or --secret-file): with --insecure there is no bearer to require")
	}
	if len(c.EventWriters) == 0 {
		return bad("event-writers", "WEFT_EVENT_WRITERS", "empty: name at least one writer")
	}
	if _, err := shard.NewMap(c.EventWriters); err != nil {
		return bad("event-writers", "WEFT_EVENT_WRITERS", "%v", err)
	}
	if err := instance.ValidName(c.TypingWriter); err != nil {
		return bad("typing-writer", "WEFT_TYPING_WRITER", "%v", err)
	}
	if c.AnnounceInterval < 50*time.Millisecond {
		return bad("announce-interval", "WEFT_ANNOUNCE_INTERVAL", "%v is below 50ms", c.AnnounceInterval)
	}
	if c.SealDead >= 0 && c.SealDead < 50*time.Millisecond {
		return bad("seal-dead", "WEFT_SEAL_DEAD", "%v: want at least 50ms, or negative (never)", c.SealDead)
	}
	if c.LeaseTTL < time.Second {
		return bad("lease-ttl", "WEFT_LEASE_TTL", "%v is below 1s", c.LeaseTTL)
	}
	if c.HeartbeatInterval < 100*time.Millisecond || c.HeartbeatInterval > time.Minute {
		return bad("heartbeat-interval", "WEFT_HEARTBEAT_INTERVAL", "%v: want 100ms to 1m", c.HeartbeatInterval)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return bad("log-format", "WEFT_LOG_FORMAT", "%q: want text or json", c.LogFormat)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return bad("log-level", "WEFT_LOG_LEVEL", "%q: want debug, info, warn or error", c.LogLevel)
	}
	if c.MaxLongPolls < 1 || c.MaxLongPolls > MaxLongPollsLimit {
		return bad("max-long-polls", "WEFT_MAX_LONG_POLLS", "%d: want 1..%d", c.MaxLongPolls, MaxLongPollsLimit)
	}
	if c.MaxAnswerBytes < MinAnswerBytes || c.MaxAnswerBytes > MaxAnswerBytes {
		return bad("max-answer-bytes", "WEFT_MAX_ANSWER_BYTES", "%d: want %d..%d", c.MaxAnswerBytes, MinAnswerBytes, MaxAnswerBytes)
	}
	if c.MaxAnswers < 1 || c.MaxAnswers > MaxAnswersLimit {
		return bad("max-answers", "WEFT_MAX_ANSWERS", "%d: want 1..%d", c.MaxAnswers, MaxAnswersLimit)
	}
	if c.WriteTimeout < time.Second || c.WriteTimeout > 10*time.Minute {
		return bad("write-timeout", "WEFT_WRITE_TIMEOUT", "%v: want 1s to 10m", c.WriteTimeout)
	}
	return nil
}

// validateAdmin checks --admin-addr and --admin-weft.
func (c *Config) validateAdmin() error {
	if c.AdminAddr == "" {
		if c.AdminWeft {
			return bad("admin-weft", "WEFT_ADMIN_WEFT", "needs --admin-addr (WEFT_ADMIN_ADDR): the listener to serve /_weft/ on")
		}
		return nil
	}
	if _, _, err := net.SplitHostPort(c.AdminAddr); err != nil {
		return bad("admin-addr", "WEFT_ADMIN_ADDR", "%q: %v", c.AdminAddr, err)
	}
	if c.AdminAddr == c.HTTPAddr {
		return bad("admin-addr", "WEFT_ADMIN_ADDR", "%q is --http-addr too: the admin listener must be apart (leave it empty to serve everything there)", c.AdminAddr)
	}
	return nil
}

// Advertise is the URL other instances use to reach this one: where
// /_weft/ is served.
func (c *Config) Advertise() string {
	if c.AdvertiseURL != "" {
		return strings.TrimRight(c.AdvertiseURL, "/")
	}
	addr := c.HTTPAddr
	if c.AdminWeft {
		addr = c.AdminAddr
	}
	host, port, _ := net.SplitHostPort(addr)
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	scheme := "http://"
	if c.tlsEnabled() {
		scheme = "https://"
	}
	return scheme + net.JoinHostPort(host, port)
}

// WritesEvents reports whether this instance holds an events writer by
// its configuration: --event-writer, or its name in --event-writers. (It
// also does when the shard map in the database lists it.)
func (c *Config) WritesEvents() bool { return c.EventWriter || slices.Contains(c.EventWriters, c.Name) }

// WritesTyping reports whether this instance is the typing writer.
func (c *Config) WritesTyping() bool { return c.TypingWriter == c.Name }

// Logger builds the slog logger the config asks for, writing to stderr.
// Durations read as text in both formats ("1.5s", where JSON would give
// nanoseconds) and maps become groups of fields (final.events=25, where
// text would print a Go map).
func (c *Config) Logger() *slog.Logger { return c.LoggerTo(os.Stderr) }

// LoggerTo is Logger writing to w.
func (c *Config) LoggerTo(w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.LogLevel))
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: replaceAttr}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func replaceAttr(_ []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindDuration:
		a.Value = slog.StringValue(a.Value.Duration().String())
	case slog.KindAny:
		if g, ok := mapGroup(a.Value.Any()); ok {
			a.Value = g
		}
	}
	return a
}

// mapGroup is a map with string keys as a group, its keys sorted.
func mapGroup(v any) (slog.Value, bool) {
	m := reflect.ValueOf(v)
	if m.Kind() != reflect.Map || m.Type().Key().Kind() != reflect.String {
		return slog.Value{}, false
	}
	keys := m.MapKeys()
	slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(a.String(), b.String()) })
	attrs := make([]slog.Attr, 0, len(keys))
	for _, k := range keys {
		attrs = append(attrs, slog.Any(k.String(), m.MapIndex(k).Interface()))
	}
	return slog.GroupValue(attrs...), true
}
