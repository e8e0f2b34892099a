package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// Where the demo's PostgreSQL and Redis come from (-servers):
//
//   - shared: the ones at -database-url and -redis-url, which must answer;
//   - private: a redis-server and a PostgreSQL cluster of the demo's own,
//     started from the installed binaries (redis-server on PATH; initdb
//     and postgres from the highest /usr/lib/postgresql/*/bin, else PATH)
//     on free ports in temp dirs, and removed when the demo ends;
//   - auto (the default): shared where one answers, private where not,
//     so `make demo` needs no set-up on a machine with the packages.
//
// Private servers keep nothing: fsync and persistence are off, and their
// dirs go with them. They die with the demo (Pdeathsig) if it is killed.

// servers are the URLs the demo uses and the private servers it started.
type servers struct {
	dbURL, redisURL string
	private         []*privateServer
}

// Close stops and removes the private servers (none for shared ones).
func (s *servers) Close() {
	for _, p := range s.private {
		p.stop()
	}
}

const (
	probeTimeout = 3 * time.Second
	// startTimeout bounds a private server's start (initdb excluded).
	startTimeout = 60 * time.Second
)

// chooseServers returns the servers for mode, starting private ones as
// needed and saying on out which it uses. On error nothing is left running.
func chooseServers(ctx context.Context, mode, dbURL, redisURL string, out io.Writer) (_ *servers, err error) {
	s := &servers{dbURL: dbURL, redisURL: redisURL}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	var needPG, needRedis bool
	switch mode {
	case "private":
		needPG, needRedis = true, true
	case "shared", "auto":
		pgErr, redisErr := probePostgres(ctx, dbURL), probeRedis(ctx, redisURL)
		if mode == "shared" {
			if err := errors.Join(pgErr, redisErr); err != nil {
				return nil, fmt.Errorf("%w (-servers auto or private starts private ones)", err)
			}
			break
		}
		needPG, needRedis = pgErr != nil, redisErr != nil
		for _, e := range []error{pgErr, redisErr} {
			if e != nil {
				fmt.Fprintf(out, "%v: starting a private one\n", e)
			}
		}
	default:
		return nil, fmt.Errorf("-servers %q: want auto, shared or private", mode)
	}
	if needRedis {
		p, err := startRedis(ctx)
		if err != nil {
			return nil, err
		}
		s.private = append(s.private, p)
		s.redisURL = "redis://" + p.addr + "/0"
		fmt.Fprintf(out, "private redis-server at %s (in %s)\n", p.addr, p.dir)
	}
	if needPG {
		p, err := startPostgres(ctx)
		if err != nil {
			return nil, err
		}
		s.private = append(s.private, p)
		s.dbURL = "postgres://postgres@" + p.addr + "/postgres?sslmode=disable"
		fmt.Fprintf(out, "private postgres at %s (in %s)\n", p.addr, p.dir)
	}
	return s, nil
}

func probePostgres(ctx context.Context, u string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return fmt.Errorf("no PostgreSQL answers at %s", redactURL(u))
	}
	return conn.Close(ctx)
}

func probeRedis(ctx context.Context, u string) error {
	opt, err := redis.ParseURL(u)
	if err != nil {
		return fmt.Errorf("-redis-url: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	c := redis.NewClient(opt)
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("no Redis answers at %s", opt.Addr)
	}
	return nil
}

// redactURL drops a URL's password for messages.
func redactURL(u string) string {
	if i, j := strings.Index(u, "://"), strings.LastIndex(u, "@"); i >= 0 && j > i {
		return u[:i+3] + "…" + u[j:]
	}
	return u
}

// privateServer is one server process of the demo's own and its dir.
type privateServer struct {
	name, addr, dir string
	cmd             *exec.Cmd
	done            chan struct{}
	stopSig         os.Signal
}

// stop stops the server (its signal, then SIGKILL after 30 s) and
// removes its dir.
func (p *privateServer) stop() {
	if p.cmd != nil {
		_ = p.cmd.Process.Signal(p.stopSig)
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	_ = os.RemoveAll(p.dir)
}

// launch starts bin in p.dir as uid/gid (nil: as us), logging to
// p.dir/name.log, and waits until ready answers nil or the process exits.
func (p *privateServer) launch(ctx context.Context, cred *syscall.Credential, ready func(context.Context) error, bin string, args ...string) error {
	log, err := os.OpenFile(filepath.Join(p.dir, p.name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	p.cmd = exec.Command(bin, args...)
	p.cmd.Dir, p.cmd.Stdout, p.cmd.Stderr = p.dir, log, log
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cred}
	if err := p.cmd.Start(); err != nil {
		p.cmd = nil
		return fmt.Errorf("start %s: %w", bin, err)
	}
	p.done = make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		if err := ready(ctx); err == nil {
			return nil
		}
		select {
		case <-p.done:
			p.cmd = nil
			data, _ := os.ReadFile(log.Name())
			return fmt.Errorf("%s exited at start:\n%s", p.name, tail(string(data), 20))
		case <-ctx.Done():
			return fmt.Errorf("%s not answering at %s after %v: %w", p.name, p.addr, startTimeout, ctx.Err())
		case <-time.After(100 * time.Millisecond): // polling a starting server, not synchronisation
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// freeAddr is 127.0.0.1 and a port nothing listened on a moment ago.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

func startRedis(ctx context.Context) (*privateServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("no Redis answers and none can be started: %w (install redis-server)", err)
	}
	dir, err := os.MkdirTemp("", "weft-demo-redis-")
	if err != nil {
		return nil, err
	}
	p := &privateServer{name: "redis-server", dir: dir, stopSig: syscall.SIGTERM}
	if p.addr, err = freeAddr(); err != nil {
		p.stop()
		return nil, err
	}
	addr := p.addr
	_, port, _ := net.SplitHostPort(addr)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	err = p.launch(ctx, nil, func(ctx context.Context) error { return c.Ping(ctx).Err() }, bin,
		"--port", port, "--bind", "127.0.0.1", "--dir", dir, "--save", "", "--appendonly", "no", "--daemonize", "no")
	if err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

func startPostgres(ctx context.Context) (*privateServer, error) {
	bin, err := postgresBin()
	if err != nil {
		return nil, fmt.Errorf("no PostgreSQL answers and none can be started: %w (install postgresql)", err)
	}
	dir, err := os.MkdirTemp("", "weft-demo-pg-")
	if err != nil {
		return nil, err
	}
	p := &privateServer{name: "postgres", dir: dir, stopSig: os.Interrupt}
	if p.addr, err = freeAddr(); err != nil {
		p.stop()
		return nil, err
	}
	addr := p.addr
	// PostgreSQL refuses to run as root: then it runs as user postgres.
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			p.stop()
			return nil, fmt.Errorf("running as root, so PostgreSQL runs as user postgres: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			p.stop()
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync")
	initdb.Dir, initdb.SysProcAttr = dir, &syscall.SysProcAttr{Credential: cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		p.stop()
		return nil, fmt.Errorf("initdb: %w\n%s", err, tail(string(out), 20))
	}
	_, port, _ := net.SplitHostPort(addr)
	u := "postgres://postgres@" + addr + "/postgres?sslmode=disable"
	err = p.launch(ctx, cred, func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		conn, err := pgx.Connect(cctx, u)
		if err != nil {
			return err
		}
		return conn.Close(cctx)
	}, filepath.Join(bin, "postgres"), "-D", data, "-p", port, "-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories="+dir, "-c", "fsync=off", "-c", "shared_buffers=32MB")
	if err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// postgresBin is the directory holding initdb and postgres: the highest
// /usr/lib/postgresql/*/bin (Debian's layout), else the one on PATH.
func postgresBin() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	initdb, err := exec.LookPath("initdb")
	if err != nil {
		return "", fmt.Errorf("no initdb in /usr/lib/postgresql/*/bin or on PATH: %w", err)
	}
	return filepath.Dir(initdb), nil
}
