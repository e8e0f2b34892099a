package catchup

import (
	"strings"
	"testing"
)

// A secret that cannot travel as a bearer header (a CR from a CRLF file, a
// newline, spaces around it) is refused by the server's and the client's
// config, naming the field and never quoting the secret.
func TestSecretMustFitAHeader(t *testing.T) {
	for _, secret := range []string{"0123456789abcdef\r", "0123456789abcdef\n", " 0123456789abcdef", "0123456789abcdef "} {
		_, err := NewServer(ServerConfig{Secret: secret})
		if err == nil || !strings.Contains(err.Error(), "server config: Secret") || strings.Contains(err.Error(), "0123") {
			t.Errorf("server, secret %q: %v, want an error naming Secret", secret, err)
		}
		_, err = NewClient(ClientConfig{Secret: secret})
		if err == nil || !strings.Contains(err.Error(), "client config: Secret") || strings.Contains(err.Error(), "0123") {
			t.Errorf("client, secret %q: %v, want an error naming Secret", secret, err)
		}
	}
}
