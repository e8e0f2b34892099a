package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/weft-dev/weft/internal/httpx"
	"github.com/weft-dev/weft/internal/keys"
)

// secretFlags reads the cluster's secret as the instances do: the same
// flags and variables.
type secretFlags struct {
	Secret     string `name:"secret" help:"The cluster's secret; the bearer sent is derived from it (prefer --secret-file, out of ps)." env:"WEFT_SECRET"`
	SecretFile string `name:"secret-file" help:"Read --secret from this file (one line)." env:"WEFT_SECRET_FILE"`
}

// load sets Secret from SecretFile unless Secret is set.
func (f *secretFlags) load() error {
	if f.SecretFile == "" || f.Secret != "" {
		return nil
	}
	b, err := os.ReadFile(f.SecretFile)
	if err != nil {
		return fmt.Errorf("--secret-file: %w", err)
	}
	f.Secret = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	return nil
}

// bearerCmd prints the bearer the instances of a cluster accept: the
// secret itself is never a bearer (internal/keys says why), so an
// operator who calls /_weft/ or recompute by hand asks for it here.
type bearerCmd struct {
	secretFlags `embed:""`
}

func (c *bearerCmd) run(stdout io.Writer) error {
	if err := c.load(); err != nil {
		return err
	}
	if c.Secret == "" {
		return errors.New("no secret: give --secret-file, WEFT_SECRET_FILE or WEFT_SECRET")
	}
	if p := httpx.SecretProblem(c.Secret); p != "" {
		return fmt.Errorf("the secret %s", p)
	}
	_, err := fmt.Fprintln(stdout, keys.Bearer(c.Secret))
	return err
}
