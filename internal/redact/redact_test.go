package redact

import (
	"strings"
	"testing"
)

// pw marks the secret in every case; no output may hold any of its parts.
const pw = "hunter2Secret"

func TestURL(t *testing.T) {
	for in, want := range map[string]string{
		// Nothing to hide: unchanged.
		"postgres://postgres@127.0.0.1:5432/weft?sslmode=disable": "postgres://postgres@127.0.0.1:5432/weft?sslmode=disable",
		"redis://127.0.0.1:6379/0":                                "redis://127.0.0.1:6379/0",
		"http://10.0.0.7:8080":                                    "http://10.0.0.7:8080",
		// Userinfo.
		"postgres://u:" + pw + "@h:5432/db":   "postgres://u:xxxxx@h:5432/db",
		"redis://:" + pw + "@h:6379/0":        "redis://:xxxxx@h:6379/0",
		"rediss://default:" + pw + "@h:6380":  "rediss://default:xxxxx@h:6380",
		"postgres://u:" + pw + "@x@h:5432/db": "postgres://u:xxxxx@h:5432/db", // '@' in the password: the last one ends it
		// A password that net/url reads as a port and a path, a query or
		// an empty port (issue 45, case 7): all before the last '@' goes.
		"redis://u:5432/" + pw + "@h:6379/0":           "redis://xxxxx@h:6379/0",
		"redis://:/" + pw + "@h:6379":                  "redis://xxxxx@h:6379",
		"redis://u:?" + pw + "@h:6379":                 "redis://xxxxx@h:6379",
		"postgres://u:?" + pw + "@h/db?password=" + pw: "postgres://xxxxx@h/db?password=xxxxx",
		"postgres://h/db?application_name=a@b":         "postgres://xxxxx@b", // an '@' of the query: more hidden, never less
		// Query parameters.
		"postgres://h/db?password=" + pw + "&sslmode=require":       "postgres://h/db?password=xxxxx&sslmode=require",
		"postgres://h/db?sslmode=verify-full&sslpassword=" + pw:     "postgres://h/db?sslmode=verify-full&sslpassword=xxxxx",
		"postgres://h/db?PassWord=" + pw:                            "postgres://h/db?PassWord=xxxxx",
		"postgres://h/db?pass%77ord=" + pw:                          "postgres://h/db?pass%77ord=xxxxx",
		"redis://h:6379/0?password=" + pw + "&protocol=3":           "redis://h:6379/0?password=xxxxx&protocol=3",
		"postgres://h/db?password=" + pw + "#" + pw:                 "postgres://h/db?password=xxxxx#xxxxx",
		"postgres://h/db?password" + pw:                             "postgres://h/db?xxxxx",
		"postgres://h/db?a%zz" + pw + "=1":                          "postgres://h/db?xxxxx",
		"postgres://h/db?token=" + pw + "&client_secret=" + pw:      "postgres://h/db?token=xxxxx&client_secret=xxxxx",
		"postgres://h/db?application_name=a&password=" + pw + "&x=": "postgres://h/db?application_name=a&password=xxxxx&x=",
		// Not parsable, or not a URL at all: only the scheme is left.
		"postgres://u:" + pw + "@h:54x2/db":          "postgres://" + Unparsable, // a port typo
		"postgres://u:" + pw + "%zz@h:5432/db":       "postgres://" + Unparsable, // an unescaped %
		"postgres://u:hunter2#Secret@h:5432/db":      "postgres://" + Unparsable, // a '#' ends the authority early
		"postgres://u:hunter2/Secret@h:5432/db":      "postgres://" + Unparsable, // so does a '/'
		"redis://:" + pw + "@h:63 79/0":              "redis://" + Unparsable,
		"host=h user=u password=" + pw + " dbname=d": Unparsable, // keyword/value: no scheme
		"postgres:u:" + pw + "@h":                    Unparsable, // opaque
		"1x://u:" + pw + "@h":                        Unparsable,
		"":                                           Unparsable,
	} {
		got := URL(in)
		if got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
		for _, part := range []string{pw, "hunter2", "Secret"} {
			if strings.Contains(got, part) {
				t.Errorf("URL(%q) = %q still holds %q", in, got, part)
			}
		}
	}
}
