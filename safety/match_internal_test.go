package safety

import (
	"path"
	"testing"
)

// The fast paths of compiled topic patterns agree with path.Match, which
// CAP kernels use.
func TestTopicPatternAgreesWithPathMatch(t *testing.T) {
	t.Parallel()
	patterns := []string{"job.echo", "job.*", "job.db.*", "*", "job.?x", "job.[ab]*", "job.a*b", `job.\*`, "job.*.run", ""}
	topics := []string{"job.echo", "job.echo2", "job.", "job", "job.a.b", "job.db.drop", "job.db.", "job.dbx", "job/x",
		"job.x/y", "job.ax", "job.bzz", "job.ab", "job.*", "job.x.run", "", "sys.job"}
	for _, p := range patterns {
		c := compileTopic(p)
		for _, topic := range topics {
			want, _ := path.Match(p, topic)
			if got := c.match(topic); got != want {
				t.Errorf("%q ~ %q: %v, path.Match says %v", p, topic, got, want)
			}
		}
	}
}
