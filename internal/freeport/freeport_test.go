package freeport

import (
	"context"
	"net"
	"strconv"
	"testing"
)

// Next hands out bindable ports, never one twice within Remembered calls
// (the chaos suite once gave sync2 and persister1 the same one), and keeps
// back at most Remembered.
func TestNextDistinctBindableBounded(t *testing.T) {
	seen := map[int]bool{}
	for i := range Remembered {
		p, err := Next()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		if i == 0 {
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				t.Fatalf("listen on %d: %v", p, err)
			}
			l.Close()
		}
	}
	for range 10 { // beyond the bound the oldest may come back
		if _, err := Next(); err != nil {
			t.Fatal(err)
		}
	}
	if set, order := remembered(); set != Remembered || order != Remembered {
		t.Errorf("keeps back %d ports (%d in order), want the bound %d", set, order, Remembered)
	}
}

// A listener from Listen holds a port Next never hands out while it is
// remembered, and Listen never takes one Next handed out.
func TestListenRemembers(t *testing.T) {
	l, err := Listen(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	given.Lock()
	ok := given.set[port]
	given.Unlock()
	if !ok {
		t.Fatalf("port %d of Listen not remembered", port)
	}
	for range 200 {
		p, err := Next()
		if err != nil {
			t.Fatal(err)
		}
		if p == port {
			t.Fatalf("Next handed out %d, held by Listen", p)
		}
	}
}
