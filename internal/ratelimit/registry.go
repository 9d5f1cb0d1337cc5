package ratelimit

import "sync"

// The process's limiters by node id: the admin server (started beside its
// node by cmd/troupe) finds its node's limiter here, so the node needs no
// public method for it.
var (
	regMu    sync.Mutex
	registry = map[string]*Limiter{}
)

// Register makes l its node's limiter.
func Register(node string, l *Limiter) {
	regMu.Lock()
	defer regMu.Unlock()
	registry[node] = l
}

// Unregister forgets node's limiter, if it is still l.
func Unregister(node string, l *Limiter) {
	regMu.Lock()
	defer regMu.Unlock()
	if registry[node] == l {
		delete(registry, node)
	}
}

// Lookup returns node's limiter (nil: none in this process).
func Lookup(node string) *Limiter {
	regMu.Lock()
	defer regMu.Unlock()
	return registry[node]
}
