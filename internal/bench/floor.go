package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
)

// floor moves the NATS and Redis traffic of one job with no scheduling logic:
// the limit of what the dependencies allow on this machine, to hold Troupe's
// figures against (BENCHMARKS.md, "What is measured, and how").
//
// Per job: the submit is consumed from the same JetStream work-queue stream
// Troupe uses (same stream and consumer settings, bus.EnsureStreams), in
// batches; one Redis pipeline per batch writes HSET state + ZADD index for
// every job of the batch; the request is forwarded with a core publish to
// worker.<k>.jobs (round robin); the worker's result lands on the result
// stream and is consumed the same way: one pipeline per batch (HSET + ZADD),
// then acks. The keys are Troupe's own (store.Keys), so the bench observes
// and verifies floor runs exactly as it does Troupe runs.
//
// What it leaves out is everything Troupe adds: locks and fencing, Lua
// compare-and-set, history, the policy check, routing, actors, timers.
type floor struct {
	// Immutable after startFloor.
	nc      *nats.Conn
	rdb     redis.UniversalClient
	keys    *store.Keys
	targets []string // worker.<id>.jobs subjects

	// Shared and safe.
	next      atomic.Uint64 // round-robin position
	processed atomic.Int64  // results written
	failures  atomic.Int64  // pipelines that failed (their messages are nak'ed)

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

const (
	// floorQueue buffers fetched messages between a stream's fetch loop and
	// its batchers: a few fetch batches, so fetching overlaps writing.
	floorQueue = 4 * bus.FetchBatch
	// floorPipelines is the number of batchers per stream: while one waits
	// for its Redis round trip, the next batch is collected and sent.
	floorPipelines = 2
	// floorWriteTimeout bounds one pipeline.
	floorWriteTimeout = 5 * time.Second
	// floorRetry is how long JetStream waits before offering a message whose
	// batch could not be written.
	floorRetry = time.Second
)

func startFloor(ctx context.Context, nc *nats.Conn, rdb redis.UniversalClient, spec sutSpec) (*floor, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	subj := bus.NewSubjects(spec.SubjectPrefix)
	if err := bus.EnsureStreams(ctx, js, spec.StreamPrefix, subj); err != nil {
		return nil, err
	}
	f := &floor{nc: nc, rdb: rdb, keys: store.NewKeys(spec.KeyPrefix)}
	for _, id := range spec.WorkerIDs {
		f.targets = append(f.targets, subj.Worker(id))
	}
	if spec.PoolDispatch && len(f.targets) > 0 {
		// Stock CAP workers listen on the pool subject only.
		f.targets = []string{subj.Pool(spec.Topic)}
	}
	if len(f.targets) == 0 {
		return nil, fmt.Errorf("bench: floor needs worker ids to dispatch to")
	}
	cctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for kind, handle := range map[bus.StreamKind]func([]jetstream.Msg){
		bus.StreamSubmit: f.onSubmits, bus.StreamResult: f.onResults,
	} {
		ch := make(chan jetstream.Msg, floorQueue)
		queue := func(m jetstream.Msg) {
			select {
			case ch <- m:
			case <-cctx.Done():
			}
		}
		// As many pulls at once, pulled as the node's intake pulls.
		if err := bus.Consume(cctx, js, spec.StreamPrefix, kind, quiet, queue, nil); err != nil {
			cancel()
			f.wg.Wait()
			return nil, fmt.Errorf("bench: floor consumer %s: %w", kind, err)
		}
		f.wg.Add(floorPipelines)
		for range floorPipelines {
			go f.batches(cctx, ch, handle)
		}
	}
	return f, nil
}

// batches takes what is queued, up to one fetch batch, and hands it to handle.
func (f *floor) batches(ctx context.Context, in <-chan jetstream.Msg, handle func([]jetstream.Msg)) {
	defer f.wg.Done()
	batch := make([]jetstream.Msg, 0, bus.FetchBatch)
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-in:
			batch = append(batch[:0], m)
		}
	fill:
		for len(batch) < bus.FetchBatch {
			select {
			case m := <-in:
				batch = append(batch, m)
			default:
				break fill
			}
		}
		handle(batch)
	}
}

// write runs one pipeline; on failure every message is offered again later.
func (f *floor) write(batch []jetstream.Msg, queue func(ctx context.Context, p redis.Pipeliner) int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), floorWriteTimeout)
	defer cancel()
	p := f.rdb.Pipeline()
	if queue(ctx, p) == 0 {
		return true
	}
	if _, err := p.Exec(ctx); err != nil {
		f.failures.Add(1)
		for _, m := range batch {
			_ = m.NakWithDelay(floorRetry)
		}
		return false
	}
	return true
}

func (f *floor) onSubmits(batch []jetstream.Msg) {
	ids := make([]string, len(batch))
	now := time.Now().UnixMilli()
	nowS := strconv.FormatInt(now, 10)
	ok := f.write(batch, func(ctx context.Context, p redis.Pipeliner) int {
		n := 0
		for i, m := range batch {
			pkt, err := bus.Decode(m.Data())
			if err != nil || pkt.GetJobRequest().GetJobId() == "" {
				continue // acked below and dropped: the floor has no DLQ
			}
			id := pkt.GetJobRequest().GetJobId()
			ids[i] = id
			p.HSet(ctx, f.keys.Job(id), "s", string(jobstate.StateDispatched), "created", nowS, "updated", nowS)
			p.ZAdd(ctx, f.keys.Index(store.Shard(id), string(jobstate.StateDispatched)), redis.Z{Score: float64(now), Member: id})
			n++
		}
		return n
	})
	if !ok {
		return
	}
	for i, m := range batch {
		if ids[i] != "" {
			// The request is forwarded as submitted: the floor does no
			// re-encoding, which is scheduling work.
			k := f.next.Add(1) % uint64(len(f.targets))
			_ = f.nc.Publish(f.targets[k], m.Data())
		}
		_ = m.Ack()
	}
}

func (f *floor) onResults(batch []jetstream.Msg) {
	now := time.Now().UnixMilli()
	nowS := strconv.FormatInt(now, 10)
	var n int
	ok := f.write(batch, func(ctx context.Context, p redis.Pipeliner) int {
		for _, m := range batch {
			pkt, err := bus.Decode(m.Data())
			if err != nil || pkt.GetJobResult().GetJobId() == "" {
				continue
			}
			id := pkt.GetJobResult().GetJobId()
			p.HSet(ctx, f.keys.Job(id), "s", string(jobstate.StateSucceeded), "updated", nowS)
			p.ZAdd(ctx, f.keys.Index(store.Shard(id), string(jobstate.StateSucceeded)), redis.Z{Score: float64(now), Member: id})
			n++
		}
		return n
	})
	if !ok {
		return
	}
	for _, m := range batch {
		_ = m.Ack()
	}
	f.processed.Add(int64(n))
}

func (f *floor) stop() {
	f.cancel()
	f.wg.Wait()
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
