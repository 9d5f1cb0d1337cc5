package admin

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/troupe-run/troupe/internal/ratelimit"
)

// Rate limits (internal/ratelimit):
//
//	GET /v1/limits[?bucket=NAME][&limit=N]   each declared bucket: its level
//	    in Redis, every node's waiting units (as their last calls recorded
//	    them), and this node's waiting jobs in queue order (at most N a
//	    bucket, default 100)
//
// All-tenant keys only: a bucket is shared by every tenant's jobs.

// LimitList answers GET /v1/limits.
type LimitList struct {
	Node    string                 `json:"node"`
	Buckets []ratelimit.BucketView `json:"buckets"`
}

func (s *Server) listLimits(w http.ResponseWriter, r *http.Request, _ principal) error {
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 10000 {
			return errBadRequest("limit: a number from 0 to 10000")
		}
		limit = n
	}
	out := LimitList{Node: s.cfg.Node.ID(), Buckets: []ratelimit.BucketView{}}
	if l := ratelimit.Lookup(s.cfg.Node.ID()); l != nil {
		views, err := l.View(r.Context(), r.URL.Query().Get("bucket"), limit)
		if err != nil {
			return err
		}
		if views != nil {
			out.Buckets = views
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// Limits calls GET /v1/limits.
func (c *Client) Limits(ctx context.Context, bucket string, limit int) (LimitList, error) {
	q := url.Values{}
	if bucket != "" {
		q.Set("bucket", bucket)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var out LimitList
	err := c.do(ctx, http.MethodGet, "/v1/limits?"+q.Encode(), nil, &out)
	return out, err
}
