package server

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
)

// flags is Config as cmd/* parse it: a defined type, so kong does not
// call Validate itself.
type flags Config

// parse reads args and the environment into a Config as cmd/* does,
// with testSecret.
func parse(t *testing.T, args ...string) Config {
	t.Helper()
	return parseBare(t, append([]string{"--secret=" + testSecret}, args...)...)
}

// parseBare is parse without the secret, for the tests of the secret
// itself.
func parseBare(t *testing.T, args ...string) Config {
	t.Helper()
	var c flags
	p, err := kong.New(&c, kong.Vars{"default_name": "worker"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Parse(args); err != nil {
		t.Fatal(err)
	}
	return Config(c)
}

func TestMaxLongPollsFlag(t *testing.T) {
	if c := parse(t); c.MaxLongPolls != 10000 || c.Validate() != nil {
		t.Fatalf("default --max-long-polls %d (%v), want 10000 and valid", c.MaxLongPolls, c.Validate())
	}
	if c := parse(t, "--max-long-polls=25"); c.MaxLongPolls != 25 {
		t.Fatalf("--max-long-polls=25 gave %d", c.MaxLongPolls)
	}
	t.Setenv("WEFT_MAX_LONG_POLLS", "7")
	if c := parse(t); c.MaxLongPolls != 7 {
		t.Fatalf("WEFT_MAX_LONG_POLLS=7 gave %d", c.MaxLongPolls)
	}
	for _, v := range []string{"0", "-1", "1000001"} {
		c := parse(t, "--max-long-polls="+v)
		err := c.Validate()
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Flag != "max-long-polls" || ce.Env != "WEFT_MAX_LONG_POLLS" || !strings.Contains(err.Error(), v) {
			t.Fatalf("--max-long-polls=%s: %v, want a ConfigError naming the flag, its variable and the value", v, err)
		}
	}
}

// The answer bounds default to 1 MiB, 64 answers at once and 15 s to
// write one; a value out of range names its flag and variable.
func TestAnswerFlags(t *testing.T) {
	if c := parse(t); c.MaxAnswerBytes != 1<<20 || c.MaxAnswers != 64 || c.WriteTimeout != 15*time.Second || c.Validate() != nil {
		t.Fatalf("defaults %d B, %d answers, %v (%v); want 1 MiB, 64, 15s and valid", c.MaxAnswerBytes, c.MaxAnswers, c.WriteTimeout, c.Validate())
	}
	t.Setenv("WEFT_MAX_ANSWER_BYTES", "65536")
	if c := parse(t, "--max-answers=3", "--write-timeout=2s"); c.MaxAnswerBytes != 65536 || c.MaxAnswers != 3 || c.WriteTimeout != 2*time.Second || c.Validate() != nil {
		t.Fatalf("set: %d B, %d answers, %v (%v)", c.MaxAnswerBytes, c.MaxAnswers, c.WriteTimeout, c.Validate())
	}
	for _, bad := range []struct{ arg, flag, env string }{
		{"--max-answer-bytes=65535", "max-answer-bytes", "WEFT_MAX_ANSWER_BYTES"},
		{"--max-answer-bytes=67108865", "max-answer-bytes", "WEFT_MAX_ANSWER_BYTES"},
		{"--max-answers=0", "max-answers", "WEFT_MAX_ANSWERS"},
		{"--max-answers=10001", "max-answers", "WEFT_MAX_ANSWERS"},
		{"--write-timeout=999ms", "write-timeout", "WEFT_WRITE_TIMEOUT"},
		{"--write-timeout=11m", "write-timeout", "WEFT_WRITE_TIMEOUT"},
	} {
		err := func() error { c := parse(t, bad.arg); return c.Validate() }()
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Flag != bad.flag || ce.Env != bad.env {
			t.Errorf("%s: %v, want a ConfigError naming --%s and %s", bad.arg, err, bad.flag, bad.env)
		}
	}
}

func TestDatabaseReadURLFlag(t *testing.T) {
	if c := parse(t); c.DatabaseReadURL != "" || c.Validate() != nil {
		t.Fatalf("default --database-read-url %q (%v), want empty and valid", c.DatabaseReadURL, c.Validate())
	}
	const u = "postgres://reader@10.0.0.7:5432/weft?sslmode=disable"
	t.Setenv("WEFT_DATABASE_READ_URL", u)
	if c := parse(t); c.DatabaseReadURL != u || c.Validate() != nil {
		t.Fatalf("WEFT_DATABASE_READ_URL gave %q (%v)", c.DatabaseReadURL, c.Validate())
	}
	for _, v := range []string{"mysql://x@h/db", "postgres:///weft", "not a url"} {
		c := parse(t, "--database-read-url="+v)
		err := c.Validate()
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Flag != "database-read-url" || ce.Env != "WEFT_DATABASE_READ_URL" {
			t.Fatalf("--database-read-url=%s: %v, want a ConfigError naming the flag and its variable", v, err)
		}
	}
}

// A secret that cannot travel as "Authorization: Bearer <secret>" (a CR
// left by a CRLF file, a newline, spaces around it) is refused at start,
// naming --secret and WEFT_SECRET and what is wrong, never the secret.
func TestSecretMustFitAHeader(t *testing.T) {
	for _, tc := range []struct{ secret, want string }{
		{"s3cret-s3cret-s3cret\r", "control character"},
		{"s3cret-s3cret-s3cret\n", "control character"},
		{"s3cret-s3cret-s3cret ", "space"},
		{" s3cret-s3cret-s3cret", "space"},
	} {
		for _, fromEnv := range []bool{false, true} {
			var c Config
			if fromEnv {
				t.Setenv("WEFT_SECRET", tc.secret)
				c = parseBare(t)
			} else {
				c = parse(t, "--secret="+tc.secret)
			}
			err := c.Validate()
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Flag != "secret" || ce.Env != "WEFT_SECRET" || !strings.Contains(ce.Problem, tc.want) ||
				strings.Contains(err.Error(), "s3cret") {
				t.Errorf("secret %q (from the environment: %v): %v, want a ConfigError naming --secret and %q", tc.secret, fromEnv, err, tc.want)
			}
		}
	}
}

// urlSecretA and urlSecretB are the halves of the password in urlForms;
// no message may hold either.
const urlSecretA, urlSecretB = "hunter2x", "kestrel9"

// urlForms are a URL flag's value with a password, as an operator may
// get it wrong: unparsable (a port typo, an unescaped %, # or /, an @
// that is fine) or in a query parameter.
func urlForms(scheme, port string) []string {
	pw := urlSecretA + urlSecretB
	return []string{
		scheme + "://u:" + pw + "@127.0.0.1:" + port[:2] + "x" + port[3:] + "/db",
		scheme + "://u:" + urlSecretA + "%" + urlSecretB + "@127.0.0.1:" + port + "/db",
		scheme + "://u:" + urlSecretA + "#" + urlSecretB + "@127.0.0.1:" + port + "/db",
		scheme + "://u:" + urlSecretA + "/" + urlSecretB + "@127.0.0.1:" + port + "/db",
		scheme + "://u:" + urlSecretA + "@" + urlSecretB + "@127.0.0.1:" + port + "/db",
		scheme + "://127.0.0.1:" + port + "/db?password=" + pw + "&sslmode=bogus",
		scheme + "://127.0.0.1:" + port + "/db?sslpassword=" + pw + "&sslmode=bogus",
		scheme + "://127.0.0.1:" + port + "/db?password=" + urlSecretA + "#" + urlSecretB,
	}
}

// A URL flag's error never shows its password, whatever is wrong with it.
func TestConfigErrorsHideURLPasswords(t *testing.T) {
	for _, f := range []struct{ flag, scheme, port string }{
		{"redis-url", "redis", "6379"}, {"database-url", "postgres", "5432"}, {"database-read-url", "postgres", "5432"},
	} {
		for _, v := range urlForms(f.scheme, f.port) {
			for _, extra := range [][]string{nil, {"--redis-cluster"}} {
				c := parse(t, append(extra, "--"+f.flag+"="+v)...)
				err := c.Validate()
				if err == nil {
					continue // a form that is valid for this flag: nothing printed here
				}
				if msg := err.Error(); strings.Contains(msg, urlSecretA) || strings.Contains(msg, urlSecretB) {
					t.Errorf("--%s=%s: %s", f.flag, v, msg)
				}
			}
		}
	}
	c := parse(t, "--advertise-url=http://u:"+urlSecretA+"@10.0.0.7:8080")
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--advertise-url") || strings.Contains(err.Error(), urlSecretA) {
		t.Errorf("--advertise-url with a password: %v, want it refused without showing the password", err)
	}
}

// --secret-file (WEFT_SECRET_FILE) reads the secret from a file, as
// Docker and Kubernetes mount secrets: the trailing newline goes; an
// empty or missing file, a secret unfit for a header, or --secret as
// well are refused naming --secret-file, never printing the secret.
func TestSecretFile(t *testing.T) {
	dir := t.TempDir()
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	load := func(args ...string) (Config, error) {
		c := parseBare(t, args...)
		return c, c.Validate()
	}
	good := file("good", "s3cret-s3cret-s3cret\n")
	c, err := load("--secret-file=" + good)
	if err != nil || c.Secret != "s3cret-s3cret-s3cret" {
		t.Fatalf("--secret-file: secret %q, %v", c.Secret, err)
	}
	if err := c.Validate(); err != nil || c.Secret != "s3cret-s3cret-s3cret" {
		t.Fatalf("validated twice: secret %q, %v", c.Secret, err)
	}
	t.Setenv("WEFT_SECRET_FILE", good)
	if c, err := load(); err != nil || c.Secret != "s3cret-s3cret-s3cret" {
		t.Fatalf("WEFT_SECRET_FILE: secret %q, %v", c.Secret, err)
	}
	for _, args := range [][]string{
		{"--secret=s3cret-s3cret-s3cret"},
		{"--secret-file=" + file("empty", "\n")},
		{"--secret-file=" + filepath.Join(dir, "missing")},
		{"--secret-file=" + file("spaced", "s3cret-s3cret-s3cret \n")},
	} {
		_, err := load(args...)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Flag != "secret-file" || ce.Env != "WEFT_SECRET_FILE" || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%q: %v; want a ConfigError naming --secret-file, without the secret", args, err)
		}
	}
}

// The admin flags: a bad or clashing --admin-addr, --admin-weft without
// it, and --status-auth without a secret are refused naming the flag.
func TestAdminFlags(t *testing.T) {
	if c := parse(t, "--admin-addr=127.0.0.1:9090", "--admin-weft", "--status-auth"); c.Validate() != nil || c.Advertise() != "http://127.0.0.1:9090" {
		t.Fatalf("valid admin flags: %v, advertise %s", c.Validate(), c.Advertise())
	}
	if c := parse(t, "--admin-addr=127.0.0.1:9090"); c.Advertise() != "http://127.0.0.1:8080" {
		t.Fatalf("without --admin-weft the advertised URL is %s, want --http-addr's", c.Advertise())
	}
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--admin-addr=nope"}, "admin-addr"},
		{[]string{"--admin-addr=127.0.0.1:8080"}, "admin-addr"},
		{[]string{"--admin-weft"}, "admin-weft"},
	} {
		c := parse(t, tc.args...)
		var ce *ConfigError
		if err := c.Validate(); !errors.As(err, &ce) || ce.Flag != tc.flag {
			t.Errorf("%v: %v, want a ConfigError naming --%s", tc.args, err, tc.flag)
		}
	}
	cfg := parseBare(t, "--insecure", "--status-auth")
	var ce *ConfigError
	if err := cfg.Validate(); !errors.As(err, &ce) || ce.Flag != "status-auth" {
		t.Errorf("--status-auth --insecure: %v, want a ConfigError naming --status-auth", err)
	}
}

// --secret-previous (or its file) needs --secret and differs from it; a
// bad one names its flag.
func TestSecretPreviousFlags(t *testing.T) {
	file := filepath.Join(t.TempDir(), "previous")
	if err := os.WriteFile(file, []byte("old-s3cret-old-s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if c := parse(t, "--secret-previous-file="+file); c.Validate() != nil || c.SecretPrevious != "old-s3cret-old-s3cret" {
		t.Fatalf("--secret-previous-file: %v, read %q", c.Validate(), c.SecretPrevious)
	}
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--secret-previous=s3cret-s3cret-s3cret"}, "secret-previous"}, // parse's --secret
		{[]string{"--secret-previous=bad\tone"}, "secret-previous"},
		{[]string{"--secret-previous=x", "--secret-previous-file=" + file}, "secret-previous-file"},
		{[]string{"--secret-previous-file=/nonexistent"}, "secret-previous-file"},
	} {
		c := parse(t, tc.args...)
		var ce *ConfigError
		if err := c.Validate(); !errors.As(err, &ce) || ce.Flag != tc.flag {
			t.Errorf("%v: %v, want a ConfigError naming --%s", tc.args, err, tc.flag)
		}
	}
}
