package handover

import "sync"

// Shared is a Node behind a mutex, for an adapter whose queue, server and
// forwarder ask it from many goroutines while its reader of the database
// feeds it: the methods a shard.Placement needs, and Update for the rest.
type Shared struct {
	mu sync.Mutex
	n  *Node
}

// NewShared guards n; n must not be used directly afterwards.
func NewShared(n *Node) *Shared { return &Shared{n: n} }

// Owner is key's owner at the newest known epoch, and that epoch.
func (s *Shared) Owner(key string) (string, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n.Owner(key), s.n.Epoch()
}

// Admit is [Node.Admit].
func (s *Shared) Admit(key string, senderEpoch int64) Decision {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n.Admit(key, senderEpoch)
}

// Runnable is [Node.Runnable].
func (s *Shared) Runnable(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n.Runnable(key)
}

// Done is [Node.Done].
func (s *Shared) Done(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.n.Done(key)
}

// Update runs f on the Node under the mutex: learning versions, releases
// and fences in one step, so no caller sees half of them.
func (s *Shared) Update(f func(n *Node)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s.n)
}
