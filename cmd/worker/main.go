// Command worker runs a weft instance: it follows the streams, serves the
// rooms client API and catch-up, and, when its --name is one of
// --event-writers or the --typing-writer, writes those streams.
//
// Exit status: 0 after SIGTERM or SIGINT, 1 after a runtime failure
// (logged at ERROR), 2 for a bad flag or setting (one line on stderr).
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/alecthomas/kong"

	"github.com/weft-dev/weft/cmd/internal/server"
)

type cli struct {
	Instance server.ServeFlags `embed:""`
	Version  kong.VersionFlag  `help:"Print the version and exit."`
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	var c cli
	parser, err := server.NewParser(&c, "worker", "A weft worker instance.", kong.Vars{"default_name": "worker"})
	if err != nil {
		panic(err) // the grammar above is wrong
	}
	parser.Stdout, parser.Stderr = stdout, stderr
	if _, err := parser.Parse(args); err != nil {
		return server.UsageError(stderr, "worker", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return c.Instance.Serve(ctx, stdout, stderr, "worker", server.RoleWorker)
}
