package admin

import (
	"net/http"
	"strconv"
	"time"

	"github.com/troupe-run/troupe/internal/saga"
)

// The list of sagas (GET /v1/sagas); GET /v1/sagas/{id} gives one's detail.

// SagaSummary is one line of GET /v1/sagas.
type SagaSummary struct {
	ID string `json:"id"`
	// State: "recorded" (steps with compensations, no rollback), "triggered"
	// (a rollback is due), or the rollback's status (running, completed,
	// completed_with_skips, failed).
	State     string    `json:"state"`
	Steps     int       `json:"steps"`
	UpdatedAt time.Time `json:"updated_at"`
}

// SagaList is GET /v1/sagas.
type SagaList struct {
	Sagas []SagaSummary `json:"sagas"`
	Next  string        `json:"next,omitempty"`
}

// sagaListDefault is the page size when the query names none: each line
// costs a saga.Describe (four round trips).
const sagaListDefault = 20

// listSagas lists the kept sagas newest first (?limit=&cursor=), each
// described: its state and its number of steps.
func (s *Server) listSagas(w http.ResponseWriter, r *http.Request, _ principal) error {
	limit := sagaListDefault
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > saga.ListPageMax {
			return errBadRequest("limit must be an integer from 1 to " + strconv.Itoa(saga.ListPageMax))
		}
		limit = n
	}
	ls, next, err := s.cfg.Node.ListSagas(r.Context(), limit, r.URL.Query().Get("cursor"))
	if err != nil {
		return err
	}
	out := SagaList{Sagas: []SagaSummary{}, Next: next}
	for _, l := range ls {
		sum := SagaSummary{ID: l.WorkflowID, State: "recorded", UpdatedAt: l.Updated}
		rep, err := s.cfg.Node.Saga(r.Context(), l.WorkflowID)
		if err == nil {
			sum.Steps = len(rep.Steps)
			switch {
			case rep.Progress != nil && rep.Progress.Status != "":
				sum.State = string(rep.Progress.Status)
			case rep.Triggered:
				sum.State = "triggered"
			}
		}
		out.Sagas = append(out.Sagas, sum)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
