package router

import (
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/troupe-run/troupe/proto/capv1"
)

// testLog keeps test output to errors.
func testLog() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError + 4}))
}

// routerBundle is one router actor in an actor system of its own.
type routerBundle struct {
	sys *actor.ActorSystem
	pid *actor.PID
}

func setupRouter(t *testing.T, cfg Config) *routerBundle {
	t.Helper()
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return testLog() }))
	if cfg.Log == nil {
		cfg.Log = testLog()
	}
	pid := sys.Root.Spawn(Props(cfg))
	t.Cleanup(func() {
		_ = sys.Root.PoisonFuture(pid).Wait()
		sys.Shutdown()
	})
	return &routerBundle{sys: sys, pid: pid}
}

func (b *routerBundle) ask(t *testing.T, msg any) any {
	t.Helper()
	res, err := b.sys.Root.RequestFuture(b.pid, msg, 5*time.Second).Result()
	if err != nil {
		t.Fatalf("ask %T: %v", msg, err)
	}
	return res
}

func (b *routerBundle) beat(hb *capv1.Heartbeat, at time.Time) {
	b.sys.Root.Send(b.pid, &HeartbeatSeen{HB: hb, At: at})
}

func (b *routerBundle) pick(t *testing.T, topic string) *PickReply {
	t.Helper()
	return b.ask(t, &PickRequest{JobID: "j", Req: &capv1.JobRequest{JobId: "j", Topic: topic}, Epoch: 7}).(*PickReply)
}

func (b *routerBundle) workers(t *testing.T) []WorkerInfo {
	t.Helper()
	return b.ask(t, &ListWorkers{}).([]WorkerInfo)
}

// metricSum adds the values of the named series whose labels include want.
func metricSum(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			for k, v := range want {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue metrics
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}
