// Package policyenv holds what the safety package and its kernel client
// (internal/policyx) share and users do not call: the reconnect backoff,
// boolean environment settings, decision labels; and what the job actor
// does with a decision (constraints.go: the env entries and deadline a
// worker receives, the job record's policy fields).
package policyenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/backoff"

	"github.com/troupe-run/troupe/proto/capv1"
)

// ReconnectBackoff caps the delay between reconnect attempts at 2 s.
var ReconnectBackoff = backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2,
	MaxDelay: 2 * time.Second}

// EnvBool reads a boolean environment variable ("": false).
func EnvBool(name string) (bool, error) {
	v := strings.TrimSpace(os.Getenv(name))
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("safety: %s=%q: want true or false", name, v)
	}
	return b, nil
}

// DecisionLabel is a policy decision's lower-case name (allow, deny, …).
func DecisionLabel(d capv1.DecisionType) string {
	return strings.ToLower(strings.TrimPrefix(d.String(), "DECISION_TYPE_"))
}
