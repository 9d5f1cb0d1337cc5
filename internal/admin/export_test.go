package admin

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/troupe-run/troupe/proto/capv1"
)

// Helpers only the tests use.

// ParseKeys reads API keys written as "key=tenant" entries, separated by
// commas or newlines ("*" as the tenant for all tenants; blank lines and
// lines starting with # are skipped), and returns each key's tenant. It
// reads the attributes ParseKeyEntries knows and drops them; a node uses
// ParseKeyEntries.
func ParseKeys(s string) (map[string]string, error) {
	full, err := ParseKeyEntries(s)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(full))
	for k, e := range full {
		out[k] = e.Tenant
	}
	return out, nil
}

// SubmitPayload submits req with payload as its input: JSON text is sent
// as a JSON value, anything else as base64. The node stores it and sets
// the request's context_ptr.
func (c *Client) SubmitPayload(ctx context.Context, req *capv1.JobRequest, payload []byte) (Submitted, error) {
	return c.SubmitWithData(ctx, req, payload, nil)
}

// ListJobs lists a state's jobs, or with state "" the newest jobs of every
// state; tenant narrows an all-tenant key's view.
func (c *Client) ListJobs(ctx context.Context, state string, limit int, cursor, tenant string) (JobList, error) {
	q := url.Values{}
	if state != "" {
		q.Set("state", state)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	if tenant != "" {
		q.Set("tenant", tenant)
	}
	var out JobList
	err := c.do(ctx, http.MethodGet, "/v1/jobs?"+q.Encode(), nil, &out)
	return out, err
}
