// Command master runs weft's master instance and its operator commands:
//
//	master [run]            migrate, then serve: seals writers whose lease
//	                        expired, writes typing by default, serves clients
//	master migrate          apply schema migrations and exit
//	master check [--repair] run the startup consistency checks (and fix them)
//	master status [--watch] live instances, writers, positions and lag
//	master writers list     a shard map's writers (--map, default events)
//	                        at its current epoch, and their releases
//	master writers add NAME | remove NAME
//	                        change a shard map's writers: a new epoch
//	master groups           consumer groups: members, what each owns, lag
//	master consumers [list] every consumer and group: cursor, lag, paused
//	master consumers pause STREAM NAME | resume STREAM NAME
//	                        stop or restart applying (every process, ~1 s)
//	master consumers seek STREAM NAME --to start|end|POS|RFC3339-TIME
//	                        move the cursor (a group's, every partition's)
//	master consumers dead-letters list STREAM NAME
//	master consumers dead-letters retry|discard STREAM NAME POS
//	                        a consumer's dead letters; re-drive or drop one
//
// Each command takes only the flags it uses. Exit status: 0 on success and
// after SIGTERM or SIGINT, 1 after a runtime failure, 2 for a bad flag,
// command or setting (one line on stderr).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/alecthomas/kong"

	"github.com/weft-dev/weft/cmd/internal/server"
)

type cli struct {
	Version kong.VersionFlag `help:"Print the version and exit."`

	Run       server.ServeFlags `cmd:"" default:"withargs" help:"Run the master (the default): migrate, seal writers whose lease expired, write typing, serve clients."`
	Migrate   migrateCmd        `cmd:"" help:"Apply schema migrations and exit."`
	Check     checkCmd          `cmd:"" help:"Run the startup consistency checks of every stream."`
	Status    statusCmd         `cmd:"" help:"Show live instances, writers, positions and lag (of a running instance's /status)."`
	Writers   writersCmd        `cmd:"" help:"Show or change the writers of a shard map (stored in the database, by epoch)."`
	Groups    groupsCmd         `cmd:"" help:"Show the consumer groups: their members, the partitions each owns and its lag (from the database)."`
	Consumers consumersCmd      `cmd:"" help:"List, pause, resume or seek consumers and groups (stored in the database; running ones follow within a second)."`
	Bearer    bearerCmd         `cmd:"" help:"Print the HTTP bearer derived from the cluster's secret, for calling the operator's routes by hand: curl -H \"Authorization: Bearer $$(master bearer)\"."`
}

// out is where the commands write.
type out struct{ stdout, stderr io.Writer }

func main() {
	os.Exit(run(os.Args[1:], out{os.Stdout, os.Stderr}))
}

func run(args []string, o out) int {
	var c cli
	parser, err := server.NewParser(&c, "master", "The weft master instance and operator commands. `master` alone runs the master; its flags are in `master run --help`.", kong.Vars{"default_name": "master"})
	if err != nil {
		panic(err) // the grammar above is wrong
	}
	parser.Stdout, parser.Stderr = o.stdout, o.stderr
	kctx, err := parser.Parse(args)
	if err != nil {
		return server.UsageError(o.stderr, "master", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch kctx.Command() {
	case "migrate":
		err = c.Migrate.run(ctx, o)
	case "check":
		err = c.Check.run(ctx, o)
	case "status":
		if err = c.Status.validate(); err != nil {
			return server.UsageError(o.stderr, "master status", err)
		}
		err = c.Status.run(ctx, o)
	case "writers list":
		if err = c.Writers.List.validate(); err != nil {
			return server.UsageError(o.stderr, "master writers list", err)
		}
		err = c.Writers.List.run(ctx, o)
	case "writers add <name>":
		if err = c.Writers.Add.validate(); err != nil {
			return server.UsageError(o.stderr, "master writers add", err)
		}
		err = c.Writers.Add.add(ctx, o)
	case "groups":
		err = c.Groups.run(ctx, o)
	case "consumers", "consumers list":
		err = c.Consumers.List.run(ctx, o)
	case "consumers pause <stream> <name>", "consumers resume <stream> <name>":
		cmd, pause := c.Consumers.Resume, kctx.Command() == "consumers pause <stream> <name>"
		if pause {
			cmd = c.Consumers.Pause
		}
		if err = cmd.validate(); err != nil {
			return server.UsageError(o.stderr, "master consumers", err)
		}
		err = cmd.change(ctx, o, pause)
	case "consumers seek <stream> <name>":
		to, verr := c.Consumers.Seek.target()
		if verr != nil {
			return server.UsageError(o.stderr, "master consumers seek", verr)
		}
		err = c.Consumers.Seek.seek(ctx, o, to)
	case "consumers dead-letters list <stream> <name>":
		if err = c.Consumers.DeadLetters.List.validate(); err != nil {
			return server.UsageError(o.stderr, "master consumers dead-letters list", err)
		}
		err = c.Consumers.DeadLetters.List.listDeadLetters(ctx, o)
	case "consumers dead-letters retry <stream> <name> <pos>", "consumers dead-letters discard <stream> <name> <pos>":
		cmd, retry := c.Consumers.DeadLetters.Discard, kctx.Command() == "consumers dead-letters retry <stream> <name> <pos>"
		if retry {
			cmd = c.Consumers.DeadLetters.Retry
		}
		if err = cmd.validate(); err != nil {
			return server.UsageError(o.stderr, "master consumers dead-letters", err)
		}
		err = cmd.change(ctx, o, retry)
	case "bearer":
		err = c.Bearer.run(o.stdout)
	case "writers remove <name>":
		if err = c.Writers.Remove.validate(); err != nil {
			return server.UsageError(o.stderr, "master writers remove", err)
		}
		err = c.Writers.Remove.remove(ctx, o)
	default:
		return c.Run.Serve(ctx, o.stdout, o.stderr, "master", server.RoleMaster)
	}
	if err != nil {
		fmt.Fprintln(o.stderr, "master:", err)
		return server.ExitFailure
	}
	return server.ExitOK
}
