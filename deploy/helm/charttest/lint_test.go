package charttest

import (
	"testing"

	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
)

// TestChartLint runs Helm's own linter (what `helm lint` runs) over the
// chart with its default values and with the example worker and the
// ServiceMonitor on: no warning or error.
func TestChartLint(t *testing.T) {
	for name, values := range map[string]map[string]any{
		"defaults": nil,
		"everything": {"worker": map[string]any{"enabled": true}, "serviceMonitor": map[string]any{"enabled": true},
			"signing": map[string]any{"enabled": true, "signKey": "k", "verifyKeys": "v"}},
	} {
		l := lint.All(chartDir, values, "jobs", false)
		for _, m := range l.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("%s: %s", name, m)
			} else {
				t.Logf("%s: %s", name, m)
			}
		}
	}
}
