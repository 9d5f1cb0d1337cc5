package troupe

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/internal/intake"
	"github.com/troupe-run/troupe/internal/metricsx"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/supervisor"
	"github.com/troupe-run/troupe/signing"
)

func intakeGuard(n *Node) *intake.Guard {
	return intake.NewGuard(n.rdb, n.store.Keys().Prefix(), n.cfg.Metrics, n.log)
}

func intakeForwarder(n *Node) func(owner, kind string, raw []byte) error {
	return intake.ForwarderFrom(n.nc, n.subj, n.cfg.NodeID)
}

func intakeBatchForwarder(n *Node) func(owner string, items []supervisor.ForwardItem) []error {
	return intake.BatchForwarderFrom(n.nc, n.subj, n.cfg.NodeID)
}

// intakePart builds the intake (the node's inputs, signature checks and
// their metrics) and subscribes its core NATS inputs: heartbeats, progress
// and the forwarding inbox (the inbox part unsubscribes the inbox, late).
// Its Stop unsubscribes the others and makes the inbox refuse forwarded
// events (intake.Drain) before the job actors stop.
func (n *Node) intakePart() part {
	var subs []*nats.Subscription
	return part{name: "intake",
		start: func(context.Context) error {
			var replay *signing.ReplayGuard
			if n.cfg.Verifier != nil {
				replay = signing.NewReplayGuard(n.cfg.Tuning.ReplayWindow, n.cfg.Tuning.ReplaySeen)
				_ = n.cfg.Metrics.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{
					Name: "troupe_replay_signatures_forgotten_total",
					Help: "Signatures the replay window forgot before their window ended because its seen-set was full.",
				}, func() float64 { return float64(replay.Forgotten()) }))
			}
			sigs, err := intake.NewSignatures(n.cfg.Verifier, replay, n.cfg.Metrics)
			if err != nil {
				return err
			}
			n.sigs = sigs
			own := prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_own_outcomes_skipped_total",
				Help: "Outcomes this node decided and told clients on the result subject, read back from the result stream and skipped."})
			_ = n.cfg.Metrics.Register(own)
			invalidHB := prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_heartbeats_invalid_total",
				Help: "Heartbeats ignored for an invalid worker id, pool name, labels or other field (intake.ValidateHeartbeat)."})
			invalidHB, _ = metricsx.Register(n.cfg.Metrics, invalidHB)
			ownResults := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_results_shared_copies_total",
				Help: "Results taken from the shared result consumer while every node also hears the result subject, by what became of them: owner (the job's record showed the owning node had handled its copy: acked unread), handled (handled here, or forwarded to the owner)."},
				[]string{"how"})
			ownResults, _ = metricsx.Register(n.cfg.Metrics, ownResults)
			_ = n.cfg.Metrics.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "troupe_results_subject_heard",
				Help: "1 while this node hears the result subject itself (other replicas are known, so each result reaches its job's owner without a forward), 0 while it takes results from the shared result consumer alone (a node alone)."},
				func() float64 {
					if in := n.intakeRef.Load(); in != nil && in.Hearing() {
						return 1
					}
					return 0
				}))
			redelivered := prometheus.NewCounter(prometheus.CounterOpts{Name: "troupe_submits_redelivered_total",
				Help: "Submits taken on a second or later delivery: a node died holding them, or one held them un-acked past the submit consumer's redelivery wait."})
			redelivered, _ = metricsx.Register(n.cfg.Metrics, redelivered)
			_, _ = metricsx.Register(n.cfg.Metrics, prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "troupe_submit_progress_touches_total",
				Help: "In-progress signals sent to JetStream for fetched submits still un-acked bus.KeepFirst after their fetch (a backlog in the node, or a job waiting within its capacity grace), so that JetStream does not offer them again.",
			}, func() float64 { return float64(n.submitTouches.Load()) }))
			n.intake = &intake.Intake{Env: n.env, OwnResults: ownResults, Store: n.store, Shards: n.shards, Log: n.log, Signatures: sigs,
				DLQFailures: n.dlqMetrics(), OwnOutcomes: own, HeartbeatsRefused: invalidHB, FindWaiting: n.waitingNode,
				SubmitRoom: n.submitRoom, SubmitKeep: touchFor(n.cfg.Tuning.CapacityGrace),
				SubmitsRedelivered: redelivered,
				SubmitTouches:      &n.submitTouches}
			if n.guard != nil {
				n.intake.Guard = n.guard
			}
			n.intakeRef.Store(n.intake)
			n.peersTo(n.intake)
			inputs, err := n.intake.Subscribe(n.nc, n.subj, n.cfg.NodeID)
			if err != nil {
				return err
			}
			for _, s := range inputs {
				if s.Subject == n.subj.Inbox(n.cfg.NodeID) {
					n.inbox = append(n.inbox, s)
				} else {
					subs = append(subs, s)
				}
			}
			return nil
		},
		stop: func(context.Context) error {
			for _, s := range subs {
				_ = s.Unsubscribe()
			}
			subs = nil
			n.intake.Drain()
			if n.beforeActorsStop != nil {
				n.beforeActorsStop()
			}
			return nil
		}}
}

// peersSeen is the router's report of how many other replicas it knows
// (router.Config.OnPeers): the intake hears the result subject only while
// there are some (intake.SetPeers).
func (n *Node) peersSeen(k int) {
	n.peersMu.Lock()
	defer n.peersMu.Unlock()
	n.peers, n.peersKnown = k, true
	if in := n.intakeRef.Load(); in != nil {
		in.SetPeers(k)
	}
}

// peersTo hands the router's last report to a new intake. Under peersMu,
// as peersSeen: a report made meanwhile reaches the intake after this one.
func (n *Node) peersTo(in *intake.Intake) {
	n.peersMu.Lock()
	defer n.peersMu.Unlock()
	if n.peersKnown {
		in.SetPeers(n.peers)
	}
}

// dlqMetrics registers troupe_dlq_bytes (read from Redis at each scrape)
// and returns troupe_dlq_write_failures_total{reason}.
func (n *Node) dlqMetrics() *prometheus.CounterVec {
	failures := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "troupe_dlq_write_failures_total",
		Help: "Bad inputs dropped because their DLQ entry could not be written (logged at ERROR with size and hash)."},
		[]string{"reason"})
	_ = n.cfg.Metrics.Register(failures)
	st := n.store
	_ = n.cfg.Metrics.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "troupe_dlq_bytes",
		Help: "Bytes the DLQ's entries hold (bounded by the DLQ byte budget; -1: Redis did not answer)."},
		func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			b, err := st.DLQBytes(ctx)
			if err != nil {
				return -1
			}
			return float64(b)
		}))
	return failures
}

// questionsPart subscribes the capacity reports of other replicas and the
// queue questions they ask this node, and announces the node to the other
// routers.
func (n *Node) questionsPart() part {
	var subs []*nats.Subscription
	unsubscribe := func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
		subs = nil
	}
	return part{name: "node-questions",
		start: func(context.Context) error {
			sigs, routerPID, sysRoot := n.sigs, n.router, n.sys.Root
			subscribe := func(what, subject string, h nats.MsgHandler) error {
				s, err := n.nc.Subscribe(subject, h)
				if err != nil {
					unsubscribe()
					return fmt.Errorf("subscribe %s: %w", what, err)
				}
				subs = append(subs, s)
				return nil
			}
			if err := subscribe("capacity reports", n.subj.Capacity(), func(m *nats.Msg) {
				if !sigs.FromNode(intake.KindCapacity, m) {
					return
				}
				pl, err := router.DecodePeerLoad(m.Data)
				if err != nil {
					n.log.Debug("capacity report dropped", "err", err)
					return
				}
				pl.At = time.Now()
				sysRoot.Send(routerPID, pl)
			}); err != nil {
				return err
			}
			sysRoot.Send(routerPID, &router.Announce{})
			// The queue questions answer other replicas only: a waiting job's
			// tenant, topic and labels are not for everyone on the bus.
			if err := subscribe("queue questions", n.subj.QueueAsk(n.cfg.NodeID), func(m *nats.Msg) {
				if !sigs.FromNode(intake.KindQueue, m) {
					return
				}
				pos := n.localQueuePosition(string(m.Data))
				_ = m.Respond([]byte(strconv.Itoa(pos)))
			}); err != nil {
				return err
			}
			if err := subscribe("waiting-job questions", n.subj.QueueFind(n.cfg.NodeID), func(m *nats.Msg) {
				if !sigs.FromNode(intake.KindQueue, m) {
					return
				}
				var body []byte
				if w := n.localWaiting(string(m.Data)); w != nil {
					body, _ = json.Marshal(w)
				}
				_ = m.Respond(body)
			}); err != nil {
				return err
			}
			if err := subscribe("waiting-list questions", n.subj.QueueList(n.cfg.NodeID), func(m *nats.Msg) {
				if !sigs.FromNode(intake.KindQueue, m) {
					return
				}
				var q waitListQuery
				if json.Unmarshal(m.Data, &q) != nil || q.Limit <= 0 {
					_ = m.Respond([]byte("[]"))
					return
				}
				body, _ := json.Marshal(n.localWaitingList(q.Tenant, min(q.Limit, maxWaitList)))
				_ = m.Respond(body)
			}); err != nil {
				return err
			}
			if err := n.nc.Flush(); err != nil {
				unsubscribe()
				return fmt.Errorf("nats flush: %w", err)
			}
			return nil
		},
		stop: func(context.Context) error { unsubscribe(); return nil }}
}
