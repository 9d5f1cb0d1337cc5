package safety

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/proto/capv1"
)

// OutputRequest builds the output check request for a job's result.
func OutputRequest(req *capv1.JobRequest, res *capv1.JobResult) *capv1.OutputCheckRequest {
	return &capv1.OutputCheckRequest{JobId: res.GetJobId(), Topic: req.GetTopic(), Tenant: TenantOf(req),
		Result: res, Labels: req.GetLabels()}
}

// ResultStore reads the content behind result pointers and stores redacted
// copies.
type ResultStore interface {
	// Fetch returns the content ptr points at. It may return at most a few
	// bytes more than the checker scans (a size check needs to see that
	// the content is too large, not all of it).
	Fetch(ctx context.Context, ptr string) ([]byte, error)
	// StoreRedacted stores a redacted copy of the content at ptr and
	// returns the copy's pointer.
	StoreRedacted(ctx context.Context, jobID, ptr string, content []byte) (string, error)
}

// errUnsupportedPointer: a result pointer this store cannot read.
var errUnsupportedPointer = errors.New("safety: unsupported result pointer")

// ErrNoResult: the pointer's key does not exist (expired, never written).
var ErrNoResult = errors.New("safety: no result behind the pointer")

// RedisResultStore reads CAP's Redis result pointers ("redis://<key>", the
// key as the worker wrote it, e.g. res:<job_id>) and stores redacted copies
// beside them ("<key>:redacted", with the original's TTL).
type RedisResultStore struct {
	Client redis.UniversalClient
	// MaxBytes is the most Fetch reads (default
	// outputMaxResultBytesDefault); it reads one byte more, so that the
	// checker's size limit sees an oversize result as oversize.
	MaxBytes int64
	// RedactedTTL applies to a redacted copy when the original has no TTL
	// (0: none).
	RedactedTTL time.Duration
}

// redisPointerPrefix starts every Redis result pointer.
const redisPointerPrefix = "redis://"

func redisKey(ptr string) (string, error) {
	key, ok := strings.CutPrefix(ptr, redisPointerPrefix)
	if !ok || key == "" {
		return "", fmt.Errorf("%w: %q", errUnsupportedPointer, ptr)
	}
	return key, nil
}

// Fetch reads the value behind a redis:// pointer.
func (s *RedisResultStore) Fetch(ctx context.Context, ptr string) ([]byte, error) {
	key, err := redisKey(ptr)
	if err != nil {
		return nil, err
	}
	max := s.MaxBytes
	if max <= 0 {
		max = outputMaxResultBytesDefault
	}
	// GETRANGE reads at most max+1 bytes of a value of any size; EXISTS
	// tells a missing key from an empty value.
	var ex *redis.IntCmd
	var get *redis.StringCmd
	_, err = s.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		ex = p.Exists(ctx, key)
		get = p.GetRange(ctx, key, 0, max)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("safety: fetch %s: %w", ptr, err)
	}
	if ex.Val() == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNoResult, ptr)
	}
	return []byte(get.Val()), nil
}

// StoreRedacted writes content under "<key>:redacted".
func (s *RedisResultStore) StoreRedacted(ctx context.Context, _, ptr string, content []byte) (string, error) {
	key, err := redisKey(ptr)
	if err != nil {
		return "", err
	}
	ttl := s.RedactedTTL
	if d, err := s.Client.PTTL(ctx, key).Result(); err == nil && d > 0 {
		ttl = d
	}
	rkey := key + ":redacted"
	if err := s.Client.Set(ctx, rkey, content, ttl).Err(); err != nil {
		return "", fmt.Errorf("safety: store redacted copy of %s: %w", ptr, err)
	}
	return redisPointerPrefix + rkey, nil
}

// OutputContentBudgetDefault bounds phase 2, fetch included.
const OutputContentBudgetDefault = 30 * time.Second

// OutputGate runs the output policy's two phases for the job actor: it
// calls the checker, fetches content, stores redacted copies and turns the
// verdict into what to do with the job (OutputOutcome). It counts checks,
// skips and latency; the caller counts quarantines it actually applied
// (Metrics.Quarantined), since a phase-2 downgrade can lose to a cancel.
//
// Its rules: a checker error releases the result (fail open) and is
// counted as decision "error"; a REDACT that cannot produce a redacted
// copy quarantines; content that cannot be fetched in phase 2 is skipped
// (counted), not quarantined: the result was already released.
type OutputGate struct {
	// Checker decides (required).
	Checker OutputChecker
	// Results fetches content and stores redacted copies. Without it,
	// phase 2 is skipped for checkers that do not read content themselves,
	// and a phase-1 REDACT quarantines.
	Results ResultStore
	// Metrics, when set, counts.
	Metrics *OutputMetrics
	// ContentBudget bounds content work: fetch plus scan (default
	// OutputContentBudgetDefault).
	ContentBudget time.Duration
}

// OutputOutcome is what one phase decided for a result.
type OutputOutcome struct {
	// Phase is phaseMeta or PhaseContent.
	Phase string
	// Decision is the final decision (ALLOW after a fail-open error).
	Decision capv1.OutputDecision
	// Quarantine: move the job to OUTPUT_QUARANTINED (+ DLQ, audit). For
	// phase 2, only if the job is still SUCCEEDED.
	Quarantine bool
	// ResultPtr is the pointer to release: the original, or the redacted
	// copy's (Redacted true) — swap it into the job's result.
	ResultPtr string
	Redacted  bool
	Reason    string
	RuleID    string
	Snapshot  string
	Findings  []Finding
	// Skipped says why the phase did not run ("" when it ran).
	Skipped string
	// Err is the checker's or the store's error when the phase failed
	// open or was skipped.
	Err error
	// ContentChecked: phase 1 already scanned the content (its REDACT
	// path) or a rule said content needs no scan; phase 2 is not needed.
	ContentChecked bool
}

// Fields returns the output-safety record for the job, as field/value
// pairs prefixed "output_meta_" or "output_content_".
func (o *OutputOutcome) Fields() []string {
	p := "output_" + o.Phase + "_"
	f := []string{p + "decision", OutputDecisionName(o.Decision), p + "reason", o.Reason, p + "rule_id", o.RuleID,
		p + "snapshot", o.Snapshot}
	if o.Skipped != "" {
		f = append(f, p+"skipped", o.Skipped)
	}
	if len(o.Findings) > 0 {
		f = append(f, p+"findings", describeFindings(o.Findings))
	}
	if o.Redacted {
		f = append(f, p+"redacted_ptr", o.ResultPtr)
	}
	if o.Err != nil {
		f = append(f, p+"error", o.Err.Error())
	}
	return f
}

func (g *OutputGate) budget() time.Duration {
	if g.ContentBudget > 0 {
		return g.ContentBudget
	}
	return OutputContentBudgetDefault
}

func (g *OutputGate) readsItself() bool {
	r, ok := g.Checker.(interface{ ReadsContentItself() bool })
	return ok && r.ReadsContentItself()
}

func (o *OutputOutcome) take(v *OutputVerdict) {
	o.Decision, o.Reason, o.RuleID, o.Snapshot = v.Decision, v.Reason, v.RuleID, v.PolicySnapshot
	o.Findings = append(o.Findings, v.Findings...)
}

// failOpen: no decision; the result is released as it is.
func (g *OutputGate) failOpen(o *OutputOutcome, err error) OutputOutcome {
	o.Decision, o.Err = capv1.OutputDecision_OUTPUT_DECISION_ALLOW, err
	o.Reason = "output check failed; result released (fail open): " + err.Error()
	g.Metrics.Checked(o.Phase, "error")
	return *o
}

// Phase1 checks req's metadata, before the result is called SUCCEEDED.
func (g *OutputGate) Phase1(ctx context.Context, req *capv1.OutputCheckRequest) OutputOutcome {
	start := time.Now()
	defer func() { g.Metrics.Observe(phaseMeta, time.Since(start).Seconds()) }()
	o := OutputOutcome{Phase: phaseMeta, ResultPtr: req.GetResult().GetResultPtr()}
	v, err := g.Checker.CheckMeta(ctx, req)
	if err == nil && v.Decision == capv1.OutputDecision_OUTPUT_DECISION_UNSPECIFIED {
		err = errors.New("checker returned no decision")
	}
	if err != nil {
		return g.failOpen(&o, err)
	}
	g.Metrics.Checked(phaseMeta, OutputDecisionName(v.Decision))
	o.take(v)
	o.ContentChecked = v.SkipContent
	switch v.Decision {
	case capv1.OutputDecision_OUTPUT_DECISION_QUARANTINE, capv1.OutputDecision_OUTPUT_DECISION_DENY:
		o.Quarantine = true
	case capv1.OutputDecision_OUTPUT_DECISION_REDACT:
		if v.RedactedPtr != "" {
			o.ResultPtr, o.Redacted = v.RedactedPtr, true
			return o
		}
		g.redactNow(ctx, req, &o)
	}
	return o
}

// redactNow makes the redacted copy phase 1 asked for, or quarantines.
func (g *OutputGate) redactNow(ctx context.Context, req *capv1.OutputCheckRequest, o *OutputOutcome) {
	o.ContentChecked = true
	quarantine := func(why string, err error) {
		o.Quarantine, o.Err = true, err
		o.Decision = capv1.OutputDecision_OUTPUT_DECISION_QUARANTINE
		o.Reason += "; quarantined: " + why
	}
	ptr := req.GetResult().GetResultPtr()
	self := g.readsItself()
	if ptr == "" || (g.Results == nil && !self) {
		quarantine("no content to make a redacted copy of", nil)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, g.budget())
	defer cancel()
	var content []byte
	if !self {
		var err error
		if content, err = g.Results.Fetch(cctx, ptr); err != nil {
			quarantine("content could not be read", err)
			return
		}
	}
	// A checker that reads content itself (the remote service) redacts
	// and stores the copy in its content phase.
	v, err := g.Checker.ScanContent(cctx, req, content)
	if err != nil {
		quarantine("content could not be scanned", err)
		return
	}
	o.take(v)
	switch v.Decision {
	case capv1.OutputDecision_OUTPUT_DECISION_ALLOW:
	case capv1.OutputDecision_OUTPUT_DECISION_REDACT:
		g.storeRedacted(cctx, req, v, o)
	default:
		o.Quarantine = true
	}
}

func (g *OutputGate) storeRedacted(ctx context.Context, req *capv1.OutputCheckRequest, v *OutputVerdict, o *OutputOutcome) {
	if v.RedactedPtr != "" {
		o.ResultPtr, o.Redacted = v.RedactedPtr, true
		return
	}
	var err error = errors.New("checker returned no redacted content")
	ptr := ""
	if v.Redacted != nil && g.Results != nil {
		ptr, err = g.Results.StoreRedacted(ctx, req.GetJobId(), req.GetResult().GetResultPtr(), v.Redacted)
	}
	if err != nil {
		o.Quarantine, o.Err = true, err
		o.Decision = capv1.OutputDecision_OUTPUT_DECISION_QUARANTINE
		o.Reason += "; quarantined: no redacted copy could be stored"
		return
	}
	o.ResultPtr, o.Redacted = ptr, true
}

// Phase2 scans the content behind the result pointer, after SUCCEEDED. The
// caller applies Quarantine (and a swapped ResultPtr) only if the job is
// still SUCCEEDED and still its own.
func (g *OutputGate) Phase2(ctx context.Context, req *capv1.OutputCheckRequest) OutputOutcome {
	start := time.Now()
	defer func() { g.Metrics.Observe(PhaseContent, time.Since(start).Seconds()) }()
	ptr := req.GetResult().GetResultPtr()
	o := OutputOutcome{Phase: PhaseContent, ResultPtr: ptr, Decision: capv1.OutputDecision_OUTPUT_DECISION_ALLOW}
	skip := func(why string, err error) OutputOutcome {
		o.Skipped, o.Err = why, err
		o.Reason = "content not scanned: " + why
		g.Metrics.Skipped(PhaseContent, why)
		return o
	}
	if ptr == "" {
		return skip("no_pointer", nil)
	}
	cctx, cancel := context.WithTimeout(ctx, g.budget())
	defer cancel()
	var content []byte
	if !g.readsItself() {
		if g.Results == nil {
			return skip("no_store", nil)
		}
		var err error
		if content, err = g.Results.Fetch(cctx, ptr); err != nil {
			return skip("fetch_failed", err)
		}
	}
	v, err := g.Checker.ScanContent(cctx, req, content)
	if err == nil && v.Decision == capv1.OutputDecision_OUTPUT_DECISION_UNSPECIFIED {
		err = errors.New("checker returned no decision")
	}
	if err != nil {
		return g.failOpen(&o, err)
	}
	g.Metrics.Checked(PhaseContent, OutputDecisionName(v.Decision))
	o.take(v)
	switch v.Decision {
	case capv1.OutputDecision_OUTPUT_DECISION_QUARANTINE, capv1.OutputDecision_OUTPUT_DECISION_DENY:
		o.Quarantine = true
	case capv1.OutputDecision_OUTPUT_DECISION_REDACT:
		g.storeRedacted(cctx, req, v, &o)
	}
	return o
}
