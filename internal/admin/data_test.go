package admin_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/jobdata"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// dataIDs returns job ids unique to this test run, whose unprefixed data
// keys (CAP's convention) are deleted when the test ends.
func (b *bundle) dataIDs(names ...string) []string {
	ids := make([]string, len(names))
	for i, n := range names {
		ids[i] = b.env.Prefix + "-" + n
		id := ids[i]
		b.t.Cleanup(func() {
			b.env.Client.Del(context.Background(), "ctx:"+id, "res:"+id, "res:"+id+":redacted", "ctx:"+id+":comp")
		})
	}
	return ids
}

func TestJobDataShowsTheStoredInputAndResult(t *testing.T) {
	t.Parallel()
	b := setup(t, options{keys: testKeys})
	ctx := context.Background()
	ca, cb := b.client(keyA), b.client(keyB)
	b.startWorker("w1", echoToResult(b)) // result = the input, under res:<id>
	ids := b.dataIDs("json", "bin", "foreign")

	sub, err := ca.SubmitPayload(ctx, &capv1.JobRequest{JobId: ids[0], Topic: "job.echo"}, []byte(`{"n": 7, "s": "x"}`))
	if err != nil {
		t.Fatal(err)
	}
	b.waitState(ca, sub.JobID, "SUCCEEDED")
	d, err := ca.JobData(ctx, sub.JobID)
	if err != nil {
		t.Fatal(err)
	}
	for name, x := range map[string]*admin.Datum{"input": d.Input, "result": d.Result} {
		body, _ := json.Marshal(x.Body)
		if x == nil || !x.Held || x.ContentType != jobdata.TypeJSON || string(body) != `{"n":7,"s":"x"}` || x.Truncated {
			t.Fatalf("%s: %+v (body %s)", name, x, body)
		}
	}
	if d.Input.Pointer != "redis://ctx:"+ids[0] || d.Result.Pointer != "redis://res:"+ids[0] {
		t.Fatalf("pointers %q %q", d.Input.Pointer, d.Result.Pointer)
	}
	// Another tenant's key sees no such job.
	if _, err := cb.JobData(ctx, sub.JobID); apiStatus(err) != http.StatusNotFound {
		t.Fatalf("tenant b reads tenant a's data: %v", err)
	}

	// Bytes that are not UTF-8 come back base64.
	bin := []byte{0xff, 0x00, 0xfe}
	if _, err := ca.SubmitPayload(ctx, &capv1.JobRequest{JobId: ids[1], Topic: "job.echo"}, bin); err != nil {
		t.Fatal(err)
	}
	b.waitState(ca, ids[1], "SUCCEEDED")
	if d, err = ca.JobData(ctx, ids[1]); err != nil || d.Input.Encoding != "base64" || d.Input.Body != "/wD+" ||
		d.Input.ContentType != jobdata.TypeBinary || d.Input.Size != 3 {
		t.Fatalf("binary input: %+v %v", d.Input, err)
	}

	// A request pointing at another job's data shows the pointer, unread.
	if _, err := cb.Submit(ctx, &capv1.JobRequest{JobId: ids[2], Topic: "job.echo", ContextPtr: "redis://ctx:" + ids[0]}); err != nil {
		t.Fatal(err)
	}
	b.waitState(cb, ids[2], "SUCCEEDED")
	d, err = cb.JobData(ctx, ids[2])
	if err != nil || d.Input.Held || d.Input.Body != nil || d.Input.Pointer != "redis://ctx:"+ids[0] {
		t.Fatalf("foreign pointer: %+v %v", d.Input, err)
	}
}

func TestSubmitPayloadOverTheCapIsRefused413(t *testing.T) {
	t.Parallel()
	b := setup(t, options{admin: func(c *admin.Config) { c.MaxPayloadBytes = 100 }})
	ctx := context.Background()
	c := b.client("")
	id := b.dataIDs("big")[0]
	_, err := c.SubmitPayload(ctx, &capv1.JobRequest{JobId: id, Topic: "job.echo"}, []byte(strings.Repeat("a", 101)))
	var ae *admin.APIError
	if apiStatus(err) != http.StatusRequestEntityTooLarge || !asAPIError(err, &ae) || ae.Code != "payload_too_large" {
		t.Fatalf("oversize payload: %v", err)
	}
	if n := b.env.Client.Exists(ctx, "ctx:"+id).Val(); n != 0 {
		t.Fatal("the oversize payload was stored")
	}
	// A payload and a context_ptr at once, or a string that is not base64: 400.
	if _, err := c.SubmitPayload(ctx, &capv1.JobRequest{JobId: id, Topic: "job.echo", ContextPtr: "s3://x"}, []byte(`{}`)); apiStatus(err) != http.StatusBadRequest {
		t.Fatalf("payload with context_ptr: %v", err)
	}
	res, err := http.Post(b.base+"/v1/jobs", "application/json", strings.NewReader(`{"job_id":"`+id+`","topic":"job.echo","payload":"%%"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "base64") {
		t.Fatalf("bad base64: %d %s", res.StatusCode, body)
	}
}

// The output policy used by the redaction test: a rule redacts tenant a's
// results when they end (the record then points at a redacted copy), and
// the PII scanner redacts e-mail addresses in any other result, which the
// data endpoint applies when it shows the result.
const redactPolicy = `
version: v1
rules:
  - id: r-redact-a
    match: {tenants: [a]}
    decision: redact
scanners:
  secrets: {enabled: false}
  pii: {enabled: true, decision: redact, detectors: [email]}
`

func TestJobDataNeverShowsWhatTheOutputPolicyRedacts(t *testing.T) {
	t.Parallel()
	pol, err := safety.ParseOutputPolicy([]byte(redactPolicy))
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, options{keys: testKeys, node: func(c *troupe.Config) { c.Output = pol }})
	ctx := context.Background()
	b.startWorker("w1", echoToResult(b))
	ids := b.dataIDs("rule", "scan")
	const secret = "alice@example.com"
	payload := []byte(`{"note": "mail ` + secret + ` today"}`)
	for i, key := range []string{keyA, keyB} {
		c := b.client(key)
		if _, err := c.SubmitPayload(ctx, &capv1.JobRequest{JobId: ids[i], Topic: "job.echo"}, payload); err != nil {
			t.Fatal(err)
		}
		b.waitState(c, ids[i], "SUCCEEDED")
		req, _ := http.NewRequest(http.MethodGet, b.base+"/v1/jobs/"+ids[i]+"/data", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		var d admin.JobData
		if err := json.Unmarshal(raw, &d); err != nil || res.StatusCode != 200 {
			t.Fatalf("%s: %d %s", ids[i], res.StatusCode, raw)
		}
		// The input is the submitter's own; the result is what the policy lets out.
		if strings.Count(string(raw), secret) != 1 || !strings.Contains(d.Input.Pointer, "ctx:") {
			t.Fatalf("%s: the secret should appear once (the input): %s", ids[i], raw)
		}
		res2, _ := json.Marshal(d.Result)
		if d.Result == nil || !d.Result.Redacted || strings.Contains(string(res2), secret) ||
			!strings.Contains(string(res2), "[REDACTED:email]") {
			t.Fatalf("%s: result not redacted: %s", ids[i], res2)
		}
		if i == 0 && !strings.HasSuffix(d.Result.Pointer, jobdata.RedactedSuffix) {
			t.Fatalf("the rule's redaction should have swapped the pointer: %s", d.Result.Pointer)
		}
	}
}

// echoToResult copies each job's input to its result key, as a CAP worker
// that follows the Redis convention writes its result.
func echoToResult(b *bundle) func(context.Context, *capv1.JobRequest) *capv1.JobResult {
	st := &jobdata.Store{Client: b.env.Client}
	return func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		data, err := st.Get(ctx, req.ContextPtr)
		if err != nil {
			return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_FAILED, ErrorMessage: err.Error()}
		}
		ptr, err := st.PutResult(ctx, req.JobId, data)
		if err != nil {
			return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_FAILED, ErrorMessage: err.Error()}
		}
		return &capv1.JobResult{Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, ResultPtr: ptr}
	}
}

func asAPIError(err error, out **admin.APIError) bool {
	ae, ok := err.(*admin.APIError)
	*out = ae
	return ok
}

// A body longer than DataBodyBytes is cut, and says so; its size is the
// whole value's.
func TestJobDataCutsALongBody(t *testing.T) {
	t.Parallel()
	b := setup(t, options{admin: func(c *admin.Config) { c.DataBodyBytes = 8 }})
	ctx := context.Background()
	c := b.client("")
	b.startWorker("w1", echoToResult(b))
	id := b.dataIDs("long")[0]
	if _, err := c.SubmitPayload(ctx, &capv1.JobRequest{JobId: id, Topic: "job.echo"}, []byte(`{"k": "0123456789"}`)); err != nil {
		t.Fatal(err)
	}
	b.waitState(c, id, "SUCCEEDED")
	d, err := c.JobData(ctx, id)
	if err != nil || !d.Input.Truncated || d.Input.Body != `{"k": "0` || d.Input.Size != 19 ||
		d.Input.ContentType != jobdata.TypeJSON {
		t.Fatalf("cut input: %+v %v", d.Input, err)
	}
}

// A retried job's request still points at the original's input: the data
// endpoint follows the retry's link and shows it.
func TestJobDataOfARetryShowsTheOriginalsInput(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := context.Background()
	c := b.client("")
	id := b.dataIDs("lost")[0]
	if _, err := c.SubmitPayload(ctx, &capv1.JobRequest{JobId: id, Topic: "job.unmapped"}, []byte(`{"again": true}`)); err != nil {
		t.Fatal(err)
	}
	b.waitState(c, id, "FAILED")
	entry := ""
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && entry == ""; time.Sleep(20 * time.Millisecond) {
		d, err := c.DLQ(ctx, 50)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range d.Entries {
			if e.JobID == id {
				entry = e.ID
			}
		}
	}
	retried, err := c.RetryDLQ(ctx, entry, false)
	if err != nil {
		t.Fatalf("retry %q: %v", entry, err)
	}
	b.waitState(c, retried.JobID, "FAILED")
	d, err := c.JobData(ctx, retried.JobID)
	if body, _ := json.Marshal(d.Input.Body); err != nil || !d.Input.Held || string(body) != `{"again":true}` {
		t.Fatalf("the retry's input: %+v %v", d.Input, err)
	}
}

// A secret the body's cut would split is still found and redacted: the
// scan reads past the cut.
func TestJobDataRedactsASecretAcrossTheCut(t *testing.T) {
	t.Parallel()
	pol, err := safety.ParseOutputPolicy([]byte(redactPolicy))
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t, options{node: func(c *troupe.Config) { c.Output = pol }, admin: func(c *admin.Config) { c.DataBodyBytes = 20 }})
	ctx := context.Background()
	c := b.client("")
	b.startWorker("w1", echoToResult(b))
	id := b.dataIDs("cut")[0]
	// The address starts at byte 10 and runs past byte 20.
	if _, err := c.SubmitPayload(ctx, &capv1.JobRequest{JobId: id, Topic: "job.echo"}, []byte(`"0123456 alice@example.com and more text"`)); err != nil {
		t.Fatal(err)
	}
	b.waitState(c, id, "SUCCEEDED")
	d, err := c.JobData(ctx, id)
	body, _ := d.Result.Body.(string)
	if err != nil || !d.Result.Redacted || !d.Result.Truncated || strings.Contains(body, "alice") || !strings.Contains(body, "[REDACTED") {
		t.Fatalf("cut result: %+v %v", d.Result, err)
	}
}
