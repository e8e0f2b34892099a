// Package freeport hands out TCP ports of 127.0.0.1 for the processes that
// tests and tools start, never the same one twice in a process.
//
// A port that was free a moment ago is the best anyone can offer; but the
// kernel may offer a port it just gave and saw closed, and two instances
// of one cluster given the same port fail at random: one binds it, the
// other answers "address already in use", and its URL reaches the first.
package freeport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
)

// Remembered is how many of the latest ports Next keeps from handing out
// again; beyond it the oldest may come back.
const Remembered = 4096

var given struct {
	sync.Mutex
	set   map[int]bool
	order []int
}

// Next returns a port of 127.0.0.1 that was free a moment ago and that
// none of the last Remembered calls returned. Another process may still
// take it before the caller binds it.
func Next() (int, error) {
	given.Lock()
	defer given.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("freeport: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if given.set[port] {
			continue
		}
		remember(port)
		return port, nil
	}
	return 0, errors.New("freeport: the kernel offered only ports handed out already, 100 times")
}

// Listen listens on a port of 127.0.0.1 that none of the last Remembered
// calls of Next or Listen handed out, and remembers it: a listener of the
// test process itself (a proxy, say) then never takes a port Next gave a
// process that has not bound it yet.
func Listen(ctx context.Context) (net.Listener, error) {
	given.Lock()
	defer given.Unlock()
	var lc net.ListenConfig
	for range 100 {
		l, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("freeport: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if given.set[port] {
			l.Close()
			continue
		}
		remember(port)
		return l, nil
	}
	return nil, errors.New("freeport: the kernel offered only ports handed out already, 100 times")
}

// remember records port as handed out. given must be locked.
func remember(port int) {
	if given.set == nil {
		given.set = map[int]bool{}
	}
	given.set[port] = true
	given.order = append(given.order, port)
	if len(given.order) > Remembered {
		delete(given.set, given.order[0])
		given.order = given.order[1:]
	}
}

// remembered is how many ports Next is keeping back, for tests.
func remembered() (set, order int) {
	given.Lock()
	defer given.Unlock()
	return len(given.set), len(given.order)
}
