package admin

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Throughput history: the server samples the node's job counters on its
// own, so the dashboard shows the last minutes the moment it opens instead
// of starting an empty chart.
const (
	// ThroughputSampleEvery is the sampling period; 2 s resolves a burst
	// while one sample costs one registry gather.
	ThroughputSampleEvery = 2 * time.Second
	// ThroughputWindow is how much history is kept (150 samples).
	ThroughputWindow = 5 * time.Minute
)

// ThroughputSample is the node's counters at one moment.
type ThroughputSample struct {
	At        time.Time `json:"at"`
	Received  float64   `json:"received"`
	Completed float64   `json:"completed"`
}

// sampler keeps a ring of ThroughputSamples. Its goroutine appends; the
// stats handler copies.
type sampler struct {
	reg   *prometheus.Registry
	every time.Duration
	// series takes a point every SeriesStep of these ticks (series.go).
	series *series

	mu      sync.Mutex
	samples []ThroughputSample // oldest first, at most window/every

	stop chan struct{}
	done chan struct{}
}

func newSampler(reg *prometheus.Registry, every, window time.Duration) *sampler {
	return &sampler{reg: reg, every: every, samples: make([]ThroughputSample, 0, int(window/every)),
		stop: make(chan struct{}), done: make(chan struct{})}
}

func (s *sampler) run() {
	defer close(s.done)
	t := time.NewTicker(s.every)
	defer t.Stop()
	s.sample()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.sample()
		}
	}
}

func (s *sampler) sample() {
	c, err := counters(s.reg)
	if err != nil {
		return
	}
	var completed float64
	for _, v := range c.completed {
		completed += v
	}
	now := time.Now()
	if s.series != nil {
		s.series.tick(now, s.reg)
	}
	smp := ThroughputSample{At: now, Received: c.received, Completed: completed}
	s.mu.Lock()
	if len(s.samples) == cap(s.samples) {
		copy(s.samples, s.samples[1:])
		s.samples = s.samples[:len(s.samples)-1]
	}
	s.samples = append(s.samples, smp)
	s.mu.Unlock()
}

func (s *sampler) history() []ThroughputSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]ThroughputSample(nil), s.samples...)
}
