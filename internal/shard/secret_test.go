package shard

import (
	"strings"
	"testing"
)

// A secret that cannot travel as a bearer header (a CR from a CRLF file, a
// newline, spaces around it) is refused by the Server's and the
// Forwarder's config, naming the field and never quoting the secret.
func TestSecretMustFitAHeader(t *testing.T) {
	m, _ := NewMap([]string{"w1"})
	q, err := NewQueue(QueueConfig{Exec: newRecorder(m).exec("w1")})
	if err != nil {
		t.Fatal(err)
	}
	resolve := func(string) (string, bool) { return "", false }
	for _, secret := range []string{"0123456789abcdef\r", "0123456789abcdef\n", " 0123456789abcdef", "0123456789abcdef "} {
		_, err := NewServer(ServerConfig{Self: "w1", Map: m, Queue: q, Secret: secret})
		if err == nil || !strings.Contains(err.Error(), "server config: Secret") || strings.Contains(err.Error(), "0123") {
			t.Errorf("server, secret %q: %v, want an error naming Secret", secret, err)
		}
		_, err = NewForwarder(ForwarderConfig{Map: m, Resolve: resolve, Secret: secret})
		if err == nil || !strings.Contains(err.Error(), "forwarder config: Secret") || strings.Contains(err.Error(), "0123") {
			t.Errorf("forwarder, secret %q: %v, want an error naming Secret", secret, err)
		}
	}
}
