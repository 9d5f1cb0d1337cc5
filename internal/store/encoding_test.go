package store_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/embedded"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// TestHashListpackValueReadsTheServersSetting: the store reads the
// server's hash-max-listpack-value, and a server that refuses CONFIG GET
// (an ACL user without it, as on a managed Redis; the embedded store, which
// has no CONFIG) gives no value.
func TestHashListpackValueReadsTheServersSetting(t *testing.T) {
	t.Parallel()
	rdb := privateRedis(t)
	ctx := context.Background()
	s := store.New(rdb, store.Config{Prefix: "enc:"})
	if v, ok := s.HashListpackValue(ctx); !ok || v != 64 {
		t.Fatalf("default server: %d, %v; want 64, true", v, ok)
	}
	if err := rdb.ConfigSet(ctx, "hash-max-listpack-value", "1024").Err(); err != nil {
		t.Fatal(err)
	}
	if v, ok := s.HashListpackValue(ctx); !ok || v != 1024 {
		t.Fatalf("after CONFIG SET: %d, %v; want 1024, true", v, ok)
	}
	if err := rdb.Do(ctx, "ACL", "SETUSER", "noconfig", "on", ">pw", "~*", "&*", "+@all", "-config").Err(); err != nil {
		t.Fatal(err)
	}
	limited := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr, Username: "noconfig", Password: "pw"})
	t.Cleanup(func() { _ = limited.Close() })
	if v, ok := store.New(limited, store.Config{Prefix: "enc:"}).HashListpackValue(ctx); ok {
		t.Fatalf("CONFIG refused: %d, %v; want no value", v, ok)
	}
	emb, err := embedded.StartRedis()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Stop)
	ec := redis.NewClient(&redis.Options{Addr: emb.Addr()})
	t.Cleanup(func() { _ = ec.Close() })
	if v, ok := store.New(ec, store.Config{Prefix: "enc:"}).HashListpackValue(ctx); ok {
		t.Fatalf("embedded store: %d, %v; want no value", v, ok)
	}
}

// TestRecordStaysCompactAtTheAdvisedListpackValue: a job's record, with a
// 300-byte request and a node's dispatch and policy fields, leaves Redis's
// listpack encoding at its create under the default
// hash-max-listpack-value, and stays listpack to its terminal write under
// store.ListpackValueAdvised (what the node's start-up line advises).
func TestRecordStaysCompactAtTheAdvisedListpackValue(t *testing.T) {
	t.Parallel()
	rdb := privateRedis(t)
	ctx := context.Background()
	s := store.New(rdb, store.Config{Prefix: "enc:", LockTTL: time.Minute})
	if err := s.LoadScripts(ctx); err != nil {
		t.Fatal(err)
	}
	w := s.NewWriter(0, 0, 0)
	t.Cleanup(w.Close)
	do := func(op *store.Op) *store.Result {
		res := make(chan *store.Result, 1)
		op.Done = func(r *store.Result) { res <- r }
		w.Submit(op)
		r := <-res
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		return r
	}
	encoding := func(id string) string {
		keys, err := rdb.Keys(ctx, "enc:*:job:"+id).Result()
		if err != nil || len(keys) != 1 {
			t.Fatalf("record of %s: %v %v", id, keys, err)
		}
		return rdb.ObjectEncoding(ctx, keys[0]).Val()
	}
	for _, c := range []struct {
		value          int
		create, finish string
	}{{64, "hashtable", "hashtable"}, {store.ListpackValueAdvised, "listpack", "listpack"}} {
		if err := rdb.ConfigSet(ctx, "hash-max-listpack-value", strconv.Itoa(c.value)).Err(); err != nil {
			t.Fatal(err)
		}
		id := "enc-" + strconv.Itoa(c.value)
		r := do(&store.Op{Kind: store.OpActivate, JobID: id, Node: "enc-node", Create: true, Topic: "job.enc",
			Tenant: "default", TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", Request: []byte(strings.Repeat("r", 300)),
			T: &store.Transition{Path: []store.Hop{{To: jobstate.StateScheduled, Reason: jobstate.ReasonAllowed},
				{To: jobstate.StateDispatched, Reason: jobstate.ReasonDispatched}},
				Due: time.Now().Add(time.Hour).UnixMilli(),
				Fields: []string{"worker", "w1", "subj", "enc-node.worker.w1.jobs", "attempts", "1", "pool", "default",
					"policy_decision", "allow", "policy_reason", "allow-all policy", "rule_id", "troupe:allow-all",
					"policy_snapshot", "allow-all"}}})
		if r.Status != store.ActivateCreated {
			t.Fatalf("create %s: %+v", id, r)
		}
		if got := encoding(id); got != c.create {
			t.Fatalf("hash-max-listpack-value %d: record after its create is %s, want %s", c.value, got, c.create)
		}
		r = do(&store.Op{Kind: store.OpTransition, JobID: id, Node: "enc-node", LockValue: jobstate.LockValue("enc-node", r.Fence),
			T: &store.Transition{Expect: jobstate.Expect(jobstate.StateDispatched),
				Path: []store.Hop{{To: jobstate.StateRunning, Reason: jobstate.ReasonStarted},
					{To: jobstate.StateSucceeded, Reason: jobstate.ReasonCompleted}},
				Fields: []string{"result_ptr", "redis://res:" + id, "execution_ms", "12"}}})
		if r.Step != store.StepOK {
			t.Fatalf("finish %s: %+v", id, r)
		}
		if got := encoding(id); got != c.finish {
			t.Fatalf("hash-max-listpack-value %d: terminal record is %s, want %s", c.value, got, c.finish)
		}
	}
}
