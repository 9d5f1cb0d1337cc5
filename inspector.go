package troupe

import (
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/store"
)

// inspector is the inside view of a node (package inspect): what the admin
// API, `troupe`, the bench and the fault suite read and operate in internal
// types. It carries the node's public methods too. None of its types shows
// in the root package's API: a program outside this module reads a node
// through Node's methods (Job, Wait, Decide, …) and the admin API.
type inspector struct{ *Node }

func init() {
	inspect.Register(func(node any) inspect.Node { return inspector{node.(*Node)} })
}

// Subjects returns the CAP subjects the node uses.
func (n inspector) Subjects() bus.Subjects { return n.subj }

// Store returns the node's Redis store (valid after Start).
func (n inspector) Store() *store.Store { return n.store }

// Mappings returns the runtime topic → pools mappings shared by every
// replica through Redis.
func (n inspector) Mappings() *router.MappingStore {
	return router.NewMappingStore(n.rdb, n.cfg.KeyPrefix)
}
