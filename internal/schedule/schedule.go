// Package schedule runs delayed and scheduled jobs: schedules (cron
// expressions and intervals) and delayed submits kept in Redis, and the
// Ticker, a node component that submits each tick's job and each due
// delayed job through the ordinary submit path.
//
// Exactly one job per tick across replicas: a tick's job id is derived
// from (schedule, tick time), a replica claims the tick in Redis (SET NX
// with a lease) before submitting it, and advances the schedule's next
// tick atomically after (only if it still names that tick). A replica
// that dies between claim and advance leaves the tick to the others once
// the lease ends; they submit the same job id, which JetStream's duplicate
// window (Nats-Msg-Id) and the job's own duplicate-submit rule absorb.
package schedule

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/troupe-run/troupe/proto/capv1"
)

// Missed-tick policies: what a schedule does with ticks no replica fired
// within its grace (an outage of every replica, or all of them paused).
const (
	// MissedSkip (the default) drops missed ticks: the schedule fires its
	// next tick at its time.
	MissedSkip = "skip"
	// MissedCatchUp fires the most recent CatchUp missed ticks (at most),
	// oldest first, at once; older ones are dropped.
	MissedCatchUp = "catch_up"
)

// Defaults.
const (
	// GraceDefault: a tick fired within this of its time is late, not
	// missed, and always fires.
	GraceDefault = time.Minute
	// MaxCatchUp bounds a schedule's CatchUp.
	MaxCatchUp = 1000
)

// Labels a tick's job carries in its meta.labels (JobRequest.labels are
// placement constraints).
const (
	LabelSchedule = "troupe.schedule"
	LabelTick     = "troupe.tick"
)

// Schedule is a stored schedule: when it ticks (Cron or Every) and the job
// each tick submits.
type Schedule struct {
	ID string `json:"id"`
	// Cron is a five-field cron expression (see Cron); Every an interval
	// ("30s", "1h"). Exactly one is set.
	Cron  string `json:"cron,omitempty"`
	Every string `json:"every,omitempty"`
	// Timezone evaluates Cron (IANA name; default UTC).
	Timezone string `json:"timezone,omitempty"`

	// The job each tick submits.
	Topic      string            `json:"topic"`
	Tenant     string            `json:"tenant,omitempty"`
	Principal  string            `json:"principal,omitempty"`
	Priority   string            `json:"priority,omitempty"` // JOB_PRIORITY_* name or short form (batch, interactive, critical)
	Labels     map[string]string `json:"labels,omitempty"`   // placement labels, as on any submit
	Env        map[string]string `json:"env,omitempty"`
	ContextPtr string            `json:"context_ptr,omitempty"`

	// Missed is MissedSkip (default) or MissedCatchUp; CatchUp the most
	// missed ticks a catch-up fires; Grace (a duration, default
	// GraceDefault) how late a tick may fire before it counts as missed.
	Missed  string `json:"missed,omitempty"`
	CatchUp int    `json:"catch_up,omitempty"`
	Grace   string `json:"grace,omitempty"`

	Paused    bool      `json:"paused"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by,omitempty"`

	// Read from Redis, not stored with the definition.
	NextTick *time.Time `json:"next_tick,omitempty"`
	Last     *Fired     `json:"last,omitempty"`
}

// Fired is a schedule's last submitted tick.
type Fired struct {
	Tick    time.Time `json:"tick"`
	JobID   string    `json:"job_id"`
	FiredAt time.Time `json:"fired_at"`
}

var idRe = regexp.MustCompile(`^[A-Za-z0-9_.:-]{1,64}$`)

// Validate checks s and fills its defaults.
func (s *Schedule) Validate() error {
	if !idRe.MatchString(s.ID) || s.ID == "delayed" {
		return fmt.Errorf("%w: id %q: 1-64 letters, digits, _ . : - (and not \"delayed\")", ErrSpec, s.ID)
	}
	if (s.Cron == "") == (s.Every == "") {
		return fmt.Errorf("%w: set exactly one of cron and every", ErrSpec)
	}
	if s.Topic == "" {
		return fmt.Errorf("%w: topic is required", ErrSpec)
	}
	if s.CreatedAt.IsZero() {
		s.CreatedAt = time.Now().UTC()
	}
	if _, err := s.Spec(); err != nil {
		return err
	}
	switch s.Missed {
	case "":
		s.Missed = MissedSkip
	case MissedSkip, MissedCatchUp:
	default:
		return fmt.Errorf("%w: missed %q: want %s or %s", ErrSpec, s.Missed, MissedSkip, MissedCatchUp)
	}
	if s.CatchUp < 0 || s.CatchUp > MaxCatchUp {
		return fmt.Errorf("%w: catch_up %d: want 0..%d", ErrSpec, s.CatchUp, MaxCatchUp)
	}
	if s.Missed == MissedCatchUp && s.CatchUp == 0 {
		s.CatchUp = 1
	}
	if s.Missed == MissedSkip {
		s.CatchUp = 0
	}
	if s.Grace != "" {
		// A tick always fires a little late: a grace under a second would
		// make most ticks missed ones.
		if g, err := time.ParseDuration(s.Grace); err != nil || g < time.Second {
			return fmt.Errorf("%w: grace %q: want a duration of at least 1s", ErrSpec, s.Grace)
		}
	}
	if _, err := s.priority(); err != nil {
		return err
	}
	return nil
}

// Spec returns when s ticks.
func (s *Schedule) Spec() (Spec, error) {
	if s.Every != "" {
		return ParseInterval(s.Every, s.CreatedAt.Truncate(time.Millisecond))
	}
	loc := time.UTC
	if s.Timezone != "" {
		l, err := time.LoadLocation(s.Timezone)
		if err != nil {
			return nil, fmt.Errorf("%w: timezone %q: %v", ErrSpec, s.Timezone, err)
		}
		loc = l
	}
	return ParseCron(s.Cron, loc)
}

// GraceOr returns s's grace (GraceDefault when unset).
func (s *Schedule) GraceOr() time.Duration {
	if g, err := time.ParseDuration(s.Grace); err == nil && s.Grace != "" {
		return g
	}
	return GraceDefault
}

func (s *Schedule) priority() (capv1.JobPriority, error) {
	if s.Priority == "" {
		return capv1.JobPriority_JOB_PRIORITY_UNSPECIFIED, nil
	}
	name := strings.ToUpper(s.Priority)
	if !strings.HasPrefix(name, "JOB_PRIORITY_") {
		name = "JOB_PRIORITY_" + name
	}
	v, ok := capv1.JobPriority_value[name]
	if !ok {
		return 0, fmt.Errorf("%w: priority %q: unknown", ErrSpec, s.Priority)
	}
	return capv1.JobPriority(v), nil
}

// TickJobID is the job id of schedule id's tick at t: the same on every
// replica, so a tick submitted twice is one job.
func TickJobID(id string, t time.Time) string {
	return "sched-" + id + "-" + strconv.FormatInt(t.UnixMilli(), 10)
}

// Request builds the job of s's tick at t.
func (s *Schedule) Request(t time.Time) *capv1.JobRequest {
	prio, _ := s.priority()
	var labels map[string]string
	if len(s.Labels) > 0 {
		labels = make(map[string]string, len(s.Labels))
		for k, v := range s.Labels {
			labels[k] = v
		}
	}
	meta := &capv1.JobMetadata{Labels: map[string]string{
		LabelSchedule: s.ID, LabelTick: t.UTC().Format(time.RFC3339Nano)}}
	var env map[string]string
	if len(s.Env) > 0 {
		env = make(map[string]string, len(s.Env))
		for k, v := range s.Env {
			env[k] = v
		}
	}
	return &capv1.JobRequest{JobId: TickJobID(s.ID, t), Topic: s.Topic, Priority: prio, TenantId: s.Tenant,
		PrincipalId: s.Principal, Labels: labels, Env: env, ContextPtr: s.ContextPtr, Meta: meta}
}

// traceFor is a tick's trace id: deterministic too.
func traceFor(jobID string) string {
	h := sha256.Sum256([]byte(jobID))
	return hex.EncodeToString(h[:16])
}
