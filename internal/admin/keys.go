package admin

import (
	"context"
	"net/http"

	"github.com/troupe-run/troupe/internal/keyslot"
)

// Concurrency keys (README, "Concurrency keys"):
//
//	GET /v1/concurrency-keys   each key's holders, lingering slots and waiters (all-tenant keys)

// KeyNode is what the concurrency-keys endpoint needs of a node
// (*troupe.Node's inspector implements it); a node without it, or with no
// concurrency_keys configured, answers 404.
type KeyNode interface {
	ConcurrencyKeys(ctx context.Context, max int) ([]keyslot.Stat, bool, error)
}

// KeyList answers GET /v1/concurrency-keys.
type KeyList struct {
	Keys []keyslot.Stat `json:"keys"`
}

// maxKeysListed bounds the keys one answer lists.
const maxKeysListed = 1000

// keyRoutes registers the concurrency-keys endpoint (server.go calls it).
func (s *Server) keyRoutes(api func(string, scope, apiHandler)) {
	api("GET /v1/concurrency-keys", allTenants, s.listKeys)
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request, _ principal) error {
	n, ok := s.cfg.Node.(KeyNode)
	if !ok {
		return errNotFound("this node serves no concurrency keys")
	}
	stats, on, err := n.ConcurrencyKeys(r.Context(), maxKeysListed)
	if !on {
		return errNotFound("no concurrency_keys configured")
	}
	if err != nil {
		return err
	}
	if stats == nil {
		stats = []keyslot.Stat{}
	}
	writeJSON(w, http.StatusOK, KeyList{Keys: stats})
	return nil
}

// ConcurrencyKeys lists each concurrency key's slots and waiters.
func (c *Client) ConcurrencyKeys(ctx context.Context) (KeyList, error) {
	var out KeyList
	err := c.do(ctx, http.MethodGet, "/v1/concurrency-keys", nil, &out)
	return out, err
}
