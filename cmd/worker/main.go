// Command worker runs a weft instance: it follows the streams, serves the
// rooms client API and catch-up, and, when its --name is one of
// --event-writers or the --typing-writer, writes those streams.
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
// without calling Config.Validate before we choose to.
type flags instance.Config

type cli struct {
	Config      flags `embed:""`
	CheckConfig bool  `name:"check-config" help:"Validate the configuration and exit."`
}

func main() {
	var c cli
	kong.Parse(&c, kong.Name("worker"), kong.Description("A weft worker instance."),
		kong.Vars{"default_name": "worker"}, kong.UsageOnError())
	cfg := instance.Config(c.Config)
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(2)
	}
	if c.CheckConfig {
		fmt.Println("configuration ok")
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := app.Run(ctx, cfg, app.RoleWorker, nil); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}
