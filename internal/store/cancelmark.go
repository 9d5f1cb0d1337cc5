package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// CancelMarkTTL is how long a cancel mark is kept: at least as long as the
// submit stream keeps an unconsumed submit (bus.StreamMaxAge, 72 h), so a
// submit held in the stream that long still finds its mark when a node
// takes it. A mark for a job that never arrives expires then.
const CancelMarkTTL = 73 * time.Hour

// AnyTenant is the tenant of a cancel mark that applies whatever the job's
// tenant (an operator's or an all-tenant key's cancel).
const AnyTenant = "*"

// ErrJobExists is MarkCancel's answer for a job that has a record: the
// cancel must go the usual way, to the job.
var ErrJobExists = errors.New("store: job has a record")

// MarkCancel records the cancel of a job that has no record yet — its
// submit acknowledged by the stream but taken by no node — so that the job
// is created CANCELLED, never dispatched, when a node takes it. The mark
// applies only to a job of one of tenants (AnyTenant: any); a job of
// another tenant with that id ignores it. It expires after CancelMarkTTL.
// A job that has a record is ErrJobExists, and nothing is written.
func (s *Store) MarkCancel(ctx context.Context, jobID string, tenants []string, by, reason string) error {
	if len(tenants) == 0 {
		return fmt.Errorf("store: cancel mark of %s names no tenant", jobID)
	}
	// The mark's value is "<by>\n<reason>": by holds no newline.
	by = strings.ReplaceAll(by, "\n", " ")
	v, err := runScript(ctx, s.rdb, cancelMarkCall{jobKey: s.keys.Job(jobID), markKey: s.keys.CancelMark(jobID),
		by: by, reason: reason, ttlMs: CancelMarkTTL.Milliseconds(), tenants: tenants}).Text()
	if err != nil {
		return fmt.Errorf("store: cancel mark %s: %w", jobID, err)
	}
	if v == "EXISTS" {
		return ErrJobExists
	}
	return nil
}

// CancelMarked reports the tenants a cancel mark for jobID applies to (nil:
// no mark), and how long it is kept still.
func (s *Store) CancelMarked(ctx context.Context, jobID string) ([]string, time.Duration, error) {
	key := s.keys.CancelMark(jobID)
	fields, err := s.rdb.HKeys(ctx, key).Result()
	if err != nil || len(fields) == 0 {
		return nil, 0, err
	}
	ttl, err := s.rdb.PTTL(ctx, key).Result()
	return fields, ttl, err
}
