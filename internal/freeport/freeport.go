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
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
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
// take it before the caller binds it, but only by naming it too: Next
// picks below the kernel's ephemeral range (ip_local_port_range), which
// outgoing connections and binds of port 0 draw from. (A port from that
// range, handed to a process started later, was taken by some other
// process's connection first under .ci/run: "bind: address already in
// use".)
func Next() (int, error) {
	given.Lock()
	defer given.Unlock()
	if lo, hi, ok := belowEphemeral(); ok {
		for range 100 {
			port := lo + rand.IntN(hi-lo+1)
			if given.set[port] {
				continue
			}
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				continue // taken
			}
			l.Close()
			remember(port)
			return port, nil
		}
	}
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

// belowEphemeral is the range Next picks from: from 10000 up to the
// start of the ephemeral range, when that leaves at least 1,000 ports.
func belowEphemeral() (lo, hi int, ok bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, false
	}
	start, err := strconv.Atoi(f[0])
	if err != nil || start-1 < 11000 {
		return 0, 0, false
	}
	return 10000, start - 1, true
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
