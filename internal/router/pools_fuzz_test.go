package router_test

import (
	"errors"
	"testing"

	"github.com/troupe-run/troupe/internal/router"
)

// No pools.yaml makes the parser panic; a rejected file always says why.
func FuzzParsePools(f *testing.F) {
	for _, seed := range []string{
		"topics:\n  job.default: default\n",
		"topics:\n  job.bench: [bench, bench-b]\npools:\n  bench: {requires: [docker, git], dispatch: direct}\n",
		"topics: {}\n", "pools: {a: {requires: 1}}\n", "topics:\n  job.x: [\n", "- - -\n", "",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := router.ParsePools(data)
		if err != nil {
			if err.Error() == "" || !errors.Is(err, router.ErrInvalidPools) {
				t.Fatalf("rejection without a classified reason: %v", err)
			}
			return
		}
		if len(cfg.Topics) == 0 {
			t.Fatal("accepted a config with no topic mapping")
		}
	})
}
