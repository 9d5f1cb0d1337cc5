package admin

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/intake"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/jobtrace"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// submitJob publishes a CAP JobRequest given as JSON (protojson: job_id,
// topic, tenant_id, labels, ... — snake_case or lowerCamel). A tenant key's
// jobs belong to its tenant whatever the body says; a body naming another
// tenant is refused rather than silently rewritten. A field "payload"
// beside the request's (a JSON value, or a base64 string of bytes) is
// stored as the job's input and becomes its context_ptr (data.go).
func (s *Server) submitJob(w http.ResponseWriter, r *http.Request, p principal) error {
	data, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	data, payload, err := splitPayload(data) // data.go
	if err != nil {
		return err
	}
	req := &capv1.JobRequest{}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(data, req); err != nil {
		return errBadRequest("body is not a CAP JobRequest: " + err.Error())
	}
	if !p.all() {
		if req.TenantId != "" && req.TenantId != p.tenant {
			return errForbidden("this key submits for tenant " + p.tenant + " only")
		}
		req.TenantId = p.tenant
	}
	// Who submitted, for the self-approval check: the authenticated
	// principal, whatever the body's labels say.
	if req.Labels == nil {
		req.Labels = map[string]string{}
	}
	req.Labels[SubmittedByLabel] = p.by()
	if req.JobId == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		req.JobId = "job-" + hex.EncodeToString(b[:])
	}
	if err := intake.ValidateRequest(req); err != nil {
		return errBadRequest(err.Error())
	}
	out := Submitted{JobID: req.JobId, Tenant: safety.TenantOf(req)}
	rec, err := s.cfg.Node.Job(r.Context(), req.JobId)
	switch {
	case err == nil && !p.sees(rec.Tenant):
		// The id is taken by a job this key may not see. Saying so
		// reveals that the id exists, which is unavoidable: ids are global.
		return errConflict("job id " + req.JobId + " is in use")
	case err == nil:
		out.Duplicate, out.State, out.Tenant = true, string(rec.State), rec.Tenant
	case !errors.Is(err, store.ErrNotFound):
		return err
	}
	if !out.Duplicate {
		if err := s.storePayloads(r.Context(), req, payload); err != nil { // data.go
			return err
		}
	}
	if err := s.cfg.Node.Submit(r.Context(), req); err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/jobs/"+req.JobId)
	writeJSON(w, http.StatusAccepted, out)
	return nil
}

// visibleJob reads a job and hides it from a key of another tenant: to
// that key the job does not exist.
func (s *Server) visibleJob(r *http.Request, p principal, id string) (*store.JobRecord, error) {
	rec, err := s.cfg.Node.Job(r.Context(), id)
	if err != nil {
		return nil, err
	}
	if !p.sees(rec.Tenant) {
		return nil, store.ErrNotFound
	}
	return rec, nil
}

func (s *Server) getJob(w http.ResponseWriter, r *http.Request, p principal) error {
	rec, err := s.visibleJob(r, p, r.PathValue("id"))
	if errors.Is(err, store.ErrNotFound) {
		// No record: the job may wait for room within its capacity grace,
		// in a node's memory, its submit held in the stream.
		if wj, werr := s.cfg.Node.WaitingJob(r.Context(), r.PathValue("id")); werr == nil && wj != nil && p.sees(wj.Tenant) {
			writeJSON(w, http.StatusOK, waitingView(wj))
			return nil
		}
		// Or it is delayed: held in Redis until its time (schedules.go).
		if d := s.delayedJob(r.Context(), p, r.PathValue("id")); d != nil {
			writeJSON(w, http.StatusOK, delayedView(d))
			return nil
		}
	}
	if err != nil {
		return err
	}
	links, err := s.cfg.Node.JobLinks(r.Context(), rec.ID)
	if err != nil {
		return err
	}
	v := jobView(rec, links)
	if rec.State == jobstate.StateScheduled {
		// Best effort: the owner may be unreachable; the job is shown anyway.
		if pos, err := s.cfg.Node.QueuePosition(r.Context(), rec.ID); err == nil && pos >= 0 {
			v.QueuePosition = &pos
		}
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

// SubmittedByLabel is the label the API sets on every job it submits to
// the principal that submitted it (a body's own value is replaced), so an
// approval can tell a submitter from a second reviewer. Labels under
// approval_ constrain no placement and are left out of the job hash.
const SubmittedByLabel = "approval_submitted_by"

// waitingCursor starts the cursor of a page of jobs waiting with no record
// (no store cursor starts so).
const waitingCursor = "waiting:"

// listWaiting puts the page of jobs waiting with no record that lq's cursor
// asks for into out. full: the page is full of them, and next continues
// it; otherwise lq is set for the records that fill the rest of the page
// (from their first). A cursor of the records' own is left to them.
func (s *Server) listWaiting(r *http.Request, lq *store.ListQuery, out *JobList, m *jobMatch) (full bool, next string, err error) {
	skip := 0
	switch {
	case lq.Cursor == "":
	case strings.HasPrefix(lq.Cursor, waitingCursor):
		skip, err = strconv.Atoi(strings.TrimPrefix(lq.Cursor, waitingCursor))
		if err != nil || skip < 0 {
			return false, "", errBadRequest("cursor is not one this API gave")
		}
		lq.Cursor = ""
	default:
		return false, "", nil
	}
	limit := lq.Limit
	if limit <= 0 {
		limit = store.ListLimitDefault
	}
	ws, err := s.cfg.Node.WaitingJobs(r.Context(), lq.Tenant, skip+limit+1)
	if err != nil {
		ws = nil // best effort: the nodes' memory, the records are listed anyway
	}
	ws = slices.DeleteFunc(ws, func(w router.Waiting) bool {
		// No worker yet: a worker filter leaves them out.
		return !m.keeps(&store.JobSummary{ID: w.JobID, State: jobstate.StateScheduled, Topic: w.Topic, Tenant: w.Tenant,
			Created: w.Since}, w.Labels)
	})
	ws = ws[min(skip, len(ws)):]
	more := len(ws) > limit
	ws = ws[:min(limit, len(ws))]
	for _, w := range ws {
		out.Jobs = append(out.Jobs, JobSummary{ID: w.JobID, State: string(jobstate.StateScheduled), Topic: w.Topic,
			Tenant: w.Tenant, Reason: string(w.Reason), Created: w.Since, Updated: w.Since, Unwritten: true,
			Labels: w.Labels})
	}
	if more || len(ws) == limit {
		return true, waitingCursor + strconv.Itoa(skip+len(ws)), nil
	}
	lq.Limit = limit - len(ws)
	return false, "", nil
}

// actionBody is the optional body of approve, reject and cancel.
type actionBody struct {
	Reason string `json:"reason"`
	// By may only repeat the principal's own name (approve, reject): the
	// approver is whoever the key belongs to, never what the body says.
	// A cancel records it as given.
	By string `json:"by"`
	// Hash is the job hash the approver reviewed (approve, reject); empty
	// takes the hash of the job's stored request.
	Hash string `json:"hash"`
}

// decideJob records an operator's approval or rejection. The decision is
// the principal's, the first one stands, and the hash recorded with it is
// the one computed from the stored request (so what was approved is what
// runs).
func (s *Server) decideJob(d store.Decision) apiHandler {
	return func(w http.ResponseWriter, r *http.Request, p principal) error {
		var body actionBody
		if err := readJSON(r, &body); err != nil {
			return err
		}
		if body.By != "" && body.By != p.by() {
			s.refused.WithLabelValues(RefusedBodyNamesAnother).Inc()
			return errForbidden("the decision is recorded as " + p.by() + ", the key's principal; body field by names someone else")
		}
		rec, err := s.visibleJob(r, p, r.PathValue("id"))
		if err != nil {
			return err
		}
		if !s.keys.empty() && !s.cfg.AllowSelfApproval && submittedBy(rec, p.by()) {
			s.refused.WithLabelValues(RefusedSelfApproval).Inc()
			return errForbidden("a principal cannot decide on a job it submitted")
		}
		hash, err := computedHash(rec)
		if err != nil {
			return err
		}
		if body.Hash != "" && body.Hash != hash {
			s.refused.WithLabelValues(RefusedHashMismatch).Inc()
			return errConflict("hash " + body.Hash + " is not the job's (" + hash + ")")
		}
		err = s.cfg.Node.Decide(r.Context(), rec.ID, d, p.by(), body.Reason, hash)
		switch {
		case errors.Is(err, store.ErrAlreadyDecided):
			s.refused.WithLabelValues(RefusedAlreadyDecided).Inc()
			return err
		case errors.Is(err, store.ErrHashMismatch), errors.Is(err, store.ErrNoJobHash):
			s.refused.WithLabelValues(RefusedHashMismatch).Inc()
			return err
		case err != nil:
			return err
		}
		s.audit("job "+string(d), "job_id", rec.ID, "trace_id", rec.TraceID, "topic", rec.Topic, "by", p.by(),
			"key_tenant", p.tenant)
		writeJSON(w, http.StatusAccepted, Accepted{JobID: rec.ID, Action: string(d),
			Note: "recorded; a node resumes the job within a few seconds"})
		return nil
	}
}

// submittedBy reports whether name submitted rec: the label the API set,
// or the request's principal_id.
func submittedBy(rec *store.JobRecord, name string) bool {
	req := &capv1.JobRequest{}
	if len(rec.Request) == 0 || proto.Unmarshal(rec.Request, req) != nil {
		return false
	}
	return req.Labels[SubmittedByLabel] == name || req.PrincipalId == name
}

// computedHash is the hash of the job's stored request, checked against
// the hash recorded when approval was requested: a record whose request
// no longer hashes to it changed after the review was asked for.
func computedHash(rec *store.JobRecord) (string, error) {
	recorded := rec.Fields["job_hash"]
	req := &capv1.JobRequest{}
	if len(rec.Request) == 0 || proto.Unmarshal(rec.Request, req) != nil {
		if recorded == "" {
			return "", store.ErrNoJobHash
		}
		return recorded, nil
	}
	h := safety.HashJobRequest(req)
	if recorded != "" && recorded != h {
		return "", fmt.Errorf("%w (recorded %s, request hashes to %s)", store.ErrHashMismatch, recorded, h)
	}
	return h, nil
}

func (s *Server) cancelJob(w http.ResponseWriter, r *http.Request, p principal) error {
	var body actionBody
	if err := readJSON(r, &body); err != nil {
		return err
	}
	if body.By == "" {
		body.By = p.by()
	}
	if body.Reason == "" {
		body.Reason = "cancelled through the admin API"
	}
	id := r.PathValue("id")
	rec, err := s.cancellable(r, p, id)
	if errors.Is(err, store.ErrNotFound) {
		// A delayed job not yet due is removed: it never runs
		// (schedules.go). One taken to be submitted is cancelled as below.
		if done, err := s.cancelDelayed(w, r, p, id, body.By); done || err != nil {
			return err
		}
		// No record and waiting on no node: the submit may still be held
		// in the stream (taken by no node yet). The cancel is recorded, for
		// this key's tenant only, and the job is created CANCELLED when a
		// node takes it; a job that got its record meanwhile is cancelled
		// the usual way.
		tenant := p.tenant
		if p.all() {
			tenant = store.AnyTenant
		}
		err = s.cfg.Node.MarkCancel(r.Context(), id, []string{tenant}, body.By, body.Reason)
		if err == nil {
			s.audit("job cancel recorded before admission", "job_id", id, "by", body.By, "key_tenant", p.tenant)
			writeJSON(w, http.StatusAccepted, Accepted{JobID: id, Action: "cancel", Note: CancelRecordedNote})
			return nil
		}
		if !errors.Is(err, store.ErrJobExists) {
			return err
		}
		rec, err = s.cancellable(r, p, id)
	}
	if err != nil {
		return err
	}
	if rec.State.Terminal() {
		return errConflict("job " + rec.ID + " is already " + string(rec.State))
	}
	if err := s.cfg.Node.Cancel(r.Context(), rec.ID, body.Reason, body.By); err != nil {
		return err
	}
	s.audit("job cancel requested", "job_id", rec.ID, "trace_id", rec.TraceID, "topic", rec.Topic, "by", body.By,
		"key_tenant", p.tenant)
	writeJSON(w, http.StatusAccepted, Accepted{JobID: rec.ID, Action: "cancel", Note: "cancel published"})
	return nil
}

// CancelRecordedNote is the note of a cancel's answer for a job with no
// record that waits on no node: its submit, if it comes, is still held in
// the stream; the job is created CANCELLED when a node takes it.
const CancelRecordedNote = "cancel recorded; takes effect when admitted"

// cancellable finds the job a cancel names: its record, or a job waiting
// for room with no record yet (the node holding it takes the cancel).
// store.ErrNotFound: neither, or not one p may see.
func (s *Server) cancellable(r *http.Request, p principal, id string) (*store.JobRecord, error) {
	rec, err := s.visibleJob(r, p, id)
	if !errors.Is(err, store.ErrNotFound) {
		return rec, err
	}
	wj, werr := s.cfg.Node.WaitingJob(r.Context(), id)
	if werr == nil && wj != nil && p.sees(wj.Tenant) {
		return &store.JobRecord{ID: wj.JobID, Topic: wj.Topic, Tenant: wj.Tenant, State: jobstate.StateScheduled}, nil
	}
	return nil, err
}

func (s *Server) jobTrace(w http.ResponseWriter, r *http.Request, p principal) error {
	rec, err := s.visibleJob(r, p, r.PathValue("id"))
	if err != nil {
		return err
	}
	es, err := s.cfg.Node.JobTrace(r.Context(), rec.ID)
	if err != nil {
		return err
	}
	out := Trace{JobID: rec.ID, Tracing: s.cfg.Node.JobTraceEnabled(), Entries: es}
	if out.Entries == nil {
		out.Entries = []jobtrace.Entry{}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
