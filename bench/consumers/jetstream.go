package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsPeer: a JetStream stream JOBS (file storage) on subject "jobs";
// producers publish asynchronously and wait for every ack of a call;
// each member is a pull subscriber (Consume) of one durable consumer with
// explicit acks, which takes what has arrived (up to 100 messages),
// commits the effect to PostgreSQL, then acks each message. Not
// transactional with PostgreSQL: a crash between commit and ack applies
// the rows again (at least once).
type natsPeer struct{}

func (natsPeer) Name() string { return "jetstream" }

// Promise: at least once, and no order: a message delivered to a
// subscriber that dies unacked comes back after AckWait, behind later
// ones (one subscriber is in order while nothing is redelivered).
func (natsPeer) Promise(int) promise { return promise{Order: "none"} }

func natsStreamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{Name: "JOBS", Subjects: []string{"jobs"}, Storage: jetstream.FileStorage}
}

// Setup makes the stream anew, so each scenario starts from nothing.
func (natsPeer) Setup(ctx context.Context, e env) error {
	nc, err := nats.Connect(e.NATS)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if err := js.DeleteStream(ctx, "JOBS"); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	_, err = js.CreateStream(ctx, natsStreamConfig())
	return err
}

type natsProducer struct {
	nc *nats.Conn
	js jetstream.JetStream
}

func (natsPeer) Producer(ctx context.Context, e env, _ int) (producer, error) {
	nc, err := nats.Connect(e.NATS)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		nc.Close()
		return nil, err
	}
	return natsProducer{nc, js}, nil
}

func (p natsProducer) Send(ctx context.Context, jobs []job) error {
	futures := make([]jetstream.PubAckFuture, len(jobs))
	for i, j := range jobs {
		b := fmt.Appendf(nil, `{"s":%d,"k":%d,"t":%d}`, j.S, j.K, j.T)
		f, err := p.js.PublishAsync("jobs", b)
		if err != nil {
			return err
		}
		futures[i] = f
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (p natsProducer) Close() error { p.nc.Close(); return nil }

func (natsPeer) Consume(ctx context.Context, e env, c consumeOpts) (func() error, error) {
	pool, err := pgxpool.New(ctx, e.DB)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var conns []*nats.Conn
	var ccs []jetstream.ConsumeContext
	var mu sync.Mutex
	var firstErr error
	stop := func() error {
		for _, cc := range ccs {
			cc.Stop()
		}
		cancel()
		wg.Wait()
		for _, nc := range conns {
			nc.Close()
		}
		pool.Close()
		mu.Lock()
		defer mu.Unlock()
		return firstErr
	}
	for i := range c.Members {
		nc, err := nats.Connect(e.NATS)
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		conns = append(conns, nc)
		js, err := jetstream.New(nc)
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		cons, err := js.CreateOrUpdateConsumer(ctx, "JOBS", jetstream.ConsumerConfig{Durable: "fx", AckPolicy: jetstream.AckExplicitPolicy,
			DeliverPolicy: jetstream.DeliverAllPolicy, MaxAckPending: 20000, AckWait: 30 * time.Second})
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		msgs := make(chan jetstream.Msg, 1000)
		cc, err := cons.Consume(func(m jetstream.Msg) {
			select {
			case msgs <- m:
			case <-ctx.Done():
			}
		}, jetstream.PullMaxMessages(500))
		if err != nil {
			return nil, errors.Join(err, stop())
		}
		ccs = append(ccs, cc)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := natsApply(ctx, pool, msgs, c); err != nil && ctx.Err() == nil {
				mu.Lock()
				firstErr = errors.Join(firstErr, fmt.Errorf("subscriber %d: %w", i, err))
				mu.Unlock()
			}
		}()
	}
	return stop, nil
}

// natsApply takes the messages that have arrived, up to 100, commits
// their effect, then acks them.
func natsApply(ctx context.Context, pool *pgxpool.Pool, msgs <-chan jetstream.Msg, c consumeOpts) error {
	batch := make([]jetstream.Msg, 0, 100)
	jobs := make([]job, 0, 100)
	for {
		batch, jobs = batch[:0], jobs[:0]
		select {
		case <-ctx.Done():
			return nil
		case m := <-msgs:
			batch = append(batch, m)
		}
	more:
		for len(batch) < cap(batch) {
			select {
			case m := <-msgs:
				batch = append(batch, m)
			default:
				break more
			}
		}
		for _, m := range batch {
			j, err := decodeJob(m.Data())
			if err != nil {
				return err
			}
			jobs = append(jobs, j)
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		if err := applyEffects(ctx, tx, jobs, c.Notify); err != nil {
			_ = tx.Rollback(ctx)
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		c.Applied.Add(int64(len(jobs)))
		for _, m := range batch {
			if err := m.Ack(); err != nil {
				return fmt.Errorf("ack: %w", err)
			}
		}
	}
}

// natsdMain runs a nats-server with JetStream on file storage, as a
// process of its own so that its CPU is read apart from the consumers'.
func natsdMain(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("natsd", flag.ExitOnError)
	port := fs.Int("port", 24222, "client port")
	dir := fs.String("dir", "", "JetStream storage directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: *port, JetStream: true, StoreDir: *dir,
		JetStreamMaxStore: 8 << 30, NoSigs: true})
	if err != nil {
		return err
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		return errors.New("nats-server: not ready in 10s")
	}
	fmt.Println("ready")
	<-ctx.Done()
	s.Shutdown()
	s.WaitForShutdown()
	return nil
}
