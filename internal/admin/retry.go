package admin

import (
	"net/http"
	"strconv"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// Retry of a finished job, and the attempts a job's detail shows.

// Retried answers POST /v1/jobs/{id}/retry.
type Retried struct {
	JobID   string `json:"job_id"`
	RetryOf string `json:"retry_of"`
}

// retryJob submits a FAILED, TIMEOUT or CANCELLED job again under a new id
// (Node.RetryJob): 201 with the new id; 409 for a job not ended; 422
// for one that ended otherwise.
func (s *Server) retryJob(w http.ResponseWriter, r *http.Request, p principal) error {
	rec, err := s.visibleJob(r, p, r.PathValue("id"))
	if err != nil {
		return err
	}
	newID, err := s.retry(r, p, rec)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/jobs/"+newID)
	writeJSON(w, http.StatusCreated, Retried{JobID: newID, RetryOf: rec.ID})
	return nil
}

// retry retries rec for p (its visibility checked by the caller).
func (s *Server) retry(r *http.Request, p principal, rec *store.JobRecord) (string, error) {
	if !rec.State.Terminal() {
		return "", errConflict("job " + rec.ID + " is " + string(rec.State) + "; only an ended job is retried")
	}
	if !rec.State.Retryable() {
		return "", &apiError{Status: http.StatusUnprocessableEntity, Code: "not_retryable",
			Msg: "job " + rec.ID + " ended " + string(rec.State) + "; only FAILED, TIMEOUT and CANCELLED jobs are retried"}
	}
	newID, err := s.cfg.Node.RetryJob(r.Context(), rec.ID)
	if err != nil && newID == "" {
		return "", err
	}
	s.audit("job retried", "job_id", rec.ID, "new_job_id", newID, "topic", rec.Topic, "by", p.by(), "key_tenant", p.tenant)
	return newID, nil
}

// Attempt is one dispatch of a job and how it ended.
type Attempt struct {
	N            int        `json:"n"`
	Worker       string     `json:"worker,omitempty"`
	DispatchedAt time.Time  `json:"dispatched_at"`
	EndedAt      *time.Time `json:"ended_at,omitempty"`
	// State is where the attempt ended (SCHEDULED: dispatched again;
	// empty: still running), Reason why.
	State  string `json:"state,omitempty"`
	Reason string `json:"reason,omitempty"`
	Error  string `json:"error,omitempty"`
}

// attemptsOf reads a job's attempts from its history: each hop to
// DISPATCHED starts one, the next hop out of DISPATCHED and RUNNING ends
// it. An attempt its retry policy ran again (SCHEDULED retry_wait) names
// its error from the record (te<n>); otherwise the record keeps only the
// latest worker and error, so only the last attempt names them.
func attemptsOf(rec *store.JobRecord) []Attempt {
	out := []Attempt{}
	live := false
	try := 1
	for _, h := range rec.History {
		switch {
		case h.To == jobstate.StateDispatched:
			out = append(out, Attempt{N: len(out) + 1, DispatchedAt: h.At})
			live = true
		case live && h.To != jobstate.StateRunning:
			at := h.At
			a := &out[len(out)-1]
			a.EndedAt, a.State, a.Reason = &at, string(h.To), string(h.Reason)
			if h.Reason == jobstate.ReasonRetryWait {
				a.Error = rec.Fields[jobstate.FieldAttemptErr+strconv.Itoa(try)]
				try++
			}
			live = false
		}
	}
	if n := len(out); n > 0 {
		last := &out[n-1]
		last.Worker = rec.Worker
		if last.EndedAt != nil && last.State != string(jobstate.StateScheduled) {
			last.Error = rec.ErrorMessage
		}
	}
	return out
}
