package admin

import (
	"context"

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
