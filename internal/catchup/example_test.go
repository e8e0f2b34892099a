package catchup_test

import (
	"context"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/weft-dev/weft/internal/catchup"
	"github.com/weft-dev/weft/internal/fabric"
)

// Every instance serves the catch-up of the streams it can answer for: a
// durable stream from its table (any instance can), an ephemeral one from
// its writer's memory (only that writer can). The node's Fetcher is a
// Client that asks the writer's instance first and reads PostgreSQL when it
// does not answer in time.
func ExampleNewServer() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		log.Fatal(err)
	}
	events := &catchup.SQLSource{Pool: pool, Table: "events", IDColumn: "stream_id", WriterColumn: "writer", RowsColumn: "rows"}
	typing := fabric.NewEphemeral("typing") // also given to the node (Config.Ephemerals)
	srv, err := catchup.NewServer(catchup.ServerConfig{
		Secret:  "s3cret", // every /_weft/ request carries it as a bearer token
		Sources: map[string]catchup.Source{"events": events, "typing": typing},
	})
	if err != nil {
		log.Fatal(err)
	}
	go catchup.NewHTTPServer(":8080", srv).ListenAndServe() // bounded headers and bodies

	client, err := catchup.NewClient(catchup.ClientConfig{
		Secret:   "s3cret",
		Fallback: map[string]catchup.Source{"events": events}, // a hung or gone source: read the table
	})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	_ = fabric.Config{Fetcher: client}
}
