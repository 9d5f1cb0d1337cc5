package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/troupe-run/troupe/proto/capv1"
)

// clientTimeoutDefault bounds one API call of a Client without its own
// http.Client.
const clientTimeoutDefault = 30 * time.Second

// Client calls the admin API (the troupe CLI uses it).
type Client struct {
	// Base is the server's URL, e.g. URLDefault.
	Base string
	// Key is the API key ("" when the server has none).
	Key  string
	HTTP *http.Client
}

// NewClient returns a client of the API at base.
func NewClient(base, key string) *Client {
	return &Client{Base: strings.TrimRight(base, "/"), Key: key, HTTP: &http.Client{Timeout: clientTimeoutDefault}}
}

// APIError is an error response of the API.
type APIError struct {
	Status  int
	Code    string
	Message string
	body    []byte
}

func (e *APIError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("admin API: HTTP %d", e.Status)
	}
	return fmt.Sprintf("admin API: %s (HTTP %d)", e.Message, e.Status)
}

// do sends a request and decodes a JSON answer into out (nil: ignore it).
func (c *Client) do(ctx context.Context, method, path string, body []byte, out any) error {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Key != "" {
		req.Header.Set("Authorization", "Bearer "+c.Key)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	res, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return err
	}
	if res.StatusCode >= 300 {
		var eb ErrorBody
		_ = json.Unmarshal(data, &eb)
		return &APIError{Status: res.StatusCode, Code: eb.Code, Message: eb.Error, body: data}
	}
	if out == nil || len(data) == 0 {
		return nil
	}
	return json.Unmarshal(data, out)
}

func jsonBody(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// Submit submits req (a missing job id is assigned by the server).
func (c *Client) Submit(ctx context.Context, req *capv1.JobRequest) (Submitted, error) {
	body, err := protojson.Marshal(req)
	if err != nil {
		return Submitted{}, err
	}
	var out Submitted
	err = c.do(ctx, http.MethodPost, "/v1/jobs", body, &out)
	return out, err
}

// Job returns a job with its history and decisions.
func (c *Client) Job(ctx context.Context, id string) (Job, error) {
	var out Job
	err := c.do(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(id), nil, &out)
	return out, err
}

// Decide approves or rejects a job waiting for approval (action "approve"
// or "reject"); hash "" means the hash recorded on the job.
func (c *Client) Decide(ctx context.Context, id, action, reason, by, hash string) (Accepted, error) {
	var out Accepted
	err := c.do(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(id)+"/"+action,
		jsonBody(actionBody{Reason: reason, By: by, Hash: hash}), &out)
	return out, err
}

// Cancel cancels a job.
func (c *Client) Cancel(ctx context.Context, id, reason, by string) (Accepted, error) {
	var out Accepted
	err := c.do(ctx, http.MethodPost, "/v1/jobs/"+url.PathEscape(id)+"/cancel",
		jsonBody(actionBody{Reason: reason, By: by}), &out)
	return out, err
}

// Trace returns a job's mailbox trace.
func (c *Client) Trace(ctx context.Context, id string) (Trace, error) {
	var out Trace
	err := c.do(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(id)+"/trace", nil, &out)
	return out, err
}

// DLQ lists DLQ entries, newest first.
func (c *Client) DLQ(ctx context.Context, limit int) (DLQList, error) {
	var out DLQList
	err := c.do(ctx, http.MethodGet, "/v1/dlq?limit="+strconv.Itoa(max(limit, 1)), nil, &out)
	return out, err
}

// RetryDLQ re-submits an entry's job under a new id.
func (c *Client) RetryDLQ(ctx context.Context, entryID string, force bool) (Submitted, error) {
	path := "/v1/dlq/" + url.PathEscape(entryID) + "/retry"
	if force {
		path += "?force=true"
	}
	var out Submitted
	err := c.do(ctx, http.MethodPost, path, nil, &out)
	return out, err
}

// DeleteDLQ deletes an entry.
func (c *Client) DeleteDLQ(ctx context.Context, entryID string) error {
	return c.do(ctx, http.MethodDelete, "/v1/dlq/"+url.PathEscape(entryID), nil, nil)
}

// Workers lists live workers and their pools' load.
func (c *Client) Workers(ctx context.Context) (WorkerList, error) {
	var out WorkerList
	err := c.do(ctx, http.MethodGet, "/v1/workers", nil, &out)
	return out, err
}

// Pools lists topic mappings and pools.
func (c *Client) Pools(ctx context.Context) (PoolList, error) {
	var out PoolList
	err := c.do(ctx, http.MethodGet, "/v1/pools", nil, &out)
	return out, err
}

// Pool returns one topic's mapping.
func (c *Client) Pool(ctx context.Context, topic string) (TopicMapping, error) {
	var out TopicMapping
	err := c.do(ctx, http.MethodGet, "/v1/pools/"+topic, nil, &out)
	return out, err
}

// SetPool maps topic to pools at run time, for every replica.
func (c *Client) SetPool(ctx context.Context, topic string, pools []string) (TopicMapping, error) {
	var out TopicMapping
	err := c.do(ctx, http.MethodPut, "/v1/pools/"+topic, jsonBody(PoolMapping{Pools: pools}), &out)
	return out, err
}

// DeletePool drops topic's runtime mapping.
func (c *Client) DeletePool(ctx context.Context, topic string) error {
	return c.do(ctx, http.MethodDelete, "/v1/pools/"+topic, nil, nil)
}

// Stats returns jobs per state and the node's counters.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	var out Stats
	err := c.do(ctx, http.MethodGet, "/v1/stats", nil, &out)
	return out, err
}

// Ready returns the node's readiness; a node that is not ready is an
// answer, not an error.
func (c *Client) Ready(ctx context.Context) (Ready, error) {
	var out Ready
	err := c.do(ctx, http.MethodGet, "/readyz", nil, &out)
	var ae *APIError
	if errors.As(err, &ae) && ae.Status == http.StatusServiceUnavailable {
		return out, json.Unmarshal(ae.body, &out)
	}
	return out, err
}
