package safety

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/proto/capv1"
)

// Rule ids the engine reports for decisions no policy rule made.
const (
	// ruleNonJobTopic: CAP kernels deny every topic outside job.*.
	ruleNonJobTopic = "builtin:non-job-topic"
	// ruleDefaultAllow: no rule matched, and CAP's default is allow.
	ruleDefaultAllow = "default:allow"
)

// jobTopicPrefix is the prefix every topic a kernel allows starts with.
const jobTopicPrefix = "job."

// EnginePollDefault is how often the engine re-reads its policy file: a
// change is in force within about a second, for one small file read per
// second.
const EnginePollDefault = time.Second

// maxSnapshots bounds the versions ListSnapshots reports; a long-running
// kernel reloaded every few minutes would otherwise grow without end.
const maxSnapshots = 64

// EngineConfig configures an Engine that reads its policy from a file.
type EngineConfig struct {
	// Path is the policy file (required).
	Path string
	// Poll is how often the file is checked for changes (default
	// EnginePollDefault; negative disables the watcher: reload only on
	// Reload).
	Poll time.Duration
	// Log receives reload lines (default slog.Default()).
	Log *slog.Logger
	// OnReload, if set, is called after every reload attempt that found a
	// changed file, with the policy in force afterwards and the error that
	// refused the new content (nil when it was taken). Tests use it as a
	// signal; it must not block.
	OnReload func(p *Policy, err error)
}

// Engine is the built-in policy engine: CAP's safety kernel semantics over a
// policy file, in process. It implements InputPolicy (for `troupe dev` and
// `troupe node --policy`) and backs the SafetyKernel gRPC server.
//
// Rules are evaluated in order and the first match decides; no match
// allows; topics outside job.* are denied before any rule. A check is
// lock-free (one atomic load of the current Policy) and safe for concurrent
// use. With a file, the engine reloads it when its content changes; an
// invalid file never replaces the version in force.
type Engine struct {
	// Immutable after construction.
	cfg EngineConfig
	log *slog.Logger

	// The version in force; swapped whole on reload.
	cur atomic.Pointer[Policy]

	// Guarded by mu: reloads may come from the poll loop and from Reload.
	mu        sync.Mutex
	snapshots []string
	lastBad   string // hash of the last refused content, to log it once
	binds     map[*binding]struct{}

	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// NewEngine returns an engine over policy content, with no file to watch.
func NewEngine(data []byte) (*Engine, error) {
	p, err := ParsePolicy(data)
	if err != nil {
		return nil, err
	}
	e := &Engine{log: slog.Default(), stop: make(chan struct{}), done: make(chan struct{})}
	close(e.done)
	e.install(p)
	return e, nil
}

// Inline: the engine decides from memory (an atomic pointer to the loaded
// policy), so the job actor calls it inside its mailbox.
func (e *Engine) Inline() bool { return true }

// LoadEngine reads the policy file at path and watches it (every
// EnginePollDefault). Call Close to stop watching.
func LoadEngine(path string) (*Engine, error) {
	return StartEngine(EngineConfig{Path: path})
}

// StartEngine reads cfg.Path and starts the watcher. A missing or invalid
// file is an error here: there is no older version to keep.
func StartEngine(cfg EngineConfig) (*Engine, error) {
	if cfg.Path == "" {
		return nil, fmt.Errorf("safety: engine needs a policy file path")
	}
	if cfg.Poll == 0 {
		cfg.Poll = EnginePollDefault
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	e := &Engine{cfg: cfg, log: cfg.Log.With("component", "safety-engine", "policy_file", cfg.Path),
		stop: make(chan struct{}), done: make(chan struct{})}
	data, err := readPolicyFile(cfg.Path)
	if err != nil {
		return nil, err
	}
	p, err := ParsePolicy(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Path, err)
	}
	e.install(p)
	e.log.Info("safety policy loaded", "snapshot", p.Snapshot, "rules", p.Rules(), "legacy", p.Legacy)
	if cfg.Poll > 0 {
		go e.watch()
	} else {
		close(e.done)
	}
	return e, nil
}

// Close stops the watcher and waits for it. Safe to call more than once.
func (e *Engine) Close() error {
	e.stopOnce.Do(func() { close(e.stop) })
	<-e.done
	return nil
}

// Policy returns the version in force.
func (e *Engine) Policy() *Policy { return e.cur.Load() }

// binding is one Bind's pair of hooks.
type binding struct {
	check   func(*Policy) error
	applied func(*Policy)
}

// Bind makes the engine ask check before a reload puts a new version in
// force (an error refuses the file, as an invalid one is refused: the
// version in force stays, the error is logged and returned by Reload) and
// tell applied after it did. A node binds itself to apply the file's
// limits (Policy.Limits). Neither hook may call the engine's Reload or
// Bind. The returned function unbinds.
func (e *Engine) Bind(check func(*Policy) error, applied func(*Policy)) (unbind func()) {
	b := &binding{check: check, applied: applied}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.binds == nil {
		e.binds = map[*binding]struct{}{}
	}
	e.binds[b] = struct{}{}
	return func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		delete(e.binds, b)
	}
}

// checkLocked asks every binding's check about p (e.mu held).
func (e *Engine) checkLocked(p *Policy) error {
	for b := range e.binds {
		if b.check != nil {
			if err := b.check(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// Snapshots lists the policy versions this engine has had in force, in the
// order they last came into force (the current one last; at most 64).
func (e *Engine) Snapshots() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.snapshots...)
}

func (e *Engine) install(p *Policy) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.installLocked(p)
}

func (e *Engine) installLocked(p *Policy) {
	e.cur.Store(p)
	for i, s := range e.snapshots {
		if s == p.Snapshot {
			e.snapshots = append(e.snapshots[:i], e.snapshots[i+1:]...)
			break
		}
	}
	e.snapshots = append(e.snapshots, p.Snapshot)
	if len(e.snapshots) > maxSnapshots {
		e.snapshots = e.snapshots[len(e.snapshots)-maxSnapshots:]
	}
}

// Check decides req under the version in force. It never fails; the error
// is there to satisfy InputPolicy.
func (e *Engine) Check(_ context.Context, req *capv1.PolicyCheckRequest) (*capv1.PolicyCheckResponse, error) {
	return e.cur.Load().Decide(req), nil
}

// Explain decides req like Check and puts the why in the reason: which
// rule matched and which of its conditions held, or that none matched.
func (e *Engine) Explain(_ context.Context, req *capv1.PolicyCheckRequest) (*capv1.PolicyCheckResponse, error) {
	return e.cur.Load().decide(req, true), nil
}

// Decide evaluates req against p.
func (p *Policy) Decide(req *capv1.PolicyCheckRequest) *capv1.PolicyCheckResponse {
	return p.decide(req, false)
}

func (p *Policy) decide(req *capv1.PolicyCheckRequest, explain bool) *capv1.PolicyCheckResponse {
	topic := req.GetTopic()
	if !strings.HasPrefix(topic, jobTopicPrefix) {
		reason := "topic " + topic + " is outside job.*"
		return &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_DENY, Reason: reason,
			RuleId: ruleNonJobTopic, PolicySnapshot: p.Snapshot}
	}
	in := readInput(req, p.DefaultTenant)
	for _, r := range p.rules {
		if !r.matches(&in) {
			continue
		}
		resp := &capv1.PolicyCheckResponse{Decision: r.decision, Reason: r.reason, RuleId: r.id,
			PolicySnapshot: p.Snapshot}
		if explain {
			resp.Reason = r.explain(&in)
			if !r.defaultReason {
				resp.Reason += " (" + r.reason + ")"
			}
		}
		// Copies, so that a caller that edits its response (the job actor
		// adjusting a budget) cannot change the policy for the next job.
		if r.constraints != nil {
			resp.Constraints = proto.Clone(r.constraints).(*capv1.PolicyConstraints)
		}
		for _, rm := range r.remediations {
			resp.Remediations = append(resp.Remediations, proto.Clone(rm).(*capv1.PolicyRemediation))
		}
		if r.decision == capv1.DecisionType_DECISION_TYPE_REQUIRE_HUMAN {
			resp.ApprovalRequired, resp.ApprovalRef = true, req.GetJobId()
		}
		return resp
	}
	reason := "no rule matched"
	if explain {
		reason = fmt.Sprintf("no rule matched (%d rules checked, tenant %s, topic %s); default allow",
			len(p.rules), in.tenant, topic)
	}
	return &capv1.PolicyCheckResponse{Decision: capv1.DecisionType_DECISION_TYPE_ALLOW, Reason: reason,
		RuleId: ruleDefaultAllow, PolicySnapshot: p.Snapshot}
}
