package ratelimit

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
)

// rig is a limiter on a real Redis, with its grants recorded in order.
type rig struct {
	env *testenv.Env
	st  *Store
	mu  sync.Mutex
	got []string
	ch  chan string
}

func newRig(t *testing.T) *rig {
	env := testenv.New(t)
	return &rig{env: env, st: NewStore(env.Client, env.KeyPrefix()), ch: make(chan string, 100000)}
}

func (r *rig) limiter(t *testing.T, node string, buckets ...*Bucket) *Limiter {
	s := &Spec{Buckets: map[string]*Bucket{}, byTopic: map[string]*Bucket{}}
	for _, b := range buckets {
		s.Buckets[b.Name] = b
	}
	l := New(Config{Spec: s, Store: r.st, NodeID: node})
	t.Cleanup(func() { _ = l.Stop(context.Background()) })
	return l
}

func (r *rig) notify(job string) Notify {
	return func(granted bool, _ string) {
		if granted {
			r.ch <- job
		}
	}
}

// waitGrants returns the next n grants, in order (bounded in time).
func (r *rig) waitGrants(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	timeout := time.After(2 * time.Minute)
	for len(out) < n {
		select {
		case j := <-r.ch:
			out = append(out, j)
		case <-timeout:
			t.Fatalf("got %d grants of %d", len(out), n)
		}
	}
	return out
}

func TestRateLimitGrantsWaitersInArrivalOrder(t *testing.T) {
	r := newRig(t)
	b := &Bucket{Name: "order", Rate: 20, Per: time.Second, Burst: 1}
	l := r.limiter(t, "n1", b)
	var want []string
	for i := range 30 {
		job := fmt.Sprintf("job-%02d", i)
		want = append(want, job)
		if a := l.Take(job, "order", 1, 1, r.notify(job)); a != Pending {
			t.Fatalf("take %s: answer %d, want Pending (nothing granted before Start)", job, a)
		}
	}
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := r.waitGrants(t, len(want))
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("grant order %v, want %v", got, want)
	}
}

func TestRateLimitOneRedisCallForAllWaitersOfARefill(t *testing.T) {
	r := newRig(t)
	b := &Bucket{Name: "many", Rate: 1, Per: time.Hour, Burst: 5000}
	l := r.limiter(t, "n1", b)
	const waiting = 2000
	for i := range waiting {
		job := fmt.Sprintf("job-%d", i)
		l.Take(job, "many", 2, 1, r.notify(job))
	}
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.waitGrants(t, waiting)
	calls := value(l.m.Calls.WithLabelValues("many", "ok"))
	if calls != 1 {
		t.Fatalf("%d waiting jobs took %v script calls, want 1", waiting, calls)
	}
	if v := value(l.m.Granted.WithLabelValues("many")); v != 2*waiting {
		t.Fatalf("granted %v units, want %d", v, 2*waiting)
	}
}

func TestRateLimitBucketSharedAcrossReplicas(t *testing.T) {
	r := newRig(t)
	// 10 tokens and (practically) no refill: two nodes with 15 waiters
	// each get 10 grants between them, never more.
	mk := func() *Bucket { return &Bucket{Name: "shared", Rate: 1, Per: 24 * time.Hour, Burst: 10} }
	l1, l2 := r.limiter(t, "n1", mk()), r.limiter(t, "n2", mk())
	for i := range 15 {
		j1, j2 := fmt.Sprintf("a-%d", i), fmt.Sprintf("b-%d", i)
		l1.Take(j1, "shared", 1, 1, r.notify(j1))
		l2.Take(j2, "shared", 1, 1, r.notify(j2))
	}
	_ = l1.Start(context.Background())
	_ = l2.Start(context.Background())
	r.waitGrants(t, 10)
	// Both nodes have called since (each call after the tokens ran out
	// records its waiters): the bucket is empty, 20 units still wanted.
	deadline := time.Now().Add(time.Minute)
	for {
		lv, err := r.st.Read(context.Background(), mk())
		if err != nil {
			t.Fatal(err)
		}
		units := 0
		for _, w := range lv.Waiting {
			units += w.Units
		}
		if lv.Tokens < 1 && units == 20 && len(lv.Waiting) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("bucket level %v, waiters %+v; want empty, 20 units waiting on 2 nodes", lv.Tokens, lv.Waiting)
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case j := <-r.ch:
		t.Fatalf("grant %s beyond the bucket's 10 tokens", j)
	default:
	}
}

func TestRateLimitLeaveGivesGrantedUnitsToTheNextWaiter(t *testing.T) {
	r := newRig(t)
	b := &Bucket{Name: "back", Rate: 1, Per: 24 * time.Hour, Burst: 1}
	l := r.limiter(t, "n1", b)
	l.Take("first", "back", 1, 1, r.notify("first"))
	l.Take("second", "back", 1, 1, r.notify("second"))
	l.Take("third", "back", 1, 1, r.notify("third"))
	_ = l.Start(context.Background())
	if got := r.waitGrants(t, 1); got[0] != "first" {
		t.Fatalf("first grant %v", got)
	}
	l.Leave("second", "back", 1, 0) // cancelled while waiting
	l.Leave("first", "back", 1, 1)  // granted, then cancelled before dispatch
	if got := r.waitGrants(t, 1); got[0] != "third" {
		t.Fatalf("the unit given back went to %v, want third", got)
	}
	if p := l.Position("third", "back"); p != 0 {
		t.Fatalf("third still queued at %d", p)
	}
}

func TestRateLimitStateLostIsCountedAndTheBucketStartsFull(t *testing.T) {
	r := newRig(t)
	b := &Bucket{Name: "lost", Rate: 1, Per: 24 * time.Hour, Burst: 2}
	l := r.limiter(t, "n1", b)
	for i := range 3 {
		j := fmt.Sprint("j", i)
		l.Take(j, "lost", 1, 1, r.notify(j))
	}
	_ = l.Start(context.Background())
	r.waitGrants(t, 2)
	if err := r.env.Client.Del(context.Background(), r.st.Key("lost")).Err(); err != nil {
		t.Fatal(err)
	}
	r.waitGrants(t, 1)
	if v := value(l.m.StateLost.WithLabelValues("lost")); v != 1 {
		t.Fatalf("state lost counted %v times, want 1", v)
	}
}

func TestRateLimitSpecParsesBucketsAndJobDeclarations(t *testing.T) {
	s, err := Parse([]byte(`
topics:
  job.x: [default]
rate_limits:
  openai:org-1:
    limit: 500
    per: 1m
    topics: [job.summarize]
    units: 2
  slow:
    limit: 1
`))
	if err != nil {
		t.Fatal(err)
	}
	o := s.Buckets["openai:org-1"]
	if o == nil || o.Rate != 500 || o.Per != time.Minute || o.Burst != 500 || o.Units != 2 {
		t.Fatalf("openai bucket %+v", o)
	}
	job := func(topic string, labels map[string]string) *capv1.JobRequest {
		return &capv1.JobRequest{Topic: topic, Meta: &capv1.JobMetadata{Labels: labels}}
	}
	cases := []struct {
		req     *capv1.JobRequest
		bucket  string
		units   int
		problem string
	}{
		{job("job.summarize", nil), "openai:org-1", 2, ""},
		{job("job.other", nil), "", 0, ""},
		{job("job.other", map[string]string{LabelBucket: "slow"}), "slow", 1, ""},
		{job("job.summarize", map[string]string{LabelUnits: "7"}), "openai:org-1", 7, ""},
		{job("job.other", map[string]string{LabelBucket: "nope"}), "", 0, "not declared"},
		{job("job.other", map[string]string{LabelBucket: "slow", LabelUnits: "2"}), "", 0, "never grantable"},
		{job("job.summarize", map[string]string{LabelUnits: "-1"}), "", 0, "positive"},
	}
	for _, c := range cases {
		b, u, p := s.ForJob(c.req)
		if b != c.bucket || u != c.units || (c.problem == "") != (p == "") || !strings.Contains(p, c.problem) {
			t.Errorf("%v: got %q %d %q, want %q %d %q", c.req, b, u, p, c.bucket, c.units, c.problem)
		}
	}
	for _, bad := range []string{
		"rate_limits:\n  a:\n    per: 1s\n",
		"rate_limits:\n  a:\n    limit: 0\n",
		"rate_limits:\n  a:\n    limit: 5\n    burst: 2\n    units: 3\n",
		"rate_limits:\n  a:\n    limit: 5\n    colour: red\n",
		"rate_limits:\n  a{b}:\n    limit: 5\n",
		"rate_limits:\n  a:\n    limit: 5\n    topics: [t]\n  b:\n    limit: 5\n    topics: [t]\n",
		"rate_limits: [1, 2]\n",
	} {
		if _, err := Parse([]byte(bad)); err == nil || !strings.Contains(err.Error(), "line ") {
			t.Errorf("%q: error %v, want one naming its line", bad, err)
		}
	}
	if s, err := Parse([]byte("topics:\n  a: [b]\n")); err != nil || !s.Empty() {
		t.Fatalf("no section: %v %v", s, err)
	}
}

func value(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// never records the jobs told they will never be granted, with why.
type never struct{ ch chan string }

func (n never) notify(r *rig, job string) Notify {
	return func(granted bool, problem string) {
		switch {
		case problem != "":
			n.ch <- job + ": " + problem
		case granted:
			r.ch <- job
		}
	}
}

func specOf(buckets ...*Bucket) *Spec {
	s := &Spec{Buckets: map[string]*Bucket{}, byTopic: map[string]*Bucket{}}
	for _, b := range buckets {
		s.Buckets[b.Name] = b
	}
	return s
}

// waitCalls waits until the limiter has called bucket's script n more times
// than before (bounded in time).
func waitCalls(t *testing.T, l *Limiter, bucket string, before float64, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for value(l.m.Calls.WithLabelValues(bucket, "ok")) < before+float64(n) {
		if time.Now().After(deadline) {
			t.Fatalf("bucket %s: fewer than %d calls in 30 s", bucket, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestRateLimitReloadCarriesTheLevelClampedToTheNewBurst(t *testing.T) {
	r := newRig(t)
	// No refill to speak of: only what the bucket holds is granted.
	down := &Bucket{Name: "down", Rate: 1, Per: 24 * time.Hour, Burst: 10}
	up := &Bucket{Name: "up", Rate: 1, Per: 24 * time.Hour, Burst: 10}
	l := r.limiter(t, "n1", down, up)
	_ = l.Start(context.Background())
	for i := range 8 { // 4 units of each: both hold 6
		b := []string{"down", "up"}[i%2]
		j := fmt.Sprint(b, "-", i)
		l.Take(j, b, 1, 1, r.notify(j))
	}
	r.waitGrants(t, 8)
	// down's burst cut to 3 (its 6 become 3), up's raised to 20 (its 6
	// stay 6: a reload is no refill).
	l.Apply(specOf(&Bucket{Name: "down", Rate: 1, Per: 24 * time.Hour, Burst: 3},
		&Bucket{Name: "up", Rate: 1, Per: 24 * time.Hour, Burst: 20}))
	for _, c := range []struct {
		bucket string
		want   int
	}{{"down", 3}, {"up", 6}} {
		calls := value(l.m.Calls.WithLabelValues(c.bucket, "ok"))
		for i := range 10 {
			j := fmt.Sprint(c.bucket, "-after-", i)
			l.Take(j, c.bucket, 1, 2, r.notify(j))
		}
		got := r.waitGrants(t, c.want)
		// Two more calls: the one that granted and one after it (the
		// wait is queued; nothing more is granted).
		waitCalls(t, l, c.bucket, calls, 2)
		select {
		case j := <-r.ch:
			t.Fatalf("%s: grant %s beyond the %d tokens the reload left (got %v)", c.bucket, j, c.want, got)
		default:
		}
		if p := l.Position(fmt.Sprint(c.bucket, "-after-", c.want), c.bucket); p != 1 {
			t.Fatalf("%s: the first job not granted is at %d, want 1", c.bucket, p)
		}
		lv, err := r.st.Read(context.Background(), l.Spec().Buckets[c.bucket])
		if err != nil || lv.Burst != map[string]int{"down": 3, "up": 20}[c.bucket] || lv.Tokens >= 1 {
			t.Fatalf("%s: Redis level %+v (%v), want the new burst and under a token", c.bucket, lv, err)
		}
		// Leave the queue so the limiter stops calling.
		for i := c.want; i < 10; i++ {
			l.Leave(fmt.Sprint(c.bucket, "-after-", i), c.bucket, 2, 0)
		}
	}
}

func TestRateLimitReloadRemovedBucketTellsItsWaitersNever(t *testing.T) {
	r := newRig(t)
	nv := never{ch: make(chan string, 10)}
	gone := &Bucket{Name: "gone", Rate: 1, Per: 24 * time.Hour, Burst: 1}
	cut := &Bucket{Name: "cut", Rate: 1, Per: 24 * time.Hour, Burst: 5}
	l := r.limiter(t, "n1", gone, cut)
	_ = l.Start(context.Background())
	for _, j := range []string{"g1", "g2", "g3"} {
		l.Take(j, "gone", 1, 1, nv.notify(r, j))
	}
	if got := r.waitGrants(t, 1); got[0] != "g1" {
		t.Fatalf("first grant %v, want g1", got)
	}
	// cut: one job of 5 units takes the burst; one of 4 and one of 1 wait.
	l.Take("c5", "cut", 5, 1, nv.notify(r, "c5"))
	r.waitGrants(t, 1)
	l.Take("c4", "cut", 4, 1, nv.notify(r, "c4"))
	l.Take("c1", "cut", 1, 1, nv.notify(r, "c1"))
	told := l.Apply(specOf(&Bucket{Name: "cut", Rate: 1, Per: 24 * time.Hour, Burst: 3}))
	if told != 3 {
		t.Fatalf("Apply told %d waiters, want 3 (g2, g3, c4)", told)
	}
	var msgs []string
	for range 3 {
		select {
		case m := <-nv.ch:
			msgs = append(msgs, m)
		case <-time.After(10 * time.Second):
			t.Fatalf("told %v only", msgs)
		}
	}
	all := strings.Join(msgs, "\n")
	for _, want := range []string{`g2: rate limit bucket "gone" is no longer declared`, `g3: rate limit bucket "gone"`,
		`c4: rate limit bucket "cut"'s burst is now 3`} {
		if !strings.Contains(all, want) {
			t.Errorf("told %q, want a line with %q", all, want)
		}
	}
	if p := l.Position("c1", "cut"); p != 1 {
		t.Fatalf("c1 (1 unit, within the new burst) at %d, want still queued first", p)
	}
	if a := l.Take("g4", "gone", 1, 1, nv.notify(r, "g4")); a != Unknown {
		t.Fatalf("take on a removed bucket: %d, want Unknown", a)
	}
	if a := l.Take("c9", "cut", 4, 1, nv.notify(r, "c9")); a != Unknown {
		t.Fatalf("take of 4 units of a burst of 3: %d, want Unknown", a)
	}
	if b, _, p := l.ForJob(&capv1.JobRequest{Meta: &capv1.JobMetadata{Labels: map[string]string{LabelBucket: "gone"}}}); b != "" || p == "" {
		t.Fatalf("a new job naming the removed bucket: bucket %q problem %q, want a problem", b, p)
	}
}

func TestRateLimitReloadAddsABucketThatGrants(t *testing.T) {
	r := newRig(t)
	l := r.limiter(t, "n1", &Bucket{Name: "old", Rate: 1, Per: time.Second, Burst: 1})
	_ = l.Start(context.Background())
	if a := l.Take("x", "new", 1, 1, r.notify("x")); a != Unknown {
		t.Fatalf("take before the bucket exists: %d, want Unknown", a)
	}
	l.Apply(specOf(&Bucket{Name: "old", Rate: 1, Per: time.Second, Burst: 1},
		&Bucket{Name: "new", Rate: 10, Per: time.Second, Burst: 2}))
	for _, j := range []string{"n1", "n2"} {
		if a := l.Take(j, "new", 1, 1, r.notify(j)); a != Pending {
			t.Fatalf("take %s on the added bucket: %d, want Pending", j, a)
		}
	}
	if got := r.waitGrants(t, 2); strings.Join(got, ",") != "n1,n2" {
		t.Fatalf("grants %v, want n1,n2", got)
	}
}

// A parked ask keeps its place: its grant goes to the wake (not to the
// actor that asked), "not yet" is not told, the job's next actor's Take
// takes the place again, and Leave under epoch 0 drops it.
func TestRateLimitParkedAskKeepsItsPlace(t *testing.T) {
	r := newRig(t)
	b := &Bucket{Name: "park", Rate: 1, Per: 24 * time.Hour, Burst: 1}
	l := r.limiter(t, "n1", b)
	asked := make(chan string, 10)
	actor := func(job string) Notify {
		return func(granted bool, problem string) { asked <- fmt.Sprint(job, granted, problem) }
	}
	l.Take("first", "park", 1, 1, r.notify("first"))
	l.Take("parked", "park", 1, 5, actor("parked"))
	l.Take("left", "park", 1, 3, actor("left"))
	if !l.Park("parked", "park", 5, r.notify("parked-woken")) {
		t.Fatal("a queued ask could not park")
	}
	if l.Park("parked", "park", 5, r.notify("x")) {
		t.Fatal("parked twice under the same epoch")
	}
	if !l.Park("left", "park", 3, r.notify("left-woken")) {
		t.Fatal("a queued ask could not park")
	}
	l.Leave("left", "park", 0, 0) // its next actor left (a cancel)
	_ = l.Start(context.Background())
	if got := r.waitGrants(t, 1); got[0] != "first" {
		t.Fatalf("first grant %v", got)
	}
	if p := l.Position("parked", "park"); p != 1 {
		t.Fatalf("the parked ask's place %d, want 1", p)
	}
	if p := l.Position("left", "park"); p != 0 {
		t.Fatalf("a parked ask left under epoch 0 is still queued at %d", p)
	}
	l.Leave("first", "park", 1, 1) // its unit back: the parked ask is next
	if got := r.waitGrants(t, 1); got[0] != "parked-woken" {
		t.Fatalf("the unit went to %v, want the parked ask's wake", got)
	}
	select {
	case m := <-asked:
		t.Fatalf("the actor that parked was told %q", m)
	default:
	}
}
