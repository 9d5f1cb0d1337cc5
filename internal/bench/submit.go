package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/proto/capv1"
)

// submitter publishes the run's JobRequests on the submit subject with
// JetStream async publishes, as a fast CAP client would. It keeps at most
// window publishes awaiting their ack, and waits for room itself before
// publishing, so the time recorded as a job's submit is the moment it is
// handed to the connection, never time spent queued behind the window.
type submitter struct {
	// Immutable after newSubmitter.
	js      jetstream.JetStream
	subject string
	topic   string
	tr      *tracker
	keys    int // > 0: measured jobs carry concurrency keys (Config.ConcurrencyKeys)
	// labels: every job's meta.labels (nil: none; the rate limit run's bucket).
	labels map[string]string
	window int
	// batch and submitters (Config.SubmitBatch, Config.Submitters): 0 for
	// the rolling window above; 1 for one acked publish per job at a time
	// (Client.Submit); N > 1 for N async publishes, then one wait for their
	// acks (Client.SubmitBatch). Each of submitters goroutines does so.
	batch, submitters int

	mu      sync.Mutex // guards retries and attempts
	retries []int      // jobs whose publish was not acked
	tries   []uint8
}

const (
	// maxSubmitAttempts per job: a publish whose ack times out may have been
	// stored, and a second submit of the same job id is harmless to Troupe.
	// A full submit stream (its StreamMaxMsgs, while the node drains it)
	// refuses publishes for as long as the node takes to make room, so a
	// refused job is published again after retryBackoffMin, doubling to
	// retryBackoffMax, as a CAP client should: with the attempts below,
	// for at least 20 minutes (the run's deadline bounds it too).
	maxSubmitAttempts = 250
	retryBackoffMin   = 100 * time.Millisecond
	retryBackoffMax   = 5 * time.Second
	// submitAckTimeout bounds the wait for one publish's ack.
	submitAckTimeout = 10 * time.Second
	// windowPoll is how often a full window is checked for room.
	windowPoll = 50 * time.Microsecond
)

func newSubmitter(nc *nats.Conn, subject, topic string, tr *tracker, window, batch, submitters int) (*submitter, error) {
	s := &submitter{subject: subject, topic: topic, tr: tr, window: window, batch: batch, submitters: submitters,
		tries: make([]uint8, tr.n)}
	if batch > 0 {
		// Every goroutine's whole batch may await its acks at once.
		window = max(window, batch*max(1, submitters))
	}
	js, err := jetstream.New(nc,
		// The library's own cap stays above ours, so PublishAsync never
		// blocks inside the timed section.
		jetstream.WithPublishAsyncMaxPending(2*window),
		jetstream.WithPublishAsyncTimeout(submitAckTimeout),
		jetstream.WithPublishAsyncErrHandler(s.onPublishError))
	if err != nil {
		return nil, err
	}
	s.js = js
	return s, nil
}

func (s *submitter) onPublishError(_ jetstream.JetStream, m *nats.Msg, _ error) {
	pkt, err := bus.Decode(m.Data)
	if err != nil {
		return
	}
	if i := s.tr.index(pkt.GetJobRequest().GetJobId()); i >= 0 {
		s.mu.Lock()
		s.retries = append(s.retries, i)
		s.mu.Unlock()
	}
}

func (s *submitter) encode(id string) ([]byte, error) {
	req := &capv1.JobRequest{JobId: id, Topic: s.topic, ContextPtr: "redis://ctx:" + id}
	if s.labels != nil {
		req.Meta = &capv1.JobMetadata{Labels: s.labels}
	}
	if s.keys > 0 {
		// Measured job i gets key i mod keys (round-robin); warm-up jobs none.
		if i := s.tr.index(id); i >= 0 {
			req.Meta = &capv1.JobMetadata{Labels: map[string]string{labelConcurrencyKey: keyName(i % s.keys)}}
		}
	}
	return bus.EncodeRequest(id, "troupe-bench", req)
}

// labelConcurrencyKey is the label that gives a job its concurrency key
// (README "Concurrency keys"; the core's lifecycle.LabelConcurrencyKey).
const labelConcurrencyKey = "troupe.concurrency_key"

// keyName is the bench's concurrency key number k.
func keyName(k int) string { return "ck" + strconv.Itoa(k) }

// keyIndex is the number of a key named by keyName below n, or -1.
func keyIndex(name string, n int) int {
	k, err := strconv.Atoi(strings.TrimPrefix(name, "ck"))
	if err != nil || !strings.HasPrefix(name, "ck") || k < 0 || k >= n {
		return -1
	}
	return k
}

// waitRoom waits until fewer than window publishes await their ack.
func (s *submitter) waitRoom(deadline time.Time) error {
	for s.js.PublishAsyncPending() >= s.window {
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: submit window still full at the deadline (%d awaiting ack)", s.js.PublishAsyncPending())
		}
		time.Sleep(windowPoll)
	}
	return nil
}

func (s *submitter) publish(i int, deadline time.Time) error {
	data, err := s.encode(s.tr.id(i))
	if err != nil {
		return err
	}
	if err := s.waitRoom(deadline); err != nil {
		return err
	}
	s.tr.markSubmitted(i)
	if _, err := s.js.PublishAsync(s.subject, data); err != nil {
		return fmt.Errorf("bench: publish job %d: %w", i, err)
	}
	return nil
}

// warmup publishes ids synchronously and returns when JetStream stored them.
func (s *submitter) warmup(ctx context.Context, ids []string) error {
	for _, id := range ids {
		data, err := s.encode(id)
		if err != nil {
			return err
		}
		if _, err := s.js.PublishAsync(s.subject, data); err != nil {
			return fmt.Errorf("bench: warm-up publish: %w", err)
		}
	}
	select {
	case <-s.js.PublishAsyncComplete():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run submits jobs 0..n-1 at rate jobs/s (0: as fast as the window allows),
// then resubmits any whose publish failed, up to maxSubmitAttempts, all
// before deadline. It returns how many jobs could not be submitted.
func (s *submitter) run(ctx context.Context, n int, rate float64, deadline time.Time) (int, error) {
	if s.batch > 0 {
		if err := s.runBatches(ctx, n, deadline); err != nil {
			return s.unacked(), err
		}
		return s.retry(ctx, deadline)
	}
	start := time.Now()
	for i := 0; i < n; i++ {
		if ctx.Err() != nil {
			return n - i, ctx.Err()
		}
		if rate > 0 {
			due := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
		}
		if err := s.publish(i, deadline); err != nil {
			return n - i, err
		}
		s.tries[i] = 1
	}
	return s.retry(ctx, deadline)
}

// retry waits for every ack and submits again the jobs whose publish
// failed, up to maxSubmitAttempts each; it returns how many could not be
// submitted.
func (s *submitter) retry(ctx context.Context, deadline time.Time) (int, error) {
	backoff := retryBackoffMin
	for {
		select {
		case <-s.js.PublishAsyncComplete():
		case <-time.After(time.Until(deadline)):
			return s.unacked(), errors.New("bench: submits still awaiting their JetStream ack at the deadline")
		case <-ctx.Done():
			return s.unacked(), ctx.Err()
		}
		s.mu.Lock()
		again := s.retries
		s.retries = nil
		s.mu.Unlock()
		if len(again) == 0 {
			return 0, nil
		}
		select {
		case <-time.After(min(backoff, time.Until(deadline))):
		case <-ctx.Done():
			return len(again), ctx.Err()
		}
		backoff = min(2*backoff, retryBackoffMax)
		failed := 0
		for _, i := range again {
			if s.tries[i] >= maxSubmitAttempts {
				failed++
				continue
			}
			s.tries[i]++
			if err := s.publish(i, deadline); err != nil {
				return len(again), err
			}
		}
		if failed > 0 {
			return failed, fmt.Errorf("bench: %d jobs could not be submitted in %d attempts", failed, maxSubmitAttempts)
		}
	}
}

// runBatches submits jobs 0..n-1 as s.submitters goroutines, each taking
// every submitters-th run of s.batch jobs: with batch 1 one acked publish at
// a time, as Client.Submit does; with more, the run's publishes then one
// wait for all their acks, as Client.SubmitBatch does. A failed publish goes
// to s.retries (the async error handler, or here for a synchronous one).
func (s *submitter) runBatches(ctx context.Context, n int, deadline time.Time) error {
	g := max(1, s.submitters)
	errs := make(chan error, g)
	for k := range g {
		go func() {
			errs <- s.batches(ctx, k, g, n, deadline)
		}()
	}
	var first error
	for range g {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (s *submitter) batches(ctx context.Context, k, g, n int, deadline time.Time) error {
	acks := make([]jetstream.PubAckFuture, 0, s.batch)
	for lo := k * s.batch; lo < n; lo += g * s.batch {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return errors.New("bench: batch submits not done at the deadline")
		}
		hi := min(n, lo+s.batch)
		acks = acks[:0]
		for i := lo; i < hi; i++ {
			data, err := s.encode(s.tr.id(i))
			if err != nil {
				return err
			}
			s.tr.markSubmitted(i)
			s.tries[i] = 1
			if s.batch == 1 {
				actx, cancel := context.WithTimeout(ctx, submitAckTimeout)
				_, err = s.js.Publish(actx, s.subject, data)
				cancel()
				if err != nil {
					s.mu.Lock()
					s.retries = append(s.retries, i)
					s.mu.Unlock()
				}
				continue
			}
			ack, err := s.js.PublishAsync(s.subject, data)
			if err != nil {
				return fmt.Errorf("bench: publish job %d: %w", i, err)
			}
			acks = append(acks, ack)
		}
		for _, a := range acks {
			select {
			case <-a.Ok():
			case <-a.Err(): // the error handler queued it for retry
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	return nil
}

func (s *submitter) unacked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.js.PublishAsyncPending() + len(s.retries)
}
