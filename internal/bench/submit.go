package bench

import (
	"context"
	"errors"
	"fmt"
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
	window  int

	mu      sync.Mutex // guards retries and attempts
	retries []int      // jobs whose publish was not acked
	tries   []uint8
}

const (
	// maxSubmitAttempts per job: a publish whose ack times out may have been
	// stored, and a second submit of the same job id is harmless to Troupe.
	maxSubmitAttempts = 3
	// submitAckTimeout bounds the wait for one publish's ack.
	submitAckTimeout = 10 * time.Second
	// windowPoll is how often a full window is checked for room.
	windowPoll = 50 * time.Microsecond
)

func newSubmitter(nc *nats.Conn, subject, topic string, tr *tracker, window int) (*submitter, error) {
	s := &submitter{subject: subject, topic: topic, tr: tr, window: window, tries: make([]uint8, tr.n)}
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
	return bus.EncodeRequest(id, "troupe-bench", &capv1.JobRequest{
		JobId: id, Topic: s.topic, ContextPtr: "redis://ctx:" + id,
	})
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

func (s *submitter) unacked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.js.PublishAsyncPending() + len(s.retries)
}
