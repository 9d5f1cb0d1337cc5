package admin

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
)

// Client calls of the search, retry, bulk, pause, series and saga list
// endpoints.

// SearchJobs lists the jobs f selects, newest update first. A page may be
// short, even empty, with a Next cursor: the filter is evaluated in a
// bounded scan (see JobFilter).
func (c *Client) SearchJobs(ctx context.Context, f JobFilter, limit int, cursor string) (JobList, error) {
	q := f.Query()
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	var out JobList
	err := c.do(ctx, http.MethodGet, "/v1/jobs?"+q.Encode(), nil, &out)
	return out, err
}

// RetryJob submits an ended job (FAILED, TIMEOUT, CANCELLED) again under a
// new id.
func (c *Client) RetryJob(ctx context.Context, id string) (Retried, error) {
	var out Retried
	err := c.do(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(id)+"/retry", nil, &out)
	return out, err
}

// Bulk cancels or retries the jobs a filter selects.
func (c *Client) Bulk(ctx context.Context, req BulkRequest) (BulkResult, error) {
	var out BulkResult
	err := c.do(ctx, http.MethodPost, "/v1/jobs/bulk", jsonBody(req), &out)
	return out, err
}

// PauseTopic stops dispatching topic's jobs on every replica (pause true)
// or resumes it.
func (c *Client) PauseTopic(ctx context.Context, topic string, pause bool) (Paused, error) {
	action := "/resume"
	if pause {
		action = "/pause"
	}
	var out Paused
	err := c.do(ctx, http.MethodPost, "/v1/pools/"+topic+action, nil, &out)
	return out, err
}

// Series returns the chart series over window ("" for the default).
func (c *Client) Series(ctx context.Context, window string) (Series, error) {
	path := "/v1/series"
	if window != "" {
		path += "?window=" + url.QueryEscape(window)
	}
	var out Series
	err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out, err
}

// Sagas lists the kept sagas, newest first.
func (c *Client) Sagas(ctx context.Context, limit int, cursor string) (SagaList, error) {
	q := url.Values{}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	var out SagaList
	err := c.do(ctx, http.MethodGet, "/v1/sagas?"+q.Encode(), nil, &out)
	return out, err
}
