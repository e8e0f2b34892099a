// Package keys derives, from a cluster's one secret, a key for each of its
// purposes: the bearer that HTTP calls between processes (catch-up,
// forwarding, the operator's routes) carry, and the key that signs the
// lines published on Redis.
//
// The two are derived apart (HMAC-SHA256 of the secret over a label of
// its own) because they travel differently: the bearer is sent with every
// HTTP call, in the clear unless TLS is on, and lands in proxies' and
// operators' hands; the line key never leaves a process. A leaked bearer
// lets its holder read rows through catch-up, but not forge a position on
// Redis, which would make readers skip rows. The secret itself is sent
// nowhere.
//
// Every process of a cluster must derive the same way: a process of a
// version that sent the secret itself as its bearer and signed lines with
// it does not talk to one that derives (docs/SECURITY.md, "Upgrading").
package keys

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
)

// The labels are part of the protocol: changing one changes every key.
const (
	bearerLabel = "weft http bearer v1"
	lineLabel   = "weft line signing v1"
)

// Bearer is the HTTP bearer of secret: "wb1." and 43 base64url
// characters; "" for "" (no secret, insecure mode).
func Bearer(secret string) string {
	if secret == "" {
		return ""
	}
	return "wb1." + base64.RawURLEncoding.EncodeToString(derive(secret, bearerLabel))
}

// LineKey is the key that signs Redis lines under secret; nil for "".
func LineKey(secret string) []byte {
	if secret == "" {
		return nil
	}
	return derive(secret, lineLabel)
}

func derive(secret, label string) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(label))
	return m.Sum(nil)
}
