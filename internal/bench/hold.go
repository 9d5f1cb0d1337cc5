package bench

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Hold runs (Config.Hold): every measured job stays with its worker,
// unanswered, until all of them are — N jobs in flight on the node at once.
// Then the bench samples the in-flight state for HoldFor:
//
//   - the node's resident set (VmRSS) and live Go heap (after a GC), at the
//     start and the end of the window, and its peak (VmHWM);
//   - its live job actors and parked jobs;
//   - the Redis commands the server ran per second over the window (INFO
//     commandstats, every client, Lua's inner commands included), the ones
//     the node sent (its client hook), and Redis's used_memory against the
//     reading before the run;
//
// and, with Config.Adopt, kills the node (SIGKILL) with a second node
// running and times the second node's adoption of every job. Then the
// workers answer every job and the run completes as usual: every job must
// end SUCCEEDED, none received twice.

// HoldResult is what a hold run measured while the jobs were in flight.
type HoldResult struct {
	InFlight int `json:"in_flight"`
	// ReachedSec: first submit → the last job received by a worker.
	ReachedSec float64 `json:"reached_s"`
	// SettleSec: from then until no job actor was live (all parked).
	SettleSec float64 `json:"settle_s"`
	HoldSec   float64 `json:"hold_s"`
	// Node, at the end of the window (after a GC).
	RSSBytes       int64   `json:"rss_bytes"`
	PeakRSSBytes   int64   `json:"peak_rss_bytes"`
	HeapBytes      uint64  `json:"heap_bytes"`
	HeapPerJob     float64 `json:"heap_bytes_per_job"`
	RSSPerJob      float64 `json:"rss_bytes_per_job"`
	LiveActors     int     `json:"live_actors"`
	Parked         int64   `json:"parked"`
	RSSStartBytes  int64   `json:"rss_start_bytes"`
	IdleRSSBytes   int64   `json:"idle_rss_bytes"` // before the measured jobs
	NodeCPUPerSec  float64 `json:"node_cpu_ms_per_s"`
	NodeSentPerSec float64 `json:"node_redis_commands_per_s"`
	// NodeSentByName: the node's commands per second by name.
	NodeSentByName map[string]float64 `json:"node_redis_by_name_per_s,omitempty"`
	// ServerPerSec: commands per second Redis ran over the window (all
	// clients; includes the commands inside scripts).
	ServerPerSec     float64            `json:"redis_commands_per_s"`
	ServerByName     map[string]float64 `json:"redis_by_name_per_s,omitempty"`
	RedisCPUPerSec   float64            `json:"redis_cpu_ms_per_s"`
	RedisUsedBytes   int64              `json:"redis_used_memory_bytes"`
	RedisBytesPerJob float64            `json:"redis_bytes_per_job"`
	ReleaseToDoneSec float64            `json:"release_to_all_terminal_s"`
	// RefusedAnswers: answer publishes the result stream refused (at its
	// cap) during the release, each published again.
	RefusedAnswers     int64        `json:"release_refused_publishes"`
	Adoption           *AdoptResult `json:"adoption,omitempty"`
	redisUsedBeforeRun int64
	releasedAt         time.Time
}

// AdoptResult times the adoption of a killed node's jobs.
type AdoptResult struct {
	Killed    string  `json:"killed_node"`
	Adopter   string  `json:"adopter_node"`
	LockTTLS  float64 `json:"lock_ttl_s"`
	ParkedAtK int64   `json:"parked_at_kill"`
	// Seconds from the kill: first job adopted, every job adopted.
	FirstSec float64 `json:"first_adopted_s"`
	AllSec   float64 `json:"all_adopted_s"`
	// AfterTTLSec = AllSec − lock TTL (the goal: ≤ 60 s).
	AfterTTLSec float64 `json:"all_adopted_after_ttl_s"`
	// RatePerSec: jobs adopted per second from the first to the last.
	RatePerSec float64 `json:"adopted_per_s"`
	Complete   bool    `json:"complete"`
	// AdopterRedisPerSec: commands per second Redis ran during the drain.
	RedisPerSec float64 `json:"redis_commands_per_s_during_drain"`
}

// adoptTimeout bounds the wait for a killed node's jobs to be adopted: its
// lease runs out within a lock TTL, then the due poller drains them.
func adoptTimeout(ttl time.Duration, n int) time.Duration {
	return ttl + 2*time.Minute + time.Duration(n/500)*time.Second
}

// holdPhase runs once every measured job is with a worker.
func (r *runner) holdPhase(ctx context.Context, firstSubmit time.Time) {
	cfg, h := r.cfg, r.res.Hold
	h.InFlight = int(r.tr.received.Load())
	h.ReachedSec = round3(time.Since(firstSubmit).Seconds())
	// The last jobs dispatched still have live actors until they park:
	// sample the steady state, not their parking.
	settle := time.Now().Add(settleTimeout(cfg.ParkAfter))
	for time.Now().Before(settle) && ctx.Err() == nil {
		if sn, err := r.tgt.inflight(ctx); err != nil || sn.LiveActors == 0 {
			break
		}
		sleepCtx(ctx, time.Second)
	}
	h.SettleSec = round3(time.Since(firstSubmit).Seconds() - h.ReachedSec)
	start, err := r.tgt.inflight(ctx)
	if err != nil {
		r.res.Notes = append(r.res.Notes, "hold: node not readable: "+err.Error())
	}
	h.RSSStartBytes = start.RSS
	srv0 := sumServers(readMasters(ctx, r.rdb))
	harness0 := r.rc.snapshot()
	t0 := time.Now()
	sleepCtx(ctx, cfg.HoldFor)
	end, err := r.tgt.inflight(ctx)
	if err != nil {
		r.res.Notes = append(r.res.Notes, "hold: node not readable: "+err.Error())
	}
	srv1 := sumServers(readMasters(ctx, r.rdb))
	harness1 := r.rc.snapshot()
	secs := time.Since(t0).Seconds()
	h.HoldSec = round3(secs)
	h.RSSBytes, h.PeakRSSBytes, h.HeapBytes = end.RSS, end.PeakRSS, end.HeapAlloc
	if cfg.HeapProfile != "" {
		if err := r.tgt.heapProfile(cfg.HeapProfile); err != nil {
			r.res.Notes = append(r.res.Notes, "heap profile: "+err.Error())
		}
	}
	h.LiveActors, h.Parked = end.LiveActors, end.Parked
	if n := float64(h.InFlight); n > 0 {
		h.HeapPerJob = math.Round(float64(end.HeapAlloc) / n)
		h.RSSPerJob = math.Round(float64(end.RSS-h.IdleRSSBytes) / n)
	}
	h.NodeCPUPerSec = round3(float64(end.CPU-start.CPU) / float64(time.Millisecond) / secs)
	d := end.Redis.sub(start.Redis)
	h.NodeSentPerSec = round3(float64(d.Commands) / secs)
	h.NodeSentByName = perSec(d.ByName, secs)
	if srv0.ok && srv1.ok {
		calls, _ := callsDelta(srv0, srv1)
		delete(calls, "info")
		hd := harness1.sub(harness0)
		var total int64
		for k, v := range calls {
			calls[k] = v - hd.ByName[k]
			if calls[k] <= 0 {
				delete(calls, k)
				continue
			}
			total += calls[k]
		}
		h.ServerPerSec = round3(float64(total) / secs)
		h.ServerByName = perSec(calls, secs)
		h.RedisCPUPerSec = round3((srv1.cpuSec - srv0.cpuSec) * 1000 / secs)
	}
	if used, err := usedMemory(ctx, r.rdb); err == nil {
		h.RedisUsedBytes = used
		if h.InFlight > 0 && h.redisUsedBeforeRun > 0 {
			h.RedisBytesPerJob = math.Round(float64(used-h.redisUsedBeforeRun) / float64(h.InFlight))
		}
	}
	if cfg.Adopt {
		r.adoptPhase(ctx)
	}
	h.releasedAt = time.Now()
	_, refused, err := r.fl.releaseHeld(ctx)
	h.RefusedAnswers = refused
	if err != nil {
		r.res.Failures = append(r.res.Failures, err.Error())
	}
}

// adoptPhase starts a second node, kills the first (SIGKILL) and waits until
// the second has adopted every job the first had parked.
func (r *runner) adoptPhase(ctx context.Context) {
	a, ok := r.tgt.(*childTarget)
	if !ok {
		r.res.Failures = append(r.res.Failures, "adopt: the node is not a child process")
		return
	}
	spec := r.spec
	killed := spec.NodeID
	spec.NodeID = killed + "b"
	b, err := startChild(r.cfg.ChildCommand, spec, r.cfg.Stderr)
	if err != nil {
		r.res.Failures = append(r.res.Failures, "adopt: second node: "+err.Error())
		return
	}
	ar := &AdoptResult{Killed: killed, Adopter: spec.NodeID}
	r.res.Hold.Adoption = ar
	ttl := r.cfg.LockTTL
	if ttl <= 0 {
		ttl = lockTTLDefault
	}
	ar.LockTTLS = ttl.Seconds()
	ar.ParkedAtK, _ = r.st.ParkedCount(ctx, killed)
	srv0 := sumServers(readMasters(ctx, r.rdb))
	killedAt := time.Now()
	a.kill()
	r.tgt = b // the run goes on with the adopter
	r.res.Notes = append(r.res.Notes, fmt.Sprintf("adopt: node %s killed (SIGKILL) with %d jobs parked; "+
		"node CPU and counters from then on are the adopter's", killed, ar.ParkedAtK))
	deadline := killedAt.Add(adoptTimeout(ttl, int(ar.ParkedAtK)))
	var first time.Time
	for time.Now().Before(deadline) && ctx.Err() == nil {
		left, err := r.st.ParkedCount(ctx, killed)
		if err == nil && left < ar.ParkedAtK && first.IsZero() {
			first = time.Now()
			ar.FirstSec = round3(first.Sub(killedAt).Seconds())
		}
		if err == nil && left == 0 {
			all := time.Now()
			ar.AllSec = round3(all.Sub(killedAt).Seconds())
			ar.AfterTTLSec = round3(ar.AllSec - ttl.Seconds())
			span := all.Sub(first).Seconds()
			if span > 0 {
				ar.RatePerSec = math.Round(float64(ar.ParkedAtK) / span)
			}
			ar.Complete = true
			if srv1 := sumServers(readMasters(ctx, r.rdb)); srv0.ok && srv1.ok {
				_, total := callsDelta(srv0, srv1)
				ar.RedisPerSec = math.Round(float64(total) / all.Sub(killedAt).Seconds())
			}
			return
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
	r.res.Failures = append(r.res.Failures, fmt.Sprintf("adopt: jobs of the killed node still parked after %s",
		adoptTimeout(ttl, int(ar.ParkedAtK))))
}

// settleTimeout bounds the wait for the last dispatched jobs to park.
func settleTimeout(parkAfter time.Duration) time.Duration {
	if parkAfter <= 0 {
		parkAfter = 10 * time.Second // the node's default
	}
	return parkAfter + 30*time.Second
}

// lockTTLDefault mirrors store.LockTTLDefault for the report.
const lockTTLDefault = 60 * time.Second

func perSec(m map[string]int64, secs float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if v > 0 {
			out[k] = math.Round(float64(v)/secs*10) / 10
		}
	}
	return out
}

// usedMemory reads INFO memory used_memory.
func usedMemory(ctx context.Context, rdb redis.UniversalClient) (int64, error) {
	txt, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(txt, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("bench: no used_memory in INFO memory")
}

// formatHold prints a hold run's figures.
func formatHold(w interface{ Write([]byte) (int, error) }, h *HoldResult) {
	mib := func(b int64) float64 { return float64(b) / (1 << 20) }
	fmt.Fprintf(w, "  in flight     %d jobs with a worker at once, %.1f s after the first submit; all parked %.1f s later; held %.0f s\n",
		h.InFlight, h.ReachedSec, h.SettleSec, h.HoldSec)
	fmt.Fprintf(w, "  node held     RSS %.1f MiB (idle %.1f, peak %.1f), heap %.1f MiB after GC = %.0f B/job, "+
		"%d live actors, %d parked; CPU %.1f ms/s\n", mib(h.RSSBytes), mib(h.IdleRSSBytes), mib(h.PeakRSSBytes),
		float64(h.HeapBytes)/(1<<20), h.HeapPerJob, h.LiveActors, h.Parked, h.NodeCPUPerSec)
	fmt.Fprintf(w, "  redis held    server %.1f commands/s (%s), CPU %.1f ms/s; node sent %.1f/s (%s); "+
		"used_memory %.1f MiB = %.0f B/job\n", h.ServerPerSec, byNameText(h.ServerByName), h.RedisCPUPerSec,
		h.NodeSentPerSec, byNameText(h.NodeSentByName), mib(h.RedisUsedBytes), h.RedisBytesPerJob)
	if a := h.Adoption; a != nil {
		fmt.Fprintf(w, "  adoption      %s killed with %d parked; %s adopted the first after %.1f s, all after %.1f s "+
			"(lock TTL %.0f s: %.1f s after it), %.0f jobs/s; Redis %.0f commands/s meanwhile; complete %v\n",
			a.Killed, a.ParkedAtK, a.Adopter, a.FirstSec, a.AllSec, a.LockTTLS, a.AfterTTLSec, a.RatePerSec,
			a.RedisPerSec, a.Complete)
	}
	fmt.Fprintf(w, "  release       answers → all terminal %.1f s (%d answer publishes refused and sent again)\n",
		h.ReleaseToDoneSec, h.RefusedAnswers)
}
