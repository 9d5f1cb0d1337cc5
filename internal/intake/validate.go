package intake

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/logx"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Validation limits. Ids, topics and tenants become parts of Redis keys and
// NATS subjects; labels and env travel with every dispatch and are stored
// with the job. The limits keep one bad submit from costing more than any
// other, and every rejection says which limit it broke.
const (
	// MaxPacketBytes bounds a packet (NATS's default max_payload is 1 MiB).
	MaxPacketBytes = 1 << 20
	// MaxIDLength bounds job, worker and tenant ids.
	MaxIDLength = 128
	// MaxTopicLength bounds a topic (it becomes a pool subject).
	MaxTopicLength = 256
	// MaxLabels, MaxLabelKey and MaxLabelValue bound labels (and meta.labels).
	MaxLabels     = 64
	MaxLabelKey   = 128
	MaxLabelValue = 1024
	// MaxEnv, MaxEnvKey and MaxEnvValue bound the env map.
	MaxEnv      = 128
	MaxEnvKey   = 256
	MaxEnvValue = 64 << 10
	// MaxIdempotencyKey bounds meta.idempotency_key (part of a Redis key).
	MaxIdempotencyKey = 256
	// MaxLabelBytes bounds labels and meta.labels together (keys and
	// values): every label travels with each dispatch and is stored with
	// the job for its retention, so 64 values of 1 KiB in both maps made
	// one job a 128 KiB record.
	MaxLabelBytes = 16 << 10
	// MaxEnvBytes bounds the env map (keys and values together), for the
	// same reason; one value may still be MaxEnvValue.
	MaxEnvBytes = 64 << 10
	// MaxRequestBytes bounds the whole JobRequest as encoded: the record
	// keeps it for 24 h after the job ends, and fields without a bound of
	// their own (context_ptr, budget, compensation, ...) add up.
	MaxRequestBytes = 128 << 10
	// MaxPoolName bounds a heartbeat's pool name: it is a metric label and
	// a routing key.
	MaxPoolName = 64
	// MaxHeartbeatLabels, MaxCapabilities and MaxHeartbeatField bound what
	// a heartbeat adds to the registry and to /v1/workers.
	MaxHeartbeatLabels = 32
	MaxCapabilities    = 64
	MaxHeartbeatField  = 128
)

// ErrInvalid wraps every validation error.
var ErrInvalid = errors.New("invalid")

// ValidateJobID accepts 1..MaxIDLength characters of [A-Za-z0-9_.:-]: nothing
// that could split a Redis key or inject a NATS wildcard or token.
func ValidateJobID(id string) error {
	if err := validID(id); err != nil {
		return fmt.Errorf("%w job_id: %v", ErrInvalid, err)
	}
	return nil
}

// ValidateEventJobID checks the job id of a result or progress: a job id,
// or the id of one of its attempts ("<job_id>~a<n>", jobstate.AttemptID),
// which a job that may retry is dispatched under.
func ValidateEventJobID(id string) error {
	return ValidateJobID(JobOf(id))
}

// JobOf is the job a result's or progress's job id names (an attempt id
// names its job).
func JobOf(id string) string {
	base, _ := jobstate.SplitAttempt(id)
	return base
}

// ValidateWorkerID applies the job id rules to a worker id, minus '.', since
// it becomes one token of worker.<id>.jobs.
func ValidateWorkerID(id string) error {
	if err := validID(id); err != nil {
		return fmt.Errorf("%w worker_id: %v", ErrInvalid, err)
	}
	for i := 0; i < len(id); i++ {
		if id[i] == '.' {
			return fmt.Errorf("%w worker_id: %q contains '.'", ErrInvalid, id)
		}
	}
	return nil
}

func validID(id string) error { return validName(id, MaxIDLength) }

// validName accepts 1..max characters of [A-Za-z0-9_.:-]. Its errors quote
// the name clipped (logx.Clip): they end up in logs and DLQ entries.
func validName(id string, max int) error {
	if id == "" {
		return errors.New("missing")
	}
	if len(id) > max {
		return fmt.Errorf("%d characters, at most %d", len(id), max)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.' || c == ':') {
			return fmt.Errorf("%q contains %q (allowed: letters, digits, _ - . :)", logx.Clip(id), c)
		}
	}
	return nil
}

// ValidatePoolName accepts 1..MaxPoolName characters of [A-Za-z0-9_.:-].
func ValidatePoolName(pool string) error {
	if err := validName(pool, MaxPoolName); err != nil {
		return fmt.Errorf("%w pool: %v", ErrInvalid, err)
	}
	return nil
}

// ValidateHeartbeat checks what a heartbeat puts in the registry: the
// worker id, a pool name (empty: the worker names none), region and type,
// labels and capabilities, each bounded.
func ValidateHeartbeat(hb *capv1.Heartbeat) error {
	if err := ValidateWorkerID(hb.GetWorkerId()); err != nil {
		return err
	}
	if p := hb.GetPool(); p != "" {
		if err := ValidatePoolName(p); err != nil {
			return err
		}
	}
	for name, v := range map[string]string{"region": hb.GetRegion(), "type": hb.GetType()} {
		if len(v) > MaxHeartbeatField || hasControl(v) {
			return fmt.Errorf("%w %s: longer than %d bytes or has control characters", ErrInvalid, name, MaxHeartbeatField)
		}
	}
	if err := validMap("labels", hb.GetLabels(), MaxHeartbeatLabels, MaxLabelKey, MaxHeartbeatField); err != nil {
		return err
	}
	if n := len(hb.GetCapabilities()); n > MaxCapabilities {
		return fmt.Errorf("%w capabilities: %d, at most %d", ErrInvalid, n, MaxCapabilities)
	}
	for _, c := range hb.GetCapabilities() {
		if len(c) > MaxHeartbeatField || hasControl(c) {
			return fmt.Errorf("%w capabilities: an entry longer than %d bytes or with control characters", ErrInvalid, MaxHeartbeatField)
		}
	}
	return nil
}

// ValidateRequest checks what Troupe needs of a JobRequest before it takes it.
func ValidateRequest(req *capv1.JobRequest) error {
	if err := ValidateJobID(req.JobId); err != nil {
		return err
	}
	t := req.Topic
	if t == "" {
		return fmt.Errorf("%w topic: missing", ErrInvalid)
	}
	if len(t) > MaxTopicLength {
		return fmt.Errorf("%w topic: longer than %d characters", ErrInvalid, MaxTopicLength)
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if c <= ' ' || c == '*' || c == '>' || c == 0x7f {
			return fmt.Errorf("%w topic: %q contains %q", ErrInvalid, t, c)
		}
	}
	if t[0] == '.' || t[len(t)-1] == '.' || strings.Contains(t, "..") {
		return fmt.Errorf("%w topic: %q has an empty token", ErrInvalid, t)
	}
	if req.TenantId != "" {
		if err := validID(req.TenantId); err != nil {
			return fmt.Errorf("%w tenant_id: %v", ErrInvalid, err)
		}
	}
	// Without tenant_id the job's tenant is env.tenant_id (safety.TenantOf):
	// the same rules, since it becomes the same keys, labels and listings.
	if t, ok := req.Env["tenant_id"]; ok && req.TenantId == "" {
		if err := validID(t); err != nil {
			return fmt.Errorf("%w env.tenant_id: %v", ErrInvalid, err)
		}
	}
	if err := validMap("labels", req.Labels, MaxLabels, MaxLabelKey, MaxLabelValue); err != nil {
		return err
	}
	if err := validMap("meta.labels", req.GetMeta().GetLabels(), MaxLabels, MaxLabelKey, MaxLabelValue); err != nil {
		return err
	}
	if n := mapBytes(req.Labels) + mapBytes(req.GetMeta().GetLabels()); n > MaxLabelBytes {
		return fmt.Errorf("%w labels: %d bytes with meta.labels, at most %d", ErrInvalid, n, MaxLabelBytes)
	}
	if err := validMap("env", req.Env, MaxEnv, MaxEnvKey, MaxEnvValue); err != nil {
		return err
	}
	if _, err := jobstate.RetryPolicyOf(req, jobstate.RetryPolicy{}); err != nil {
		return fmt.Errorf("%w meta.labels: %v", ErrInvalid, err)
	}
	if n := mapBytes(req.Env); n > MaxEnvBytes {
		return fmt.Errorf("%w env: %d bytes, at most %d", ErrInvalid, n, MaxEnvBytes)
	}
	if n := proto.Size(req); n > MaxRequestBytes {
		return fmt.Errorf("%w request: %d bytes encoded, at most %d", ErrInvalid, n, MaxRequestBytes)
	}
	if k := req.GetMeta().GetIdempotencyKey(); len(k) > MaxIdempotencyKey || hasControl(k) {
		return fmt.Errorf("%w meta.idempotency_key: longer than %d bytes or has control characters", ErrInvalid, MaxIdempotencyKey)
	}
	return nil
}

func validMap(name string, m map[string]string, maxEntries, maxKey, maxValue int) error {
	if len(m) > maxEntries {
		return fmt.Errorf("%w %s: %d entries, at most %d", ErrInvalid, name, len(m), maxEntries)
	}
	for k, v := range m {
		switch {
		case k == "" || len(k) > maxKey || hasControl(k):
			return fmt.Errorf("%w %s: key %.40q is empty, longer than %d bytes or has control characters",
				ErrInvalid, name, k, maxKey)
		case len(v) > maxValue:
			return fmt.Errorf("%w %s: value of %.40q is %d bytes, at most %d", ErrInvalid, name, k, len(v), maxValue)
		}
	}
	return nil
}

func mapBytes(m map[string]string) int {
	n := 0
	for k, v := range m {
		n += len(k) + len(v)
	}
	return n
}

func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] == 0x7f {
			return true
		}
	}
	return false
}
