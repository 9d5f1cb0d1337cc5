package jobactor

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"gopkg.in/yaml.v3"
)

// Timeout defaults, as the reference scheduler's timeouts.yaml has them.
const (
	// DispatchTimeoutDefault: a DISPATCHED job with no progress for this
	// long times out (its worker never picked it up).
	DispatchTimeoutDefault = 300 * time.Second
	// RunningTimeoutDefault: a RUNNING job times out after this long.
	RunningTimeoutDefault = 9000 * time.Second
)

// Timeouts are the job deadlines a node enforces.
type Timeouts struct {
	Dispatch time.Duration
	Running  time.Duration
	// PerTopic overrides Running for a topic (timeouts.yaml topics.<t>.timeout_seconds).
	PerTopic map[string]time.Duration
}

// DefaultTimeouts returns the defaults.
func DefaultTimeouts() *Timeouts {
	return &Timeouts{Dispatch: DispatchTimeoutDefault, Running: RunningTimeoutDefault}
}

// RunningFor returns the running timeout of topic.
func (t *Timeouts) RunningFor(topic string) time.Duration {
	if d, ok := t.PerTopic[topic]; ok && d > 0 {
		return d
	}
	return t.Running
}

type timeoutsFile struct {
	Reconciler struct {
		DispatchTimeoutSeconds int64 `yaml:"dispatch_timeout_seconds"`
		RunningTimeoutSeconds  int64 `yaml:"running_timeout_seconds"`
	} `yaml:"reconciler"`
	Topics map[string]struct {
		TimeoutSeconds int64 `yaml:"timeout_seconds"`
	} `yaml:"topics"`
}

// ParseTimeouts reads timeouts.yaml content:
//
//	reconciler: {dispatch_timeout_seconds: 300, running_timeout_seconds: 9000}
//	topics: {job.slow: {timeout_seconds: 36000}}
//
// Missing values keep their defaults; unknown keys are errors.
func ParseTimeouts(data []byte) (*Timeouts, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f timeoutsFile
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) { // an empty file means defaults
		return nil, fmt.Errorf("timeouts: %w", err)
	}
	t := DefaultTimeouts()
	if s := f.Reconciler.DispatchTimeoutSeconds; s > 0 {
		t.Dispatch = time.Duration(s) * time.Second
	} else if s < 0 {
		return nil, fmt.Errorf("timeouts: reconciler.dispatch_timeout_seconds must be positive")
	}
	if s := f.Reconciler.RunningTimeoutSeconds; s > 0 {
		t.Running = time.Duration(s) * time.Second
	} else if s < 0 {
		return nil, fmt.Errorf("timeouts: reconciler.running_timeout_seconds must be positive")
	}
	for topic, v := range f.Topics {
		if v.TimeoutSeconds <= 0 {
			return nil, fmt.Errorf("timeouts: topics.%s.timeout_seconds must be positive", topic)
		}
		if t.PerTopic == nil {
			t.PerTopic = map[string]time.Duration{}
		}
		t.PerTopic[topic] = time.Duration(v.TimeoutSeconds) * time.Second
	}
	return t, nil
}

// LoadTimeouts reads a timeouts.yaml file.
func LoadTimeouts(path string) (*Timeouts, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("timeouts: %w", err)
	}
	return ParseTimeouts(data)
}
