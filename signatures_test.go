package troupe_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/intake"
	"github.com/troupe-run/troupe/internal/jobactor"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/signing"
	"github.com/troupe-run/troupe/worker"
)

// sigSetup is one test's keys: the node's, a worker's, a client's, and a
// key set listing them (the node signs as its id and as troupe-saga/<id>).
type sigSetup struct {
	nodeID, workerID string
	node, worker     *signing.Signer
	client, stranger *signing.Signer
	keys             *signing.Verifier
}

// newSigSetup gives the node and worker ids unique to the test: signers
// are registered process-wide by sender id (bus.SignAs), and parallel tests
// must not sign for each other.
func newSigSetup(t *testing.T, tag string) *sigSetup {
	t.Helper()
	s := &sigSetup{nodeID: "sig-node-" + tag, workerID: "sig-w-" + tag}
	for _, p := range []**signing.Signer{&s.node, &s.worker, &s.client, &s.stranger} {
		priv, _, err := signing.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		if *p, err = signing.ParseSigner(priv); err != nil {
			t.Fatal(err)
		}
	}
	line := func(sender string, k *signing.Signer) string {
		return `"` + sender + `": "` + strings.ReplaceAll(string(k.PublicPEM()), "\n", `\n`) + "\"\n"
	}
	ks, err := signing.ParseKeySet([]byte(line(s.nodeID, s.node) + line("troupe-saga/*", s.node) +
		line(s.workerID, s.worker) + line("client", s.client)))
	if err != nil {
		t.Fatal(err)
	}
	s.keys = signing.NewVerifier(ks)
	return s
}

// nodeConfig configures the fixture's node to sign as s.nodeID and, if verify,
// to verify against s.keys.
func (s *sigSetup) nodeConfig(verify bool, more ...func(*troupe.Config)) func(*troupe.Config) {
	return func(c *troupe.Config) {
		c.NodeID, c.Signer = s.nodeID, s.node
		if verify {
			c.Verifier = s.keys
		}
		for _, m := range more {
			m(c)
		}
	}
}

// startWorker starts a worker that signs what it sends and, if verify,
// verifies its dispatches against keys.
func (s *sigSetup) startWorker(f *fixture, keys *signing.Verifier, rec *receipts, h worker.Handler) *worker.Worker {
	f.t.Helper()
	cfg := worker.Config{ID: s.workerID, Pool: "echo", Topics: []string{"job.echo"}, Direct: true,
		SubjectPrefix: f.subj.Prefix(), Handler: h, Heartbeat: time.Second, Progress: true, Signer: s.worker, Verifier: keys}
	if rec != nil {
		cfg.OnReceive = rec.hook
	}
	w, err := worker.Start(f.env.NATS, cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	f.t.Cleanup(w.Stop)
	f.waitWorkers(1)
	return w
}

// signedSubmit publishes req signed by k under sender.
func (f *fixture) signedSubmit(k *signing.Signer, sender string, req *capv1.JobRequest) {
	f.t.Helper()
	data, err := bus.Encoder{Signer: k}.Request("trace-"+req.JobId, sender, req)
	if err != nil {
		f.t.Fatal(err)
	}
	f.publishRaw(f.subj.Submit, data)
}

// rejected reads troupe_packets_rejected_total{kind,reason}.
func rejected(t *testing.T, n *troupe.Node, kind string, reason signing.Reason) float64 {
	t.Helper()
	mfs, err := n.Metrics().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "troupe_packets_rejected_total" {
			continue
		}
		for _, m := range mf.Metric {
			l := map[string]string{}
			for _, lp := range m.Label {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["kind"] == kind && l["reason"] == string(reason) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// waitRejected waits until the counter reaches want (bounded).
func waitRejected(t *testing.T, n *troupe.Node, kind string, reason signing.Reason, want float64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if rejected(t, n, kind, reason) >= want {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("troupe_packets_rejected_total{kind=%s,reason=%s} = %v, want %v", kind, reason,
		rejected(t, n, kind, reason), want)
}

// captureVerified subscribes to subject and sends the verification result
// of each packet published there.
func captureVerified(t *testing.T, f *fixture, subject string, keys *signing.Verifier) chan error {
	ch := make(chan error, 100)
	sub, err := f.env.NATS.Subscribe(subject, func(m *nats.Msg) {
		p, err := bus.Decode(m.Data)
		if err == nil {
			err = keys.VerifyRaw(p, m.Data)
		}
		ch <- err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	_ = f.env.NATS.Flush()
	return ch
}

func nextVerified(t *testing.T, ch chan error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing published", what)
	}
}

// With signing and verification on everywhere, a signed job runs as usual;
// the dispatch the node publishes carries a signature the worker (and
// anyone with the key set) verifies.
func TestSignedJobSucceedsWithVerificationOn(t *testing.T) {
	t.Parallel()
	s := newSigSetup(t, "ok")
	f := newFixture(t, s.nodeConfig(true))
	dispatches := captureVerified(t, f, f.subj.Worker(s.workerID), s.keys)
	rec := newReceipts()
	w := s.startWorker(f, s.keys, rec, worker.Echo)

	f.signedSubmit(s.client, "client", echoReq("job-signed"))
	r := f.waitState("job-signed", jobstate.StateSucceeded)
	if r.Worker != s.workerID || rec.count("job-signed") != 1 {
		t.Fatalf("worker %q, receipts %d", r.Worker, rec.count("job-signed"))
	}
	nextVerified(t, dispatches, "dispatch")
	if w.Rejected() != 0 {
		t.Fatalf("worker rejected %d dispatches", w.Rejected())
	}
	// The saga runner publishes through bus.Encode* as troupe-saga/<node
	// id>; the node signs that sender too.
	data, err := bus.EncodeRequest("t", "troupe-saga/"+s.nodeID, echoReq("comp-1"))
	if err != nil {
		t.Fatal(err)
	}
	p, _ := bus.Decode(data)
	if err := s.keys.VerifyRaw(p, data); err != nil {
		t.Fatalf("saga sender: %v", err)
	}
	for _, kind := range []string{"submit", "result", "heartbeat", "progress"} {
		for _, reason := range []signing.Reason{signing.ReasonUnsigned, signing.ReasonUnknownSender, signing.ReasonBadSignature} {
			if n := rejected(t, f.node, kind, reason); n != 0 {
				t.Fatalf("%s rejected %v times (%s)", kind, n, reason)
			}
		}
	}
}

// Unsigned, unknown-sender and tampered submits are dead-lettered with
// their reason, counted, acked and never dispatched; the node keeps
// working, and its DLQ announcements are signed.
func TestBadlySignedSubmitsAreDeadLettered(t *testing.T) {
	t.Parallel()
	s := newSigSetup(t, "bad")
	f := newFixture(t, s.nodeConfig(true))
	dlqEvents := captureVerified(t, f, f.subj.DLQ, s.keys)
	rec := newReceipts()
	s.startWorker(f, s.keys, rec, worker.Echo)

	f.submit(echoReq("job-unsigned")) // bus.EncodeRequest, sender test-client: no signature
	f.signedSubmit(s.stranger, "stranger", echoReq("job-stranger"))
	f.signedSubmit(s.stranger, "client", echoReq("job-wrong-key"))
	// Signed by the client, then the topic changed on the way.
	data, err := bus.Encoder{Signer: s.client}.Request("trace", "client", echoReq("job-tampered"))
	if err != nil {
		t.Fatal(err)
	}
	pkt, _ := bus.Decode(data)
	pkt.GetJobRequest().ContextPtr = "redis://ctx:someone-else"
	tampered, _ := bus.Encoder{}.Marshal(pkt)
	f.publishRaw(f.subj.Submit, tampered)
	f.signedSubmit(s.client, "client", echoReq("job-good"))

	for id, reason := range map[string]jobstate.Reason{
		"job-unsigned":  jobstate.ReasonUnsignedPacket,
		"job-stranger":  jobstate.ReasonUnknownSender,
		"job-wrong-key": jobstate.ReasonBadSignature,
		"job-tampered":  jobstate.ReasonBadSignature,
	} {
		e := f.waitDLQ(func(e store.DLQEntry) bool { return e.JobID == id })
		if e.Reason != reason || e.Subject != f.subj.Submit || len(e.Raw) == 0 {
			t.Errorf("%s: DLQ entry reason %s subject %s raw %d bytes, want %s", id, e.Reason, e.Subject, len(e.Raw), reason)
		}
	}
	waitRejected(t, f.node, "submit", signing.ReasonUnsigned, 1)
	waitRejected(t, f.node, "submit", signing.ReasonUnknownSender, 1)
	waitRejected(t, f.node, "submit", signing.ReasonBadSignature, 2)
	for i := 0; i < 4; i++ {
		nextVerified(t, dlqEvents, "sys.job.dlq announcement")
	}

	f.waitState("job-good", jobstate.StateSucceeded)
	for _, id := range []string{"job-unsigned", "job-stranger", "job-wrong-key", "job-tampered"} {
		if _, err := f.node.Record(context.Background(), id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s: a rejected submit has a job record (err %v)", id, err)
		}
		if rec.count(id) != 0 {
			t.Errorf("%s: a rejected submit was dispatched", id)
		}
	}
	waitNoPending(t, f.js, bus.StreamName(f.env.StreamPrefix(), bus.StreamSubmit), bus.ConsumerName(bus.StreamSubmit))
}

// A forged result (on the result stream or straight to the owner's inbox)
// and a forged cancel for a running job are rejected and change nothing;
// the genuine result then completes the job.
func TestForgedResultDoesNotChangeTheJob(t *testing.T) {
	t.Parallel()
	s := newSigSetup(t, "forge")
	f := newFixture(t, s.nodeConfig(true))
	release := make(chan struct{})
	s.startWorker(f, s.keys, nil, func(ctx context.Context, req *capv1.JobRequest) *capv1.JobResult {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return worker.Echo(ctx, req)
	})
	f.signedSubmit(s.client, "client", echoReq("job-forge"))
	f.waitState("job-forge", jobstate.StateRunning)

	failed := &capv1.JobResult{JobId: "job-forge", Status: capv1.JobStatus_JOB_STATUS_FAILED, WorkerId: s.workerID,
		ErrorCode: "forged"}
	forged, _ := bus.Encoder{Signer: s.stranger}.Result("trace-job-forge", s.workerID, failed)
	f.publishRaw(f.subj.Result, forged)
	unsigned, _ := bus.EncodeResult("trace-job-forge", s.workerID, failed)
	f.publishRaw(f.subj.Result, unsigned)
	cancel, _ := bus.EncodeCancel("trace-job-forge", "client", &capv1.JobCancel{JobId: "job-forge", Reason: "forged"})
	f.publishRaw(f.subj.Cancel, cancel)

	f.waitDLQ(func(e store.DLQEntry) bool { return e.JobID == "job-forge" && e.Reason == jobstate.ReasonBadSignature })
	f.waitDLQ(func(e store.DLQEntry) bool {
		return e.JobID == "job-forge" && e.Reason == jobstate.ReasonUnsignedPacket && e.Subject == f.subj.Result
	})
	f.waitDLQ(func(e store.DLQEntry) bool {
		return e.JobID == "job-forge" && e.Reason == jobstate.ReasonUnsignedPacket && e.Subject == f.subj.Cancel
	})
	waitRejected(t, f.node, "result", signing.ReasonBadSignature, 1)
	waitRejected(t, f.node, "result", signing.ReasonUnsigned, 1)
	waitRejected(t, f.node, "cancel", signing.ReasonUnsigned, 1)
	// Straight to the owner's inbox, as if another replica forwarded it.
	m := nats.NewMsg(f.subj.Inbox(s.nodeID))
	m.Header.Set(intake.HeaderKind, jobactor.ForwardResult)
	m.Data = forged
	reply, err := f.env.NATS.RequestMsg(m, 10*time.Second)
	if err != nil || string(reply.Data) != "nak" {
		t.Fatalf("forged forwarded result: reply %v, err %v", reply, err)
	}
	// The forward itself carries no node signature (Troupe-Signature): it
	// is refused before its packet is looked at.
	waitRejected(t, f.node, "result", signing.ReasonUnsigned, 2)
	if r, err := f.node.Record(context.Background(), "job-forge"); err != nil || r.State != jobstate.StateRunning {
		t.Fatalf("after forged packets: %v %+v", err, r)
	}

	close(release)
	r := f.waitState("job-forge", jobstate.StateSucceeded)
	for _, h := range r.History {
		if h.To == jobstate.StateFailed || h.To == jobstate.StateCancelled {
			t.Fatalf("a forged packet moved the job: %s", reasons(r.History))
		}
	}
}

// A cancel through the node's API is signed as the node, and the node
// (verifying) takes it.
func TestAPICancelIsSignedAsTheNode(t *testing.T) {
	t.Parallel()
	s := newSigSetup(t, "cancel")
	f := newFixture(t, s.nodeConfig(true))
	s.startWorker(f, s.keys, nil, hang)
	f.signedSubmit(s.client, "client", echoReq("job-api-cancel"))
	f.waitState("job-api-cancel", jobstate.StateRunning)
	if err := f.node.Cancel(context.Background(), "job-api-cancel", "test", "operator"); err != nil {
		t.Fatal(err)
	}
	f.waitState("job-api-cancel", jobstate.StateCancelled)
}

// A worker that does not know the node's key drops its dispatches; the job
// times out as if the worker never got it, and the node takes its own
// (signed) timeout cancel.
func TestWorkerDropsDispatchesItCannotVerify(t *testing.T) {
	t.Parallel()
	s := newSigSetup(t, "wdrop")
	f := newFixture(t, s.nodeConfig(true, func(c *troupe.Config) {
		c.Tuning.Timeouts = &troupe.Timeouts{Dispatch: 500 * time.Millisecond, Running: time.Hour}
	}))
	other := newSigSetup(t, "wdrop-other") // a key set where the node id is another key
	rec := newReceipts()
	w := s.startWorker(f, other.keys, rec, worker.Echo)
	f.signedSubmit(s.client, "client", echoReq("job-dropped"))
	r := f.waitState("job-dropped", jobstate.StateTimeout)
	if r.Reason != jobstate.ReasonDispatchTimeout || rec.count("job-dropped") != 0 || w.Rejected() == 0 {
		t.Fatalf("reason %s, receipts %d, worker rejected %d", r.Reason, rec.count("job-dropped"), w.Rejected())
	}
	if n := rejected(t, f.node, "cancel", signing.ReasonBadSignature) + rejected(t, f.node, "cancel", signing.ReasonUnsigned) +
		rejected(t, f.node, "cancel", signing.ReasonUnknownSender); n != 0 {
		t.Fatalf("the node rejected its own cancel %v times", n)
	}
}

// A heartbeat that does not verify is ignored: the worker it names never
// becomes a dispatch target.
func TestForgedHeartbeatIsIgnored(t *testing.T) {
	t.Parallel()
	s := newSigSetup(t, "hb")
	f := newFixture(t, s.nodeConfig(true))
	hb := &capv1.Heartbeat{WorkerId: "ghost", Pool: "echo", MaxParallelJobs: 100,
		Labels: map[string]string{"troupe.dispatch": "direct"}}
	unsigned, _ := bus.EncodeHeartbeat("ghost", hb)
	forged, _ := bus.Encoder{Signer: s.stranger}.Heartbeat(s.workerID, &capv1.Heartbeat{WorkerId: s.workerID, Pool: "echo"})
	for _, data := range [][]byte{unsigned, forged} {
		if err := f.env.NATS.Publish(f.subj.Heartbeat, data); err != nil {
			t.Fatal(err)
		}
	}
	waitRejected(t, f.node, "heartbeat", signing.ReasonUnsigned, 1)
	waitRejected(t, f.node, "heartbeat", signing.ReasonBadSignature, 1)
	ws, err := f.node.Workers()
	if err != nil || len(ws) != 0 {
		t.Fatalf("workers after forged heartbeats: %+v (%v)", ws, err)
	}
	s.startWorker(f, s.keys, nil, worker.Echo) // its signed heartbeat is taken
	ws, _ = f.node.Workers()
	if len(ws) != 1 || ws[0].ID != s.workerID {
		t.Fatalf("workers %+v", ws)
	}
}

// With verification off, unsigned packets are accepted as before; a node
// that only signs still signs its dispatches.
func TestVerificationOffAcceptsUnsignedPackets(t *testing.T) {
	t.Parallel()
	s := newSigSetup(t, "off")
	f := newFixture(t, s.nodeConfig(false))
	dispatches := captureVerified(t, f, f.subj.Worker("plain-w"), s.keys)
	w, err := worker.Start(f.env.NATS, worker.Config{ID: "plain-w", Pool: "echo", Topics: []string{"job.echo"},
		Direct: true, SubjectPrefix: f.subj.Prefix(), Heartbeat: time.Second}) // unsigned heartbeats and results
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	f.waitWorkers(1)
	f.submit(echoReq("job-plain"))
	f.waitState("job-plain", jobstate.StateSucceeded)
	nextVerified(t, dispatches, "dispatch of a node that signs but does not verify")
}
