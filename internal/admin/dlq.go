package admin

import (
	"net/http"
	"strconv"

	"github.com/troupe-run/troupe/internal/store"
)

// DLQ bounds.
const (
	dlqLimitDefault = 50
	dlqLimitMax     = 1000
	// dlqScopedReadFactor: a tenant key sees only its jobs' entries, so it
	// reads this many times its limit before filtering.
	dlqScopedReadFactor = 4
)

// listDLQ lists DLQ entries, newest first (?limit=). A tenant key sees the
// entries of its own jobs; inputs that never became a job belong to no
// tenant and only an all-tenant key sees them.
func (s *Server) listDLQ(w http.ResponseWriter, r *http.Request, p principal) error {
	limit := dlqLimitDefault
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return errBadRequest("limit must be a positive integer")
		}
		limit = min(n, dlqLimitMax)
	}
	read := limit
	if !p.all() {
		read = min(limit*dlqScopedReadFactor, dlqLimitMax)
	}
	es, err := s.cfg.Node.ListDLQ(r.Context(), int64(read))
	if err != nil {
		return err
	}
	var jobIDs, entryIDs []string
	for _, e := range es {
		if e.JobID != "" {
			jobIDs = append(jobIDs, e.JobID)
		}
		entryIDs = append(entryIDs, e.ID)
	}
	tenants, err := s.cfg.Node.JobTenants(r.Context(), jobIDs)
	if err != nil {
		return err
	}
	retried, err := s.cfg.Node.DLQRetried(r.Context(), entryIDs)
	if err != nil {
		return err
	}
	out := DLQList{Entries: []DLQEntry{}}
	for _, e := range es {
		tenant, ok := tenants[e.JobID]
		if !p.all() && (!ok || tenant != p.tenant) {
			continue
		}
		out.Entries = append(out.Entries, dlqView(e, tenant, retried[e.ID]))
		if len(out.Entries) == limit {
			break
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// visibleEntry reads a DLQ entry and hides it from keys that may not see
// its job (see listDLQ).
func (s *Server) visibleEntry(r *http.Request, p principal) (*store.DLQEntry, error) {
	e, err := s.cfg.Node.DLQEntry(r.Context(), r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	if p.all() {
		return e, nil
	}
	if e.JobID == "" {
		return nil, store.ErrDLQNotFound
	}
	tenants, err := s.cfg.Node.JobTenants(r.Context(), []string{e.JobID})
	if err != nil {
		return nil, err
	}
	if t, ok := tenants[e.JobID]; !ok || t != p.tenant {
		return nil, store.ErrDLQNotFound
	}
	return e, nil
}

// retryDLQ re-submits an entry's job under a new id linked to the
// original (?force=true retries an entry retried before).
func (s *Server) retryDLQ(w http.ResponseWriter, r *http.Request, p principal) error {
	e, err := s.visibleEntry(r, p)
	if err != nil {
		return err
	}
	force := r.URL.Query().Get("force") == "true"
	id, err := s.cfg.Node.RetryDLQ(r.Context(), e.ID, force)
	if err != nil {
		return err
	}
	s.audit("dlq entry retried", "entry", e.ID, "job_id", id, "retry_of", e.JobID, "topic", e.Topic,
		"key_tenant", p.tenant)
	w.Header().Set("Location", "/v1/jobs/"+id)
	writeJSON(w, http.StatusCreated, Submitted{JobID: id, RetryOf: e.JobID, DLQEntry: e.ID})
	return nil
}

func (s *Server) deleteDLQ(w http.ResponseWriter, r *http.Request, p principal) error {
	e, err := s.visibleEntry(r, p)
	if err != nil {
		return err
	}
	if err := s.cfg.Node.DeleteDLQ(r.Context(), e.ID); err != nil {
		return err
	}
	s.audit("dlq entry deleted", "entry", e.ID, "job_id", e.JobID, "topic", e.Topic, "key_tenant", p.tenant)
	w.WriteHeader(http.StatusNoContent)
	return nil
}
