package admin

import (
	"context"
	"net/http"
	"net/url"

	"github.com/troupe-run/troupe/internal/saga"
)

// Saga returns a workflow's saga: its compensation stack, the rollback's
// progress and each compensation's job state (an all-tenant key).
func (c *Client) Saga(ctx context.Context, workflowID string) (*saga.Report, error) {
	var out saga.Report
	if err := c.do(ctx, http.MethodGet, "/v1/sagas/"+url.PathEscape(workflowID), nil, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
