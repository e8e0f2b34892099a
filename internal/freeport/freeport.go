// Package freeport hands out TCP ports of 127.0.0.1 for the processes that
// tests and tools start, never the same one twice in a process.
//
// A port that was free a moment ago is the best anyone can offer; but the
// kernel may offer a port it just gave and saw closed, and two instances
// of one cluster given the same port fail at random: one binds it, the
// other answers "address already in use", and its URL reaches the first.
package freeport

import (
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
	if given.set == nil {
		given.set = map[int]bool{}
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
		given.set[port] = true
		given.order = append(given.order, port)
		if len(given.order) > Remembered {
			delete(given.set, given.order[0])
			given.order = given.order[1:]
		}
		return port, nil
	}
	return 0, errors.New("freeport: the kernel offered only ports handed out already, 100 times")
}

// remembered is how many ports Next is keeping back, for tests.
func remembered() (set, order int) {
	given.Lock()
	defer given.Unlock()
	return len(given.set), len(given.order)
}
