// Package inspect hands the node's own programs — the admin API
// (internal/admin), `troupe` (cmd/troupe), the bench (internal/bench) and the
// fault suite — what they read and operate in a *troupe.Node beyond its
// public API, in internal types (the store, the subjects, DLQ entries,
// routing config, saga reports, …), without any of those types appearing in
// the root package's exported signatures. The root package registers the
// view in its init; this package cannot import it (it imports this one).
package inspect

import (
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/store"
)

// Node is the inside view of a node: everything the admin API needs
// (admin.Node, admin.DataNode), plus its store and subjects.
type Node interface {
	admin.Node
	admin.DataNode
	// Store is the node's Redis store (valid after Start).
	Store() *store.Store
	// Subjects are the CAP subjects the node uses.
	Subjects() bus.Subjects
}

var of func(node any) Node

// Register installs the function that makes the view of a *troupe.Node (the
// root package's init calls it).
func Register(f func(node any) Node) { of = f }

// Of returns the inside view of node, a *troupe.Node.
func Of(node any) Node { return of(node) }
