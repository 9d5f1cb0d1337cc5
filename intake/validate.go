package intake

import (
	"errors"
	"fmt"
	"strings"

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

func validID(id string) error {
	if id == "" {
		return errors.New("missing")
	}
	if len(id) > MaxIDLength {
		return fmt.Errorf("longer than %d characters", MaxIDLength)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.' || c == ':') {
			return fmt.Errorf("%q contains %q (allowed: letters, digits, _ - . :)", id, c)
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
	if err := validMap("labels", req.Labels, MaxLabels, MaxLabelKey, MaxLabelValue); err != nil {
		return err
	}
	if err := validMap("meta.labels", req.GetMeta().GetLabels(), MaxLabels, MaxLabelKey, MaxLabelValue); err != nil {
		return err
	}
	if err := validMap("env", req.Env, MaxEnv, MaxEnvKey, MaxEnvValue); err != nil {
		return err
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

func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] == 0x7f {
			return true
		}
	}
	return false
}
