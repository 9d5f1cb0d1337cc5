package admin

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/schedule"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Schedules and delayed jobs (internal/schedule):
//
//	GET    /v1/schedules                 the schedules (a tenant key: its tenant's)
//	POST   /v1/schedules                 create one (body: schedule.Schedule)
//	GET    /v1/schedules/{id}            one, with its next tick and last fired tick
//	DELETE /v1/schedules/{id}
//	POST   /v1/schedules/{id}/pause      and /resume
//	GET    /v1/schedules/delayed         delayed jobs not yet submitted, soonest first (?limit=)
//	GET    /v1/schedules/delayed/{id}
//	DELETE /v1/schedules/delayed/{id}    drop a delayed job before its time
//
// A tenant key creates schedules for its own tenant only and sees and acts
// on its own tenant's schedules and delayed jobs; another tenant's is
// "not found" to it.

// ScheduleNode is what the schedule endpoints need of a node (*troupe.Node
// implements it); a node without it answers them 404.
type ScheduleNode interface {
	Schedules() *schedule.Store
}

// ScheduleList answers GET /v1/schedules.
type ScheduleList struct {
	Schedules []*schedule.Schedule `json:"schedules"`
}

// DelayedList answers GET /v1/schedules/delayed.
type DelayedList struct {
	Delayed []schedule.Delayed `json:"delayed"`
}

// ScheduleAction answers pause, resume and the deletes.
type ScheduleAction struct {
	ID     string `json:"id"`
	Action string `json:"action"`
}

// scheduleRoutes registers the schedule endpoints (server.go calls it).
func (s *Server) scheduleRoutes(api func(string, scope, apiHandler)) {
	api("GET /v1/schedules", anyTenant, s.listSchedules)
	api("POST /v1/schedules", anyTenant, s.createSchedule)
	api("GET /v1/schedules/delayed", anyTenant, s.listDelayed)
	api("GET /v1/schedules/delayed/{id}", anyTenant, s.getDelayed)
	api("DELETE /v1/schedules/delayed/{id}", anyTenant, s.deleteDelayed)
	api("GET /v1/schedules/{id}", anyTenant, s.getSchedule)
	api("DELETE /v1/schedules/{id}", anyTenant, s.deleteSchedule)
	api("POST /v1/schedules/{id}/{action}", anyTenant, s.pauseSchedule)
}

func (s *Server) schedules() (*schedule.Store, error) {
	if n, ok := s.cfg.Node.(ScheduleNode); ok && n.Schedules() != nil {
		return n.Schedules(), nil
	}
	return nil, errNotFound("this node serves no schedules")
}

// scheduleErr maps the schedule package's errors to the API's.
func scheduleErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, schedule.ErrNotFound):
		return errNotFound(err.Error())
	case errors.Is(err, schedule.ErrExists):
		return errConflict(err.Error())
	case errors.Is(err, schedule.ErrSpec):
		return errBadRequest(err.Error())
	case errors.Is(err, schedule.ErrTaken):
		return errConflict(err.Error() + ": it is due; cancel it as a job (POST /v1/jobs/{id}/cancel)")
	}
	return err
}

// visibleTenant is the tenant p lists ("" for all).
func visibleTenant(p principal) string {
	if p.all() {
		return ""
	}
	return p.tenant
}

func (s *Server) listSchedules(w http.ResponseWriter, r *http.Request, p principal) error {
	st, err := s.schedules()
	if err != nil {
		return err
	}
	list, err := st.List(r.Context(), visibleTenant(p))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, ScheduleList{Schedules: list})
	return nil
}

func (s *Server) createSchedule(w http.ResponseWriter, r *http.Request, p principal) error {
	st, err := s.schedules()
	if err != nil {
		return err
	}
	var sc schedule.Schedule
	if err := readJSON(r, &sc); err != nil {
		return err
	}
	if !p.all() {
		if sc.Tenant != "" && sc.Tenant != p.tenant {
			return errForbidden("this key creates schedules for tenant " + p.tenant + " only")
		}
		sc.Tenant = p.tenant
	}
	sc.CreatedBy = p.by()
	sc.CreatedAt = sc.CreatedAt.UTC()
	if err := st.Create(r.Context(), &sc); err != nil {
		return scheduleErr(err)
	}
	s.audit("schedule created", "schedule", sc.ID, "topic", sc.Topic, "by", p.by())
	got, err := st.Get(r.Context(), sc.ID)
	if err != nil {
		return scheduleErr(err)
	}
	writeJSON(w, http.StatusCreated, got)
	return nil
}

// ownSchedule reads schedule id if p may see it.
func (s *Server) ownSchedule(ctx context.Context, st *schedule.Store, id string, p principal) (*schedule.Schedule, error) {
	sc, err := st.Get(ctx, id)
	if err != nil {
		return nil, scheduleErr(err)
	}
	if !p.all() && sc.Tenant != p.tenant {
		return nil, errNotFound("schedule: not found: " + id)
	}
	return sc, nil
}

func (s *Server) getSchedule(w http.ResponseWriter, r *http.Request, p principal) error {
	st, err := s.schedules()
	if err != nil {
		return err
	}
	sc, err := s.ownSchedule(r.Context(), st, r.PathValue("id"), p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sc)
	return nil
}

func (s *Server) deleteSchedule(w http.ResponseWriter, r *http.Request, p principal) error {
	st, err := s.schedules()
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if _, err := s.ownSchedule(r.Context(), st, id, p); err != nil {
		return err
	}
	if err := st.Delete(r.Context(), id); err != nil {
		return scheduleErr(err)
	}
	s.audit("schedule deleted", "schedule", id, "by", p.by())
	writeJSON(w, http.StatusOK, ScheduleAction{ID: id, Action: "deleted"})
	return nil
}

func (s *Server) pauseSchedule(w http.ResponseWriter, r *http.Request, p principal) error {
	st, err := s.schedules()
	if err != nil {
		return err
	}
	id, action := r.PathValue("id"), r.PathValue("action")
	if action != "pause" && action != "resume" {
		return errNotFound("POST /v1/schedules/{id}/pause or /v1/schedules/{id}/resume")
	}
	if _, err := s.ownSchedule(r.Context(), st, id, p); err != nil {
		return err
	}
	if action == "pause" {
		err = st.Pause(r.Context(), id)
	} else {
		err = st.Resume(r.Context(), id)
	}
	if err != nil {
		return scheduleErr(err)
	}
	s.audit("schedule "+action+"d", "schedule", id, "by", p.by())
	sc, err := st.Get(r.Context(), id)
	if err != nil {
		return scheduleErr(err)
	}
	writeJSON(w, http.StatusOK, sc)
	return nil
}

func (s *Server) listDelayed(w http.ResponseWriter, r *http.Request, p principal) error {
	st, err := s.schedules()
	if err != nil {
		return err
	}
	limit := int64(100)
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 || n > 10_000 {
			return errBadRequest("limit: want 1..10000")
		}
		limit = int64(n)
	}
	list, err := st.ListDelayed(r.Context(), visibleTenant(p), limit)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, DelayedList{Delayed: list})
	return nil
}

func (s *Server) ownDelayed(ctx context.Context, st *schedule.Store, id string, p principal) (*schedule.Delayed, error) {
	d, err := st.GetDelayed(ctx, id)
	if err != nil {
		return nil, scheduleErr(err)
	}
	if !p.all() && d.Tenant != p.tenant {
		return nil, errNotFound("schedule: not found: delayed job " + id)
	}
	d.Request = nil
	return d, nil
}

func (s *Server) getDelayed(w http.ResponseWriter, r *http.Request, p principal) error {
	st, err := s.schedules()
	if err != nil {
		return err
	}
	d, err := s.ownDelayed(r.Context(), st, r.PathValue("id"), p)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}

func (s *Server) deleteDelayed(w http.ResponseWriter, r *http.Request, p principal) error {
	st, err := s.schedules()
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if _, err := s.ownDelayed(r.Context(), st, id, p); err != nil {
		return err
	}
	if err := st.DeleteDelayed(r.Context(), id); err != nil {
		return scheduleErr(err)
	}
	s.audit("delayed job deleted", "job_id", id, "by", p.by())
	writeJSON(w, http.StatusOK, ScheduleAction{ID: id, Action: "deleted"})
	return nil
}

// --- delayed jobs as jobs ------------------------------------------------------
//
// A delayed job has no record before its time: the job endpoints show it
// from the delayed jobs Redis holds (a view, no state of its own), as
// SCHEDULED with reason DelayedReason and its run_at, and its cancel
// removes it (it never runs). See NOTES.md "Delayed and scheduled jobs".

// DelayedReason is the reason a delayed job is shown with.
const DelayedReason = "delayed"

// CancelledDelayedNote is the note of a cancel that removed a delayed job
// before its time.
const CancelledDelayedNote = "delayed job removed before its time: it never runs"

// delayedJob returns delayed job id if p may see it (nil: none, or no
// schedule store on this node).
func (s *Server) delayedJob(ctx context.Context, p principal, id string) *schedule.Delayed {
	st, err := s.schedules()
	if err != nil {
		return nil
	}
	d, err := st.GetDelayed(ctx, id)
	if err != nil || !p.sees(d.Tenant) {
		return nil
	}
	return d
}

// delayedView is a delayed job as GET /v1/jobs/{id} shows it.
func delayedView(d *schedule.Delayed) Job {
	due := d.Due
	j := Job{ID: d.JobID, State: string(jobstate.StateScheduled), Topic: d.Topic, Tenant: d.Tenant, TraceID: d.TraceID,
		Reason: DelayedReason, Unwritten: true, RunAt: &due, Created: d.Submitted, Updated: d.Submitted,
		History: []HistoryEntry{}, AttemptList: []Attempt{}}
	if req := delayedRequest(d); req != nil {
		if b, err := (protojson.MarshalOptions{UseProtoNames: true}).Marshal(req); err == nil {
			j.Request = b
		}
	}
	return j
}

func delayedRequest(d *schedule.Delayed) *capv1.JobRequest {
	req := &capv1.JobRequest{}
	if len(d.Request) == 0 || proto.Unmarshal(d.Request, req) != nil {
		return nil
	}
	return req
}

// delayedKeeper is m as a filter of delayed jobs (labels: the request's).
func delayedKeeper(m *jobMatch) func(*schedule.Delayed) bool {
	return func(d *schedule.Delayed) bool {
		var labels map[string]string
		if req := delayedRequest(d); req != nil {
			labels = req.Labels
		}
		return m.keeps(&store.JobSummary{ID: d.JobID, State: jobstate.StateScheduled, Topic: d.Topic, Tenant: d.Tenant,
			Created: d.Submitted}, labels)
	}
}

// delayedCursor starts the cursor of a page of delayed jobs.
const delayedCursor = "delayed:"

// listDelayedJobs puts the page of delayed jobs that lq's cursor asks for
// into out, as listWaiting does for jobs waiting with no record (they come
// first, then these, then the records).
func (s *Server) listDelayedJobs(r *http.Request, lq *store.ListQuery, out *JobList, m *jobMatch) (full bool, next string, err error) {
	skip := 0
	switch {
	case lq.Cursor == "":
	case strings.HasPrefix(lq.Cursor, delayedCursor):
		skip, err = strconv.Atoi(strings.TrimPrefix(lq.Cursor, delayedCursor))
		if err != nil || skip < 0 {
			return false, "", errBadRequest("cursor is not one this API gave")
		}
		lq.Cursor = ""
	default:
		return false, "", nil
	}
	st, serr := s.schedules()
	if serr != nil {
		return false, "", nil // this node holds no delayed jobs
	}
	limit := lq.Limit
	if limit <= 0 {
		limit = store.ListLimitDefault
	}
	ds, err := st.ListDelayedPage(r.Context(), lq.Tenant, int64(skip), int64(limit)+1, delayedKeeper(m))
	if err != nil {
		return false, "", err
	}
	more := len(ds) > limit
	ds = ds[:min(limit, len(ds))]
	for _, d := range ds {
		due := d.Due
		out.Jobs = append(out.Jobs, JobSummary{ID: d.JobID, State: string(jobstate.StateScheduled), Topic: d.Topic,
			Tenant: d.Tenant, Reason: DelayedReason, Created: d.Submitted, Updated: d.Submitted, Unwritten: true,
			RunAt: &due})
	}
	if more || len(ds) == limit {
		return true, delayedCursor + strconv.Itoa(skip+len(ds)), nil
	}
	lq.Limit = limit - len(ds)
	return false, "", nil
}

// cancelDelayed cancels delayed job id for p if it is one not yet taken to
// be submitted, and answers: done. Otherwise (no such delayed job, or one
// being submitted) it answers nothing and the cancel goes the usual way (a
// cancel mark, then the job's record).
func (s *Server) cancelDelayed(w http.ResponseWriter, r *http.Request, p principal, id, by string) (bool, error) {
	d := s.delayedJob(r.Context(), p, id)
	if d == nil {
		return false, nil
	}
	st, _ := s.schedules()
	err := st.DeleteDelayed(r.Context(), id)
	switch {
	case errors.Is(err, schedule.ErrTaken), errors.Is(err, schedule.ErrNotFound):
		return false, nil
	case err != nil:
		return false, err
	}
	s.audit("delayed job cancelled before its time", "job_id", id, "run_at", d.Due.Format(time.RFC3339Nano), "by", by,
		"key_tenant", p.tenant)
	writeJSON(w, http.StatusOK, Accepted{JobID: id, Action: "cancel", Note: CancelledDelayedNote})
	return true, nil
}

// delayedSummaries lists up to limit delayed jobs m keeps, for a bulk
// action (best effort: none when Redis cannot be read).
func (s *Server) delayedSummaries(r *http.Request, m *jobMatch, limit int) []store.JobSummary {
	st, err := s.schedules()
	if err != nil || limit <= 0 {
		return nil
	}
	ds, err := st.ListDelayedPage(r.Context(), m.tenant, 0, int64(limit), delayedKeeper(m))
	if err != nil {
		return nil
	}
	out := make([]store.JobSummary, 0, len(ds))
	for _, d := range ds {
		out = append(out, store.JobSummary{ID: d.JobID, State: jobstate.StateScheduled, Topic: d.Topic, Tenant: d.Tenant,
			Reason: jobstate.Reason(DelayedReason), Created: d.Submitted, Updated: d.Submitted})
	}
	return out
}

// removeDelayed cancels delayed job id if it is not yet taken to be
// submitted (the caller checked the tenant).
func (s *Server) removeDelayed(ctx context.Context, id string) bool {
	st, err := s.schedules()
	return err == nil && st.DeleteDelayed(ctx, id) == nil
}

// --- client -------------------------------------------------------------------

// Schedules lists the schedules.
func (c *Client) Schedules(ctx context.Context) (ScheduleList, error) {
	var out ScheduleList
	err := c.do(ctx, http.MethodGet, "/v1/schedules", nil, &out)
	return out, err
}

// Schedule returns one schedule.
func (c *Client) Schedule(ctx context.Context, id string) (schedule.Schedule, error) {
	var out schedule.Schedule
	err := c.do(ctx, http.MethodGet, "/v1/schedules/"+url.PathEscape(id), nil, &out)
	return out, err
}

// CreateSchedule creates a schedule.
func (c *Client) CreateSchedule(ctx context.Context, sc schedule.Schedule) (schedule.Schedule, error) {
	var out schedule.Schedule
	err := c.do(ctx, http.MethodPost, "/v1/schedules", jsonBody(sc), &out)
	return out, err
}

// DeleteSchedule deletes a schedule.
func (c *Client) DeleteSchedule(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/schedules/"+url.PathEscape(id), nil, nil)
}

// PauseSchedule pauses a schedule (pause true) or resumes it.
func (c *Client) PauseSchedule(ctx context.Context, id string, pause bool) (schedule.Schedule, error) {
	action := "/resume"
	if pause {
		action = "/pause"
	}
	var out schedule.Schedule
	err := c.do(ctx, http.MethodPost, "/v1/schedules/"+url.PathEscape(id)+action, nil, &out)
	return out, err
}

// Delayed lists delayed jobs not yet submitted, soonest first.
func (c *Client) Delayed(ctx context.Context, limit int) (DelayedList, error) {
	path := "/v1/schedules/delayed"
	if limit > 0 {
		path += "?limit=" + strconv.Itoa(limit)
	}
	var out DelayedList
	err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out, err
}

// DeleteDelayed drops a delayed job before its time.
func (c *Client) DeleteDelayed(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/schedules/delayed/"+url.PathEscape(id), nil, nil)
}
