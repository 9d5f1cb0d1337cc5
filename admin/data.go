package admin

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/core"
	"github.com/troupe-run/troupe/jobdata"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
	"github.com/troupe-run/troupe/saga"
	"github.com/troupe-run/troupe/store"
)

// DataBodyBytesDefault bounds the body of one Datum the API returns; the
// rest is cut (Datum.Truncated).
const DataBodyBytesDefault = 64 << 10

// DataNode is what the job data endpoints need of a node beyond Node
// (*troupe.Node implements it). A node without it serves no job data:
// a submit with a payload is refused and GET /v1/jobs/{id}/data shows
// pointers only.
type DataNode interface {
	JobData() *jobdata.Store
	OutputChecker() safety.OutputChecker
}

// JobData is the body of GET /v1/jobs/{id}/data.
type JobData struct {
	JobID  string `json:"job_id"`
	Input  *Datum `json:"input"`
	Result *Datum `json:"result"`
}

// Datum is a job's input or result: its pointer and, where Troupe holds
// the bytes (the CAP Redis convention's keys of this job, package
// jobdata), its content.
type Datum struct {
	Pointer     string `json:"pointer"`
	Size        int64  `json:"size"`
	ContentType string `json:"content_type,omitempty"`
	// Body is the content: a JSON value when it is JSON (and whole), else a
	// string, base64 for bytes that are not UTF-8 (Encoding "base64").
	Body      any    `json:"body"`
	Encoding  string `json:"encoding,omitempty"`
	Truncated bool   `json:"truncated"`
	// Redacted: the output policy changed or withheld the content shown.
	Redacted bool `json:"redacted"`
	// Held: Troupe has the bytes; false for a pointer to another store (or
	// to another job's data), shown and not read, or for a value that has
	// expired.
	Held bool   `json:"held"`
	Note string `json:"note,omitempty"`
}

func (s *Server) dataNode() DataNode {
	d, _ := s.cfg.Node.(DataNode)
	return d
}

func (s *Server) dataBodyBytes() int64 {
	if s.cfg.DataBodyBytes > 0 {
		return s.cfg.DataBodyBytes
	}
	return DataBodyBytesDefault
}

// splitPayload takes the field "payload" out of a submit body: a JSON
// value is stored as its JSON text, a JSON string is base64 of the bytes.
// rest is the body without it (a CAP JobRequest).
func splitPayload(body []byte) (rest, payload []byte, has bool, err error) {
	if !bytes.Contains(body, []byte(`"payload"`)) {
		return body, nil, false, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return body, nil, false, nil // protojson reports it
	}
	raw, ok := fields["payload"]
	if !ok {
		return body, nil, false, nil
	}
	delete(fields, "payload")
	if rest, err = json.Marshal(fields); err != nil {
		return nil, nil, false, err
	}
	raw = bytes.TrimSpace(raw)
	switch {
	case bytes.Equal(raw, []byte("null")):
		return rest, nil, false, nil
	case len(raw) > 0 && raw[0] == '"':
		var b64 string
		if err := json.Unmarshal(raw, &b64); err != nil {
			return nil, nil, false, errBadRequest("payload: " + err.Error())
		}
		if payload, err = base64.StdEncoding.DecodeString(b64); err != nil {
			return nil, nil, false, errBadRequest("payload: a string payload is base64 of the bytes: " + err.Error())
		}
		return rest, payload, true, nil
	}
	return rest, raw, true, nil
}

// storePayload stores a submit's payload as the job's input and points
// the request at it.
func (s *Server) storePayload(ctx context.Context, req *capv1.JobRequest, payload []byte) error {
	if req.ContextPtr != "" {
		return errBadRequest("give payload or context_ptr, not both (the payload's pointer is the context_ptr)")
	}
	dn := s.dataNode()
	if dn == nil {
		return errBadRequest("this node keeps no job data: give context_ptr")
	}
	st := dn.JobData()
	st.MaxBytes = s.cfg.MaxPayloadBytes
	ptr, err := st.PutInput(ctx, req.JobId, payload)
	if errors.Is(err, jobdata.ErrTooLarge) {
		return &apiError{Status: http.StatusRequestEntityTooLarge, Code: "payload_too_large", Msg: err.Error()}
	}
	if err != nil {
		return err
	}
	req.ContextPtr = ptr
	return nil
}

// jobData serves GET /v1/jobs/{id}/data: the job's input and result,
// read where Troupe holds them, the result as the output policy lets it
// be seen.
func (s *Server) jobData(w http.ResponseWriter, r *http.Request, p principal) error {
	id := r.PathValue("id")
	rec, err := s.visibleJob(r, p, id)
	if errors.Is(err, store.ErrNotFound) {
		// No record: a job waiting for room within its capacity grace
		// shows its input where a submit with a payload put it.
		if wj, werr := s.cfg.Node.WaitingJob(r.Context(), id); werr == nil && wj != nil && p.sees(wj.Tenant) {
			out := JobData{JobID: id, Input: s.datum(r.Context(), jobdata.InputPointer(id), true)}
			if out.Input.Size == 0 && !out.Input.Held {
				out.Input = nil
			}
			writeJSON(w, http.StatusOK, out)
			return nil
		}
	}
	if err != nil {
		return err
	}
	req := &capv1.JobRequest{}
	if len(rec.Request) > 0 {
		_ = proto.Unmarshal(rec.Request, req)
	}
	out := JobData{JobID: rec.ID}
	if ptr := req.GetContextPtr(); ptr != "" {
		out.Input = s.datum(r.Context(), ptr, s.owns(r, p, rec.ID, req, ptr))
	}
	if ptr := rec.ResultPtr; ptr != "" {
		out.Result = s.resultDatum(r.Context(), rec, req, ptr, s.owns(r, p, rec.ID, req, ptr))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// owns reports whether ptr names data of job id — or, for a saga's
// compensation job, of the step it compensates, which the principal must
// see too — so that a request pointing at another job's data shows the
// pointer only.
func (s *Server) owns(r *http.Request, p principal, id string, req *capv1.JobRequest, ptr string) bool {
	if jobdata.OwnedBy(ptr, id) {
		return true
	}
	parent := req.GetParentJobId()
	if parent == "" || req.GetLabels()[saga.LabelIsCompensation] == "" || !jobdata.OwnedBy(ptr, parent) {
		return false
	}
	_, err := s.visibleJob(r, p, parent)
	return err == nil
}

// datum reads ptr's content when held, at most DataBodyBytes of it.
func (s *Server) datum(ctx context.Context, ptr string, held bool) *Datum {
	d := &Datum{Pointer: ptr}
	dn := s.dataNode()
	if !held || dn == nil {
		return d
	}
	data, size, err := dn.JobData().Read(ctx, ptr, s.dataBodyBytes())
	switch {
	case errors.Is(err, jobdata.ErrMissing):
		d.Note = "nothing stored under the pointer (never written, or expired)"
		return d
	case err != nil:
		d.Note = "could not be read: " + err.Error()
		return d
	}
	d.Held, d.Size = true, size
	d.setBody(data, size > int64(len(data)))
	return d
}

// setBody fills the body from data (truncated: data is a prefix of the
// value, shown as text: cut JSON no longer parses).
func (d *Datum) setBody(data []byte, truncated bool) {
	d.Truncated = truncated
	d.ContentType = jobdata.ContentType(data)
	if truncated {
		// A rune cut in two at the end is dropped, if that is all that
		// keeps the prefix from being UTF-8.
		cut := data
		for i := 0; i < utf8.UTFMax-1 && len(cut) > 0 && !utf8.Valid(cut); i++ {
			cut = cut[:len(cut)-1]
		}
		if utf8.Valid(cut) {
			data = cut
			d.ContentType = jobdata.TypeText
			if t := bytes.TrimSpace(data); len(t) > 0 && (t[0] == '{' || t[0] == '[') {
				d.ContentType = jobdata.TypeJSON
			}
		}
	}
	switch {
	case !truncated && d.ContentType == jobdata.TypeJSON:
		d.Body = json.RawMessage(data)
	case utf8.Valid(data):
		d.Body = string(data)
	default:
		d.ContentType = jobdata.TypeBinary
		d.Body, d.Encoding = base64.StdEncoding.EncodeToString(data), "base64"
	}
}

// resultDatum is the result as the output policy lets it be seen: a
// quarantined result is withheld; a copy the policy redacted when the job
// ended is shown as it is; any other is scanned now, as the policy would
// scan it, and shown redacted, or withheld, when the scan says so.
func (s *Server) resultDatum(ctx context.Context, rec *store.JobRecord, req *capv1.JobRequest, ptr string, held bool) *Datum {
	if rec.State == core.StateOutputQuarantined {
		return &Datum{Pointer: ptr, Held: held, Redacted: true, Note: "withheld: the output policy quarantined this result"}
	}
	d := s.datum(ctx, ptr, held)
	if !d.Held {
		return d
	}
	if strings.HasSuffix(ptr, jobdata.RedactedSuffix) {
		d.Redacted = true
		return d
	}
	dn := s.dataNode()
	checker := dn.OutputChecker()
	if checker == nil {
		return d
	}
	if r, ok := checker.(interface{ ReadsContentItself() bool }); ok && r.ReadsContentItself() {
		return withheld(d, "withheld: the output policy's checker reads content itself and was not asked")
	}
	data, size, err := dn.JobData().Read(ctx, ptr, s.dataBodyBytes())
	if err != nil {
		return withheld(d, "withheld: could not be read for the output policy")
	}
	oreq := safety.OutputRequest(req, &capv1.JobResult{JobId: rec.ID, Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED,
		ResultPtr: ptr, WorkerId: rec.Worker, ErrorCode: rec.ErrorCode, ErrorMessage: rec.ErrorMessage})
	v, err := checker.ScanContent(ctx, oreq, data)
	if err != nil {
		return withheld(d, "withheld: the output policy's scan failed")
	}
	switch v.Decision {
	case capv1.OutputDecision_OUTPUT_DECISION_ALLOW:
		return d
	case capv1.OutputDecision_OUTPUT_DECISION_REDACT:
		if v.Redacted != nil {
			d.setBody(v.Redacted, size > int64(len(data)))
			d.Redacted = true
			d.Note = "redacted by the output policy (" + v.RuleID + ")"
			return d
		}
	}
	return withheld(d, "withheld by the output policy ("+safety.OutputDecisionName(v.Decision)+", "+v.RuleID+")")
}

func withheld(d *Datum, note string) *Datum {
	d.Body, d.Encoding, d.ContentType, d.Redacted, d.Note = nil, "", "", true, note
	return d
}

// SubmitPayload submits req with payload as its input: JSON text is sent
// as a JSON value, anything else as base64. The node stores it and sets
// the request's context_ptr.
func (c *Client) SubmitPayload(ctx context.Context, req *capv1.JobRequest, payload []byte) (Submitted, error) {
	body, err := protojson.Marshal(req)
	if err != nil {
		return Submitted{}, err
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return Submitted{}, err
	}
	if json.Valid(payload) && !bytes.HasPrefix(bytes.TrimSpace(payload), []byte(`"`)) {
		fields["payload"] = json.RawMessage(payload)
	} else {
		b64, _ := json.Marshal(base64.StdEncoding.EncodeToString(payload))
		fields["payload"] = b64
	}
	if body, err = json.Marshal(fields); err != nil {
		return Submitted{}, err
	}
	var out Submitted
	err = c.do(ctx, http.MethodPost, "/v1/jobs", body, &out)
	return out, err
}

// JobData reads a job's input and result (GET /v1/jobs/{id}/data).
func (c *Client) JobData(ctx context.Context, id string) (JobData, error) {
	var out JobData
	err := c.do(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(id)+"/data", nil, &out)
	return out, err
}
