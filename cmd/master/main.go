// Command master runs weft's master instance and its operator commands:
//
//	master [run]            migrate, then serve: seals writers whose lease
//	                        expired, writes typing by default, serves clients
//	master migrate          apply schema migrations and exit
//	master check [--repair] run the startup consistency checks (and fix them)
//	master status [--json]  live instances, writers, positions and lag
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/alecthomas/kong"

	"github.com/weft-dev/weft/app"
	"github.com/weft-dev/weft/instance"
)

// flags are the configuration flags; a defined type, so kong parses them
// without calling Config.Validate: migrate and check need no secret.
type flags instance.Config

type cli struct {
	Config flags `embed:""`

	Run     runCmd     `cmd:"" default:"1" help:"Run the master (the default)."`
	Migrate migrateCmd `cmd:"" help:"Apply schema migrations and exit."`
	Check   checkCmd   `cmd:"" help:"Run the startup consistency checks of every stream."`
	Status  statusCmd  `cmd:"" help:"Show live instances, writers, positions and lag."`
}

func main() {
	var c cli
	kctx := kong.Parse(&c, kong.Name("master"), kong.Description("The weft master instance and operator commands."),
		kong.Vars{"default_name": "master"}, kong.UsageOnError())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg := instance.Config(c.Config)
	kctx.BindTo(ctx, (*context.Context)(nil))
	if err := kctx.Run(&cfg); err != nil {
		fmt.Fprintln(os.Stderr, "master:", err)
		os.Exit(1)
	}
}

type runCmd struct{}

func (runCmd) Run(ctx context.Context, cfg *instance.Config) error {
	return app.Run(ctx, *cfg, app.RoleMaster, nil)
}
