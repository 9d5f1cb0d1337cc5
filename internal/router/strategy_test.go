package router

import (
	"strconv"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/registry"
	"github.com/troupe-run/troupe/proto/capv1"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type strategyBundle struct {
	s     *Strategy
	reg   *registry.Registry
	stale map[string]int // worker → stale picks reported
}

func setupStrategy(t *testing.T, pools string) *strategyBundle {
	t.Helper()
	cfg, err := ParsePools([]byte(pools))
	if err != nil {
		t.Fatal(err)
	}
	b := &strategyBundle{reg: registry.New(time.Minute), stale: map[string]int{}}
	b.s = NewStrategy(cfg, b.reg, nil, nil)
	b.s.onStale = func(_, id string) { b.stale[id]++ }
	return b
}

// beat records a heartbeat at t0 and returns the worker.
func (b *strategyBundle) beat(id, pool string, mutate ...func(*capv1.Heartbeat)) *registry.Worker {
	hb := &capv1.Heartbeat{WorkerId: id, Pool: pool}
	for _, m := range mutate {
		m(hb)
	}
	return b.reg.Observe(hb, t0)
}

func active(n int32) func(*capv1.Heartbeat) {
	return func(hb *capv1.Heartbeat) { hb.ActiveJobs = n }
}

func labels(kv ...string) func(*capv1.Heartbeat) {
	return func(hb *capv1.Heartbeat) {
		hb.Labels = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			hb.Labels[kv[i]] = kv[i+1]
		}
	}
}

func job(topic string, kv ...string) *capv1.JobRequest {
	req := &capv1.JobRequest{JobId: "j", Topic: topic, Labels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Labels[kv[i]] = kv[i+1]
	}
	return req
}

func wantWorker(t *testing.T, p Pick, id string) {
	t.Helper()
	if p.Reason != "" || p.Worker == nil || p.Worker.ID != id {
		t.Fatalf("pick = %+v (reason %q %s), want worker %s", p.Worker, p.Reason, p.Detail, id)
	}
}

func wantReason(t *testing.T, p Pick, r jobstate.Reason) {
	t.Helper()
	if p.Reason != r {
		t.Fatalf("reason = %q (%s), want %q", p.Reason, p.Detail, r)
	}
}

const twoPools = `
topics:
  job.a: a
  job.ab: [a, b]
  job.gpu: [a, gpu]
pools:
  a: {requires: []}
  b: {requires: []}
  gpu: {requires: [GPU, docker]}
`

func TestPickTopicUnmapped(t *testing.T) {
	t.Parallel()
	b := setupStrategy(t, twoPools)
	b.beat("w1", "a")
	wantReason(t, b.s.Pick(job("job.nope"), t0), jobstate.ReasonTopicUnmapped)
}

func TestPickPreferredPoolNarrows(t *testing.T) {
	t.Parallel()
	b := setupStrategy(t, twoPools)
	b.beat("idle-a", "a")
	b.beat("busy-b", "b", active(5))
	wantWorker(t, b.s.Pick(job("job.ab"), t0), "idle-a")
	wantWorker(t, b.s.Pick(job("job.ab", LabelPreferredPool, "b"), t0), "busy-b")
}

func TestPickPreferredPoolUnmapped(t *testing.T) {
	t.Parallel()
	b := setupStrategy(t, twoPools)
	b.beat("w1", "a")
	b.beat("w2", "b")
	// b exists, but not for this topic.
	wantReason(t, b.s.Pick(job("job.a", LabelPreferredPool, "b"), t0), jobstate.ReasonPreferredPoolUnmapped)
}

func TestPickRequiresUnsatisfied(t *testing.T) {
	t.Parallel()
	b := setupStrategy(t, twoPools)
	b.beat("w-a", "a")
	b.beat("w-gpu", "gpu", active(3))
	req := job("job.gpu")
	req.Meta = &capv1.JobMetadata{Requires: []string{"gpu", "k8s"}}
	wantReason(t, b.s.Pick(req, t0), jobstate.ReasonRequiresUnsatisfied)
	// Pools must cover requires, case-insensitively: only pool gpu does.
	req.Meta.Requires = []string{"gpu", "Docker"}
	wantWorker(t, b.s.Pick(req, t0), "w-gpu")
}

func TestPickPlacementLabels(t *testing.T) {
	t.Parallel()
	b := setupStrategy(t, twoPools)
	b.beat("eu-idle", "a", labels("region", "eu"))
	b.beat("us-idle", "a", labels("region", "us"))
	b.beat("eu-busy", "a", labels("region", "eu", "tier", "gold"), active(2))
	// Labels that describe the job, not where it runs, do not constrain.
	descr := []string{"workflow_id", "wf1", "cordum.bus_msg_id", "m1", "preferred_worker_id", "nobody", "step_id", "s1"}
	wantWorker(t, b.s.Pick(job("job.a", append([]string{"region", "eu"}, descr...)...), t0), "eu-idle")
	wantWorker(t, b.s.Pick(job("job.a", "region", "eu", "tier", "gold"), t0), "eu-busy")
	wantReason(t, b.s.Pick(job("job.a", "region", "apac"), t0), jobstate.ReasonNoWorkers)
}

func TestPickPreferredWorker(t *testing.T) {
	t.Parallel()
	b := setupStrategy(t, twoPools)
	b.beat("idle", "a")
	b.beat("fav", "a", active(3))
	b.beat("full", "a", func(hb *capv1.Heartbeat) { hb.ActiveJobs, hb.MaxParallelJobs = 10, 10 })
	b.beat("elsewhere", "b")

	wantWorker(t, b.s.Pick(job("job.a", LabelPreferredWorker, "fav"), t0), "fav")
	// Overloaded, unknown, or not a candidate for the topic: least loaded instead.
	wantWorker(t, b.s.Pick(job("job.a", LabelPreferredWorker, "full"), t0), "idle")
	wantWorker(t, b.s.Pick(job("job.a", LabelPreferredWorker, "ghost"), t0), "idle")
	wantWorker(t, b.s.Pick(job("job.a", LabelPreferredWorker, "elsewhere"), t0), "idle")
	// Stale: re-picked, and counted.
	b.reg.Observe(&capv1.Heartbeat{WorkerId: "fav", Pool: "a"}, t0.Add(-2*time.Minute))
	wantWorker(t, b.s.Pick(job("job.a", LabelPreferredWorker, "fav"), t0), "idle")
	if b.stale["fav"] != 1 {
		t.Fatalf("stale picks of fav = %d, want 1", b.stale["fav"])
	}
}

func TestPickLowestScore(t *testing.T) {
	t.Parallel()
	b := setupStrategy(t, twoPools)
	// score = active + cpu/100 + gpu/100
	b.beat("w1", "a", func(hb *capv1.Heartbeat) { hb.ActiveJobs, hb.CpuLoad = 1, 10 })      // 1.10
	b.beat("w2", "a", func(hb *capv1.Heartbeat) { hb.CpuLoad, hb.GpuUtilization = 60, 60 }) // 1.20
	b.beat("w3", "b", func(hb *capv1.Heartbeat) { hb.CpuLoad, hb.GpuUtilization = 50, 55 }) // 1.05
	wantWorker(t, b.s.Pick(job("job.ab"), t0), "w3")
	wantWorker(t, b.s.Pick(job("job.ab"), t0), "w1")
	wantWorker(t, b.s.Pick(job("job.ab"), t0), "w2")
}

func TestPickOverloadedPool(t *testing.T) {
	t.Parallel()
	b := setupStrategy(t, twoPools)
	b.beat("ratio", "a", func(hb *capv1.Heartbeat) { hb.ActiveJobs, hb.MaxParallelJobs = 10, 10 })
	b.beat("cpu", "a", func(hb *capv1.Heartbeat) { hb.CpuLoad = 90 })
	b.beat("gpu", "a", func(hb *capv1.Heartbeat) { hb.GpuUtilization = 90 })
	wantReason(t, b.s.Pick(job("job.a"), t0), jobstate.ReasonPoolOverloaded)
	wantReason(t, b.s.Pick(job("job.a", "zone", "x"), t0), jobstate.ReasonNoWorkers)
}

func TestPickPerPoolOverloadThresholds(t *testing.T) {
	t.Parallel()
	b := setupStrategy(t, `
topics: {job.a: a}
pools:
  a: {overload: {active_ratio: 0.5, cpu_load: 50}}
`)
	b.beat("half", "a", func(hb *capv1.Heartbeat) { hb.ActiveJobs, hb.MaxParallelJobs = 2, 4 })
	b.beat("warm", "a", func(hb *capv1.Heartbeat) { hb.CpuLoad = 55 })
	wantReason(t, b.s.Pick(job("job.a"), t0), jobstate.ReasonPoolOverloaded)
	// Lifting the thresholds at runtime (SetPools) frees them.
	cfg, _ := ParsePools([]byte("topics: {job.a: a}\n"))
	b.s.SetConfig(cfg)
	wantWorker(t, b.s.Pick(job("job.a"), t0), "warm")
}

func TestPickNoWorkers(t *testing.T) {
	t.Parallel()
	b := setupStrategy(t, twoPools)
	b.beat("w-b", "b")
	wantReason(t, b.s.Pick(job("job.a"), t0), jobstate.ReasonNoWorkers)
}

func TestPickBurstSpreadsBetweenHeartbeats(t *testing.T) {
	t.Parallel()
	b := setupStrategy(t, twoPools)
	for i := range 10 {
		b.beat("w"+strconv.Itoa(i), "a", func(hb *capv1.Heartbeat) { hb.MaxParallelJobs = 1000 })
	}
	got := map[string]int{}
	for range 1000 {
		p := b.s.Pick(job("job.a"), t0)
		if p.Worker == nil {
			t.Fatalf("pick failed: %s %s", p.Reason, p.Detail)
		}
		got[p.Worker.ID]++
	}
	for id, n := range got {
		if n > 150 {
			t.Fatalf("worker %s got %d of 1000 jobs (> 15%%): %v", id, n, got)
		}
	}
	if len(got) != 10 {
		t.Fatalf("only %d of 10 workers got jobs: %v", len(got), got)
	}
}

func TestPickTieBreakIsRandom(t *testing.T) {
	t.Parallel()
	b := setupStrategy(t, twoPools)
	ids := []string{"w0", "w1", "w2", "w3"}
	first := map[string]int{}
	const rounds = 400
	for range rounds {
		for _, id := range ids { // equal heartbeats: four-way tie
			b.beat(id, "a")
		}
		first[b.s.Pick(job("job.a"), t0).Worker.ID]++
	}
	// Fair would be 100 each; 40 is seven standard deviations below.
	for _, id := range ids {
		if first[id] < 40 {
			t.Fatalf("tie-break not random: first picks %v", first)
		}
	}
}

func TestPickRepicksStaleWorker(t *testing.T) {
	t.Parallel()
	b := setupStrategy(t, twoPools)
	b.beat("quiet", "a") // least loaded, but its beat is old
	b.reg.Observe(&capv1.Heartbeat{WorkerId: "quiet", Pool: "a"}, t0.Add(-2*time.Minute))
	b.beat("alive", "a", active(4))
	wantWorker(t, b.s.Pick(job("job.a"), t0), "alive")
	if b.stale["quiet"] != 1 {
		t.Fatalf("stale picks = %v, want quiet:1", b.stale)
	}
	// Pulled out: the next pick does not meet it again.
	wantWorker(t, b.s.Pick(job("job.a"), t0), "alive")
	if b.stale["quiet"] != 1 {
		t.Fatalf("stale worker met twice: %v", b.stale)
	}
	// Its next heartbeat brings it back.
	b.beat("quiet", "a")
	wantWorker(t, b.s.Pick(job("job.a"), t0), "quiet")
}

func TestPickStaleLoopExhaustion(t *testing.T) {
	t.Parallel()
	b := setupStrategy(t, twoPools)
	old := t0.Add(-2 * time.Minute)
	for i := range 5 {
		b.reg.Observe(&capv1.Heartbeat{WorkerId: "dead" + strconv.Itoa(i), Pool: "a"}, old)
	}
	b.beat("alive", "a", active(9))

	p := b.s.Pick(job("job.a"), t0)
	wantReason(t, p, jobstate.ReasonStaleWorker)
	total := 0
	for _, n := range b.stale {
		total += n
	}
	// The first stale pick and three re-picks.
	if total != 1+StaleRetriesDefault {
		t.Fatalf("stale picks counted = %d, want %d: %v", total, 1+StaleRetriesDefault, b.stale)
	}
	// One dead worker is left ahead of the live one: the next pick gets past it.
	wantWorker(t, b.s.Pick(job("job.a"), t0), "alive")
	if len(b.stale) != 5 {
		t.Fatalf("stale workers met = %v, want all 5", b.stale)
	}
}

func TestPickOnlyStaleWorkersLeaveStaleWorkerNotNoWorkers(t *testing.T) {
	t.Parallel()
	b := setupStrategy(t, twoPools)
	b.reg.Observe(&capv1.Heartbeat{WorkerId: "dead", Pool: "a"}, t0.Add(-2*time.Minute))
	wantReason(t, b.s.Pick(job("job.a"), t0), jobstate.ReasonStaleWorker)
	// Until the sweep evicts it, the pool's known workers are stale.
	wantReason(t, b.s.Pick(job("job.a"), t0), jobstate.ReasonStaleWorker)
	b.reg.Sweep(t0)
	wantReason(t, b.s.Pick(job("job.a"), t0), jobstate.ReasonNoWorkers)
}

func TestPickStaleRetriesConfigurable(t *testing.T) {
	t.Parallel()
	b := setupStrategy(t, twoPools)
	b.s.staleRetries = 0
	b.reg.Observe(&capv1.Heartbeat{WorkerId: "dead", Pool: "a"}, t0.Add(-2*time.Minute))
	b.beat("alive", "a", active(1))
	wantReason(t, b.s.Pick(job("job.a"), t0), jobstate.ReasonStaleWorker)
	wantWorker(t, b.s.Pick(job("job.a"), t0), "alive")
	// A stale preferred worker is a stale pick like any other.
	b.reg.Observe(&capv1.Heartbeat{WorkerId: "dead", Pool: "a"}, t0.Add(-2*time.Minute))
	wantReason(t, b.s.Pick(job("job.a", LabelPreferredWorker, "dead"), t0), jobstate.ReasonStaleWorker)
}

func TestPickSubjectFollowsDispatchMode(t *testing.T) {
	t.Parallel()
	b := setupStrategy(t, `
topics: {job.auto: auto, job.pool: pool, job.direct: direct}
pools:
  auto: {}
  pool: {dispatch: pool}
  direct: {dispatch: direct}
`)
	b.beat("d", "auto", labels(registry.LabelDispatch, registry.DispatchDirect))
	b.beat("p", "pool", labels(registry.LabelDispatch, registry.DispatchDirect))
	b.beat("x", "direct", labels(registry.LabelDispatch, registry.DispatchDirect))
	if got := b.s.Pick(job("job.auto"), t0).Subject; got != "worker.d.jobs" {
		t.Errorf("auto + direct worker: subject %q", got)
	}
	if got := b.s.Pick(job("job.pool"), t0).Subject; got != "job.pool" {
		t.Errorf("pool mode: subject %q", got)
	}
	if got := b.s.Pick(job("job.direct"), t0).Subject; got != "worker.x.jobs" {
		t.Errorf("direct mode: subject %q", got)
	}
	// Direct mode never sends to a worker that has not said it listens
	// there (a stock CAP worker): it gets the pool subject.
	b.reg.Observe(&capv1.Heartbeat{WorkerId: "x", Pool: "direct"}, t0)
	if got := b.s.Pick(job("job.direct"), t0).Subject; got != "job.direct" {
		t.Errorf("direct mode, worker without the label: subject %q", got)
	}
}

func TestPickLabelledWorkersFoundWhenBusierThanTheRest(t *testing.T) {
	t.Parallel()
	b := setupStrategy(t, twoPools)
	// 5,000 idle unlabelled workers and 5 busy ones carrying the label: a
	// scan in load order would meet every idle worker first.
	for i := range 5000 {
		b.beat("idle"+strconv.Itoa(i), "a")
	}
	for i := range 5 {
		b.beat("gpu"+strconv.Itoa(i), "a", labels("accel", "a100"), active(int32(50+i)))
	}
	got := map[string]int{}
	for range 500 {
		p := b.s.Pick(job("job.a", "accel", "a100"), t0)
		if p.Worker == nil {
			t.Fatalf("labelled pick failed: %s %s", p.Reason, p.Detail)
		}
		got[p.Worker.ID]++
	}
	// Least loaded among the labelled: they end level, at
	// (50+51+52+53+54 + 500) / 5 = 152 each.
	for i := range 5 {
		id := "gpu" + strconv.Itoa(i)
		if load := 50 + i + got[id]; load != 152 {
			t.Fatalf("labelled picks not least-loaded: %v", got)
		}
	}
}
