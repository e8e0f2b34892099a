package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"

	"github.com/alecthomas/kong"
)

// Exit statuses of the binaries, one convention for both.
const (
	ExitOK      = 0 // done, or stopped on request (SIGTERM, SIGINT), even while starting
	ExitFailure = 1 // a runtime error: the database, the network, a lost lease
	ExitUsage   = 2 // a bad flag, command or setting: nothing was started
)

// NewParser builds a binary's kong parser. --help and --version print to
// stdout and exit 0; a parse error is returned, for UsageError, instead of
// kong's whole usage on stdout.
func NewParser(grammar any, name, description string, vars kong.Vars) (*kong.Kong, error) {
	vars = maps.Clone(vars)
	if vars == nil {
		vars = kong.Vars{}
	}
	vars["version"] = name + " " + Build().String()
	return kong.New(grammar, kong.Name(name), kong.Description(description), vars)
}

// UsageError prints err as one line on w, with where to read more, and
// returns ExitUsage.
func UsageError(w io.Writer, name string, err error) int {
	hint := name + " --help"
	var pe *kong.ParseError
	if errors.As(err, &pe) && pe.Context != nil {
		if cmd := pe.Context.Command(); cmd != "" {
			hint = name + " " + cmd + " --help"
		}
	}
	fmt.Fprintf(w, "%s: %v (try '%s')\n", name, err, hint)
	return ExitUsage
}

// Main runs an instance as the binaries do and returns the exit status. A
// failure is logged at ERROR, in the configured format, as the last line.
// cfg must have passed Validate (a bad setting is a usage error).
func Main(ctx context.Context, cfg Config, role string) int {
	err := Run(ctx, cfg, role, nil)
	switch {
	case err == nil:
		return ExitOK
	case ctx.Err() != nil && errors.Is(err, context.Canceled):
		return ExitOK // stopped while starting (waiting for the database, say)
	}
	cfg.Logger().Error("exiting on error", "role", role, "name", cfg.Name, "err", err)
	return ExitFailure
}

// Flags are Config as command-line flags: a defined type, so kong parses
// them without calling Config.Validate before the command chooses to.
type Flags Config

// ServeFlags are the flags of a command that runs an instance: its
// configuration and --check-config.
type ServeFlags struct {
	Config      Flags `embed:""`
	CheckConfig bool  `name:"check-config" help:"Validate the configuration and exit."`
}

// Serve validates the configuration, a bad setting being a usage error of
// command name; with --check-config it prints "configuration ok" to
// stdout, otherwise it runs the instance in role with Main. It returns the
// exit status.
func (f ServeFlags) Serve(ctx context.Context, stdout, stderr io.Writer, name, role string) int {
	cfg := Config(f.Config)
	if err := cfg.Validate(); err != nil {
		return UsageError(stderr, name, err)
	}
	if f.CheckConfig {
		fmt.Fprintln(stdout, "configuration ok")
		return ExitOK
	}
	return Main(ctx, cfg, role)
}
