package troupe

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// waitingReasonHeld labels, in troupe_jobs_waiting, the submits held in
// the submit stream (no node has taken them yet).
const waitingReasonHeld = "submit_held"

// waitingCollector is the gauge troupe_jobs_waiting{reason}: the jobs
// waiting in this node's capacity queue by their reason (pool_overloaded,
// no_workers, stale_worker; with a record or not), and, as reason
// submit_held, the submits the stream still holds for every replica (the
// same figure on each node: take the max across nodes, not the sum). Read
// at each scrape: a walk of the node's queue and one JetStream request.
type waitingCollector struct {
	n    *Node
	desc *prometheus.Desc
}

func newWaitingCollector(n *Node) *waitingCollector {
	return &waitingCollector{n: n, desc: prometheus.NewDesc("troupe_jobs_waiting",
		"Jobs waiting for room in this node's capacity queue by reason, and (reason submit_held) submits still held in the submit stream for all replicas.",
		[]string{"reason"}, nil)}
}

func (c *waitingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *waitingCollector) Collect(ch chan<- prometheus.Metric) {
	if c.n.stopping.Load() {
		return // the router is stopping or gone: it would not answer
	}
	by := map[string]float64{}
	for _, w := range c.n.localWaitingList("", maxWaitScrape) {
		by[string(w.Reason)]++
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if held, _, err := (inspector{c.n}).SubmitsWaiting(ctx); err == nil {
		by[waitingReasonHeld] = float64(held)
	}
	for reason, v := range by {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, reason)
	}
}

// maxWaitScrape bounds the waits one scrape reads from the queue (well
// above a node's MaxUnwrittenWaits).
const maxWaitScrape = 1 << 20
