package admin

import (
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Job search: GET /v1/jobs with filters, and the filter a bulk action
// takes. There is no secondary index per topic, worker or label: a filter
// is evaluated on the records a page's bounded scan reads (the state
// indexes, newest update first, at most 8 index pages of `limit` entries
// each, one HMGET pipeline per index page). A filter that matches few jobs
// returns a short, even empty, page with a `next` cursor; following the
// cursors walks the retained jobs once. `since` also ends the scan: no job
// is updated before it is created, so the first index entry updated before
// `since` ends the listing.

// JobFilter selects jobs: the query of GET /v1/jobs and the filter of POST
// /v1/jobs/bulk, with the same keys. Empty fields match everything.
type JobFilter struct {
	State  string `json:"state,omitempty"`
	Topic  string `json:"topic,omitempty"`
	Tenant string `json:"tenant,omitempty"`
	Worker string `json:"worker,omitempty"`
	// Labels are "key=value" pairs the job's request must all carry (the
	// query repeats label=k=v).
	Labels []string `json:"label,omitempty"`
	// Since and Until bound the job's created time (RFC 3339), inclusive.
	Since string `json:"since,omitempty"`
	Until string `json:"until,omitempty"`
	// Q matches job ids that contain it.
	Q string `json:"q,omitempty"`
}

// filterFromQuery reads a JobFilter from a URL query.
func filterFromQuery(q url.Values) JobFilter {
	return JobFilter{State: q.Get("state"), Topic: q.Get("topic"), Tenant: q.Get("tenant"), Worker: q.Get("worker"),
		Labels: q["label"], Since: q.Get("since"), Until: q.Get("until"), Q: q.Get("q")}
}

// Query is the filter as URL query parameters (for Client).
func (f JobFilter) Query() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{"state": f.State, "topic": f.Topic, "tenant": f.Tenant, "worker": f.Worker,
		"since": f.Since, "until": f.Until, "q": f.Q} {
		if s != "" {
			v.Set(k, s)
		}
	}
	for _, l := range f.Labels {
		v.Add("label", l)
	}
	return v
}

// jobMatch is a checked JobFilter.
type jobMatch struct {
	state        jobstate.State
	topic        string
	tenant       string
	worker       string
	labels       map[string]string
	since, until time.Time
	q            string
}

// compile checks f and scopes it to what p may see.
func (f JobFilter) compile(p principal) (*jobMatch, error) {
	m := &jobMatch{state: jobstate.State(f.State), topic: f.Topic, tenant: f.Tenant, worker: f.Worker, q: f.Q}
	if m.state != "" && !m.state.Valid() {
		return nil, errBadRequest("state must be one of the job states (PENDING, RUNNING, SUCCEEDED, ...)")
	}
	for _, l := range f.Labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return nil, errBadRequest("label must be key=value, got " + strconv.Quote(l))
		}
		if m.labels == nil {
			m.labels = map[string]string{}
		}
		m.labels[k] = v
	}
	var err error
	if m.since, err = parseTime("since", f.Since); err != nil {
		return nil, err
	}
	if m.until, err = parseTime("until", f.Until); err != nil {
		return nil, err
	}
	if !p.all() {
		if m.tenant != "" && m.tenant != p.tenant {
			return nil, errForbidden("this key lists tenant " + p.tenant + " only")
		}
		m.tenant = p.tenant
	}
	return m, nil
}

func parseTime(name, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, errBadRequest(name + " must be an RFC 3339 time (2006-01-02T15:04:05Z)")
	}
	return t, nil
}

// narrows reports whether the filter needs more than state and tenant
// (which the store applies itself).
func (m *jobMatch) narrows() bool {
	return m.topic != "" || m.worker != "" || len(m.labels) > 0 || !m.since.IsZero() || !m.until.IsZero() || m.q != ""
}

// query is the store query of the filter; Match applies what the store
// does not.
func (m *jobMatch) query(limit int, cursor string) store.ListQuery {
	lq := store.ListQuery{State: m.state, Tenant: m.tenant, Limit: limit, Cursor: cursor, Since: m.since}
	if m.narrows() {
		lq.Match = func(s *store.JobSummary) bool { return m.keeps(s, labelsOf(s.Request)) }
	}
	return lq
}

// keeps reports whether a job matches (its labels decoded by the caller).
func (m *jobMatch) keeps(s *store.JobSummary, labels map[string]string) bool {
	switch {
	case m.state != "" && s.State != m.state,
		m.tenant != "" && s.Tenant != m.tenant,
		m.topic != "" && s.Topic != m.topic,
		m.worker != "" && s.Worker != m.worker,
		m.q != "" && !strings.Contains(s.ID, m.q),
		!m.since.IsZero() && s.Created.Before(m.since),
		!m.until.IsZero() && s.Created.After(m.until):
		return false
	}
	for k, v := range m.labels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// labelsOf decodes a stored request's labels (nil when there is none).
func labelsOf(req []byte) map[string]string {
	if len(req) == 0 {
		return nil
	}
	r := &capv1.JobRequest{}
	if proto.Unmarshal(req, r) != nil {
		return nil
	}
	return r.Labels
}

// listJobs lists jobs newest update first, filtered by JobFilter's keys:
// ?state=RUNNING&topic=job.echo&label=team=a&limit=50&cursor=...
func (s *Server) listJobs(w http.ResponseWriter, r *http.Request, p principal) error {
	q := r.URL.Query()
	m, err := filterFromQuery(q).compile(p)
	if err != nil {
		return err
	}
	limit := 0
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return errBadRequest("limit must be a positive integer")
		}
		limit = n
	}
	lq := m.query(limit, q.Get("cursor"))
	out := JobList{State: string(m.state), Jobs: []JobSummary{}}
	if m.state == "" || m.state == jobstate.StateScheduled {
		// Jobs waiting for room within their capacity grace have no record
		// yet: the nodes list them, newest first, on the pages before the
		// records' (cursor waitingCursor<n>: n of them listed already).
		full, next, err := s.listWaiting(r, &lq, &out, m)
		if err == nil && !full {
			// Then the delayed jobs, soonest first (cursor
			// delayedCursor<n>; schedules.go).
			full, next, err = s.listDelayedJobs(r, &lq, &out, m)
		}
		if err != nil {
			return err
		}
		if full {
			out.Next = next
			writeJSON(w, http.StatusOK, out)
			return nil
		}
	}
	page, err := s.cfg.Node.ListJobs(r.Context(), lq)
	if err != nil {
		return err
	}
	out.Next = page.Next
	for i := range page.Jobs {
		out.Jobs = append(out.Jobs, summaryView(&page.Jobs[i]))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// summaryView is a listed job as the API shows it.
func summaryView(j *store.JobSummary) JobSummary {
	return JobSummary{ID: j.ID, State: string(j.State), Topic: j.Topic, Tenant: j.Tenant, Reason: string(j.Reason),
		Worker: j.Worker, Labels: labelsOf(j.Request), Attempts: j.Attempts, Created: j.Created, Updated: j.Updated}
}
