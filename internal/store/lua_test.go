package store

import (
	"context"
	"testing"

	"github.com/troupe-run/troupe/internal/testenv"
)

// TestEveryLuaScriptLoads loads every embedded script (SCRIPT LOAD) on the
// test's Redis, which compiles it, and checks that Redis names it by the
// SHA-1 that EVALSHA sends.
func TestEveryLuaScriptLoads(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx := context.Background()
	if len(luaScripts) == 0 {
		t.Fatal("no scripts")
	}
	for name, sc := range luaScripts {
		sha, err := sc.Load(ctx, env.Client).Result()
		if err != nil {
			t.Errorf("SCRIPT LOAD %s: %v", name, err)
			continue
		}
		if sha != sc.Hash() {
			t.Errorf("SCRIPT LOAD %s: Redis named it %s, EVALSHA sends %s", name, sha, sc.Hash())
		}
	}
}
