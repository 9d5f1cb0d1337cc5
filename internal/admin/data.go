package admin

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/jobdata"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/outputgate"
	"github.com/troupe-run/troupe/internal/saga"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
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

// Body fields of a submit beside the CAP JobRequest's: data Troupe stores
// and points the request at.
const (
	// PayloadField is the job's input (its context_ptr).
	PayloadField = "payload"
	// CompensationPayloadField is the input of the job's compensation
	// (compensation.context_ptr), when it is a workflow step with one.
	CompensationPayloadField = "compensation_payload"
)

// payloads are the data fields taken out of a submit body.
type payloads struct {
	input, comp       []byte
	hasInput, hasComp bool
}

// splitPayload takes the data fields out of a submit body: a JSON value is
// stored as its JSON text, a JSON string is base64 of the bytes. rest is
// the body without them (a CAP JobRequest).
func splitPayload(body []byte) (rest []byte, p payloads, err error) {
	if !bytes.Contains(body, []byte(`"`+PayloadField)) && !bytes.Contains(body, []byte(`"`+CompensationPayloadField)) {
		return body, p, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		return body, p, nil // protojson reports it
	}
	if p.input, p.hasInput, err = takePayload(fields, PayloadField); err != nil {
		return nil, p, err
	}
	if p.comp, p.hasComp, err = takePayload(fields, CompensationPayloadField); err != nil {
		return nil, p, err
	}
	rest, err = json.Marshal(fields)
	return rest, p, err
}

func takePayload(fields map[string]json.RawMessage, name string) ([]byte, bool, error) {
	raw, ok := fields[name]
	if !ok {
		return nil, false, nil
	}
	delete(fields, name)
	raw = bytes.TrimSpace(raw)
	switch {
	case bytes.Equal(raw, []byte("null")):
		return nil, false, nil
	case len(raw) > 0 && raw[0] == '"':
		var b64 string
		if err := json.Unmarshal(raw, &b64); err != nil {
			return nil, false, errBadRequest(name + ": " + err.Error())
		}
		data, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return nil, false, errBadRequest(name + ": a string is base64 of the bytes: " + err.Error())
		}
		return data, true, nil
	}
	return raw, true, nil
}

// storePayloads stores a submit's data and points the request at it.
func (s *Server) storePayloads(ctx context.Context, req *capv1.JobRequest, p payloads) error {
	if !p.hasInput && !p.hasComp {
		return nil
	}
	if p.hasInput && req.ContextPtr != "" {
		return errBadRequest("give payload or context_ptr, not both (the payload's pointer is the context_ptr)")
	}
	if p.hasComp && (req.GetCompensation() == nil || req.WorkflowId == "") {
		return errBadRequest("compensation_payload needs a compensation and a workflow_id")
	}
	if p.hasComp && req.Compensation.ContextPtr != "" {
		return errBadRequest("give compensation_payload or compensation.context_ptr, not both")
	}
	dn := s.dataNode()
	if dn == nil {
		return errBadRequest("this node keeps no job data: give context_ptr")
	}
	st := dn.JobData()
	st.MaxBytes = s.cfg.MaxPayloadBytes
	if st.MaxBytes <= 0 {
		st.MaxBytes = jobdata.MaxBytesDefault
	}
	// Both sizes first: nothing is stored for a submit that is refused.
	for _, data := range [][]byte{p.input, p.comp} {
		if n := int64(len(data)); n > st.MaxBytes {
			return &apiError{Status: http.StatusRequestEntityTooLarge, Code: "payload_too_large",
				Msg: fmt.Sprintf("payload of %d bytes; at most %d are stored (--max-payload)", n, st.MaxBytes)}
		}
	}
	put := func(ptr string, data []byte) error { return st.Put(ctx, ptr, data) }
	if p.hasComp {
		ptr := jobdata.CompensationPointer(req.JobId)
		if err := put(ptr, p.comp); err != nil {
			return err
		}
		req.Compensation.ContextPtr = ptr
	}
	if p.hasInput {
		ptr := jobdata.InputPointer(req.JobId)
		if err := put(ptr, p.input); err != nil {
			return err
		}
		req.ContextPtr = ptr
	}
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

// dataHops bounds how far owns follows a job's origin (a retry of a
// retry of a compensation ...).
const dataHops = 8

// owns reports whether ptr names data of job id, or of the job it came
// from — the step a saga's compensation undoes, the job a retry repeats
// (label retry_of, or a DLQ retry's link), and so on — each of which the
// principal must see too; so a request pointing at another job's data
// shows the pointer only.
func (s *Server) owns(r *http.Request, p principal, id string, req *capv1.JobRequest, ptr string) bool {
	for hop := 0; ; hop++ {
		if jobdata.OwnedBy(ptr, id) {
			return true
		}
		next := s.origin(r, id, req)
		if next == "" || hop == dataHops {
			return false
		}
		rec, err := s.visibleJob(r, p, next)
		if err != nil {
			return false
		}
		id, req = rec.ID, &capv1.JobRequest{}
		if len(rec.Request) > 0 {
			_ = proto.Unmarshal(rec.Request, req)
		}
	}
}

// origin is the job whose data job id may point at: a compensation's
// step, a retry's original ("" for none).
func (s *Server) origin(r *http.Request, id string, req *capv1.JobRequest) string {
	if req.GetLabels()[saga.LabelIsCompensation] != "" && req.GetParentJobId() != "" {
		return req.GetParentJobId()
	}
	if o := req.GetLabels()[retryOfLabel]; o != "" && o != id {
		return o
	}
	if links, err := s.cfg.Node.JobLinks(r.Context(), id); err == nil && links.RetryOf != id {
		return links.RetryOf
	}
	return ""
}

// retryOfLabel is the label a retried job carries, naming the job it
// repeats.
const retryOfLabel = "retry_of"

// datum reads ptr's content when held, at most DataBodyBytes of it.
func (s *Server) datum(ctx context.Context, ptr string, held bool) *Datum {
	d, _ := s.readDatum(ctx, ptr, held)
	return d
}

// readDatum is datum, and the bytes read.
func (s *Server) readDatum(ctx context.Context, ptr string, held bool) (*Datum, []byte) {
	d := &Datum{Pointer: ptr}
	dn := s.dataNode()
	if !held || dn == nil {
		return d, nil
	}
	// A little past what is shown, so that the output policy's scan sees
	// a finding the cut would split (resultDatum).
	data, size, err := dn.JobData().Read(ctx, ptr, s.dataBodyBytes()+scanOverlap)
	switch {
	case errors.Is(err, jobdata.ErrMissing):
		d.Note = "nothing stored under the pointer (never written, or expired)"
		return d, nil
	case err != nil:
		d.Note = "could not be read: " + err.Error()
		return d, nil
	}
	d.Held, d.Size = true, size
	shown, cut := s.cut(data)
	d.setBody(shown, cut || size > int64(len(data)))
	return d, data
}

// scanOverlap is how far past the shown body a result is read and scanned.
const scanOverlap = 512

// cut returns data as shown: at most DataBodyBytes, and whether it is cut.
func (s *Server) cut(data []byte) ([]byte, bool) {
	if n := s.dataBodyBytes(); int64(len(data)) > n {
		return data[:n], true
	}
	return data, false
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
	if rec.State == jobstate.StateOutputQuarantined {
		return &Datum{Pointer: ptr, Held: held, Redacted: true, Note: "withheld: the output policy quarantined this result"}
	}
	d, data := s.readDatum(ctx, ptr, held)
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
	oreq := outputgate.Request(req, &capv1.JobResult{JobId: rec.ID, Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED,
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
			red, cut := s.cut(v.Redacted)
			d.setBody(red, cut || d.Size > int64(len(data)))
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

// SubmitWithData submits req with input as its payload and compensation
// as its compensation's (each left out when nil).
func (c *Client) SubmitWithData(ctx context.Context, req *capv1.JobRequest, input, compensation []byte) (Submitted, error) {
	body, err := protojson.Marshal(req)
	if err != nil {
		return Submitted{}, err
	}
	// The payload goes in as given (a JSON value is not re-encoded, so the
	// bytes stored are the bytes sent).
	body = bytes.TrimSuffix(bytes.TrimSpace(body), []byte("}"))
	for _, f := range []struct {
		name string
		data []byte
	}{{PayloadField, input}, {CompensationPayloadField, compensation}} {
		if f.data == nil {
			continue
		}
		if len(bytes.TrimSpace(body)) > 1 {
			body = append(body, ',')
		}
		body = append(body, `"`+f.name+`":`...)
		if json.Valid(f.data) && !bytes.HasPrefix(bytes.TrimSpace(f.data), []byte(`"`)) {
			body = append(body, f.data...)
		} else {
			b64, _ := json.Marshal(base64.StdEncoding.EncodeToString(f.data))
			body = append(body, b64...)
		}
	}
	body = append(body, '}')
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
