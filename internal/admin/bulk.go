package admin

import (
	"net/http"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/store"
)

// Bulk actions: cancel or retry the jobs a JobFilter selects (POST
// /v1/jobs/bulk), bounded in jobs and in the listing it walks.

// Bulk limits.
const (
	// BulkLimitMax caps the jobs one bulk action touches.
	BulkLimitMax = 1000
	// bulkPages bounds the listing pages one bulk action reads (each a
	// bounded scan, see search.go); past it the answer says truncated.
	bulkPages = 16
)

// BulkRequest is the body of POST /v1/jobs/bulk.
type BulkRequest struct {
	Action string    `json:"action"` // cancel or retry
	Filter JobFilter `json:"filter"`
	// Limit caps the matched jobs acted on (default and at most
	// BulkLimitMax).
	Limit  int    `json:"limit,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// BulkResult answers POST /v1/jobs/bulk.
type BulkResult struct {
	Matched int          `json:"matched"`
	Done    int          `json:"done"`
	Failed  []BulkFailed `json:"failed"`
	// Truncated: the filter may match more jobs than were acted on (the
	// limit or the scan bound was reached); run it again for the rest.
	Truncated bool `json:"truncated"`
	// Jobs created by a retry, by the job each retries.
	Retried map[string]string `json:"retried,omitempty"`
}

// BulkFailed is a matched job the action did not apply to, and why.
type BulkFailed struct {
	JobID string `json:"job_id"`
	Error string `json:"error"`
}

// bulkJobs serves POST /v1/jobs/bulk. A tenant key acts on its tenant's
// jobs only (the filter is narrowed to it); each job is cancelled or
// retried as the single-job endpoints do, and one that cannot be (already
// ended, not retryable) is listed in failed.
func (s *Server) bulkJobs(w http.ResponseWriter, r *http.Request, p principal) error {
	var body BulkRequest
	if err := readJSON(r, &body); err != nil {
		return err
	}
	if body.Action != "cancel" && body.Action != "retry" {
		return errBadRequest(`action must be "cancel" or "retry"`)
	}
	if body.Limit < 0 || body.Limit > BulkLimitMax {
		return errBadRequest("limit must be from 1 to 1000")
	}
	if body.Limit == 0 {
		body.Limit = BulkLimitMax
	}
	m, err := body.Filter.compile(p)
	if err != nil {
		return err
	}
	ids, truncated, err := s.bulkMatch(r, m, body.Limit)
	if err != nil {
		return err
	}
	out := BulkResult{Matched: len(ids), Failed: []BulkFailed{}, Truncated: truncated}
	for _, j := range ids {
		newID, err := s.bulkOne(r, p, body, j)
		if err != nil {
			out.Failed = append(out.Failed, BulkFailed{JobID: j.ID, Error: err.Error()})
			continue
		}
		out.Done++
		if newID != "" {
			if out.Retried == nil {
				out.Retried = map[string]string{}
			}
			out.Retried[j.ID] = newID
		}
	}
	s.audit("bulk "+body.Action, "matched", out.Matched, "done", out.Done, "failed", len(out.Failed),
		"filter", body.Filter, "by", p.by(), "key_tenant", p.tenant)
	writeJSON(w, http.StatusOK, out)
	return nil
}

// bulkMatch lists up to limit jobs matching m: those waiting with no
// record first (a cancel reaches them too), then the records, newest
// update first, within bulkPages listing pages.
func (s *Server) bulkMatch(r *http.Request, m *jobMatch, limit int) ([]store.JobSummary, bool, error) {
	var out []store.JobSummary
	if m.state == "" || m.state == jobstate.StateScheduled {
		ws, err := s.cfg.Node.WaitingJobs(r.Context(), m.tenant, limit+1)
		if err == nil {
			for _, w := range ws {
				sum := waitingSummary(w)
				if m.keeps(&sum, nil) {
					out = append(out, sum)
				}
			}
		}
		// Then the delayed jobs, soonest first (schedules.go).
		out = append(out, s.delayedSummaries(r, m, limit+1-len(out))...)
		if len(out) > limit {
			return out[:limit], true, nil
		}
	}
	cursor := ""
	for range bulkPages {
		page, err := s.cfg.Node.ListJobs(r.Context(), m.query(min(limit-len(out), store.ListLimitMax), cursor))
		if err != nil {
			return nil, false, err
		}
		out = append(out, page.Jobs...)
		if page.Next == "" {
			return out, false, nil
		}
		if len(out) >= limit {
			return out[:limit], true, nil
		}
		cursor = page.Next
	}
	return out, true, nil
}

// waitingSummary is a job waiting with no record, as a listing line.
func waitingSummary(w router.Waiting) store.JobSummary {
	return store.JobSummary{ID: w.JobID, State: jobstate.StateScheduled, Topic: w.Topic, Tenant: w.Tenant,
		Reason: w.Reason, Created: w.Since, Updated: w.Since}
}

// bulkOne applies the action to one matched job; a retry returns the new
// job's id.
func (s *Server) bulkOne(r *http.Request, p principal, body BulkRequest, j store.JobSummary) (string, error) {
	if !p.sees(j.Tenant) {
		return "", store.ErrNotFound
	}
	if body.Action == "cancel" {
		if j.State.Terminal() {
			return "", errConflict("job " + j.ID + " is already " + string(j.State))
		}
		reason := body.Reason
		if reason == "" {
			reason = "cancelled in bulk through the admin API"
		}
		if j.Reason == DelayedReason && s.removeDelayed(r.Context(), j.ID) {
			return "", nil
		}
		if err := s.cfg.Node.Cancel(r.Context(), j.ID, reason, p.by()); err != nil {
			return "", err
		}
		return "", nil
	}
	rec, err := s.visibleJob(r, p, j.ID)
	if err != nil {
		return "", err
	}
	return s.retry(r, p, rec)
}
