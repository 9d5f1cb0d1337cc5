package troupe

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/troupe-run/troupe/internal/bus"
	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/internal/router"
	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/internal/supervisor"
	"github.com/troupe-run/troupe/proto/capv1"
)

// Submit publishes req on the submit subject, as any CAP client would.
func (n *Node) Submit(ctx context.Context, req *capv1.JobRequest) error {
	data, err := bus.EncodeRequest(req.JobId, n.apiSender("troupe-api"), req)
	if err != nil {
		return err
	}
	_, err = n.js.Publish(ctx, n.subj.Submit, data)
	return err
}

// Cancel publishes a JobCancel for jobID on the cancel subject (JetStream,
// so the node takes it even if it arrives before the job does).
func (n *Node) Cancel(ctx context.Context, jobID, reason, by string) error {
	data, err := bus.EncodeCancel(jobID, n.apiSender(by), &capv1.JobCancel{JobId: jobID, Reason: reason, RequestedBy: by})
	if err != nil {
		return err
	}
	_, err = n.js.Publish(ctx, n.subj.Cancel, data)
	return err
}

// MarkCancel records the cancel of a job that has no record and waits on
// no node — its submit, if it comes, still held in the stream — for a job
// of one of tenants (store.AnyTenant: any): the job is created CANCELLED
// when a node takes it, and never dispatched. store.ErrJobExists: the job
// has a record (cancel it with Cancel).
func (n inspector) MarkCancel(ctx context.Context, jobID string, tenants []string, by, reason string) error {
	return n.store.MarkCancel(ctx, jobID, tenants, by, reason)
}

// Decide records a human decision on a job waiting for approval; the job
// resumes (or is denied) on whichever replica wakes it. hash, when set, must
// match the job hash recorded when approval was requested.
func (n *Node) Decide(ctx context.Context, jobID string, d Decision, by, reason, hash string) error {
	return n.decide(ctx, jobID, store.Decision(d), by, reason, hash)
}

// Decide is Node.Decide in the store's type (the admin API).
func (n inspector) Decide(ctx context.Context, jobID string, d store.Decision, by, reason, hash string) error {
	return n.decide(ctx, jobID, d, by, reason, hash)
}

// decide records the decision, which makes the job due now, and pokes this
// node's due poller out of its idle interval: if this node polls, the job
// is woken DueSlack + DuePoll later, not DueSlack + DueIdlePoll.
func (n *Node) decide(ctx context.Context, jobID string, d store.Decision, by, reason, hash string) error {
	err := n.store.Decide(ctx, jobID, d, by, reason, hash)
	if p := n.duePoked.Load(); err == nil && p != nil {
		p.Poke()
	}
	return err
}

// Job reads a job's record and history from Redis (ErrNotFound: none).
func (n *Node) Job(ctx context.Context, jobID string) (*Job, error) {
	rec, err := n.store.GetJob(ctx, jobID)
	return jobOf(rec), err
}

// Job reads a job's record as the store holds it (the admin API).
func (n inspector) Job(ctx context.Context, jobID string) (*store.JobRecord, error) {
	return n.store.GetJob(ctx, jobID)
}

// Workers lists the live workers the router knows.
func (n inspector) Workers() ([]router.WorkerInfo, error) {
	res, err := n.sys.Root.RequestFuture(n.router, &router.ListWorkers{}, 5*time.Second).Result()
	if err != nil {
		return nil, err
	}
	return res.([]router.WorkerInfo), nil
}

// holdSubmits is the submit fetch loop's backpressure: while the node has
// as many fresh jobs waiting for capacity within their grace as it may
// (actors.Env.MaxUnwrittenWaits), or as many jobs taken from the stream and
// not yet dispatched, written or finished (actors.Env.MaxAdmitting), it
// pulls no more submits. Other jobs are not held up for long by it: a
// waiting job leaves those sets when it is placed or, at the latest, when
// its grace ends.
func (n *Node) holdSubmits() bool {
	return n.env.Unwritten.Load() >= n.env.MaxUnwrittenWaits ||
		n.env.MaxAdmitting > 0 && n.env.Admitting.Load() >= n.env.MaxAdmitting
}

// submitRoom is how many more submits the node should take now: the
// smaller room of the two bounds holdSubmits keeps (each submit fetch asks
// for no more, so a burst is shared between replicas as they admit it).
// Below an eighth of MaxAdmitting (64 at most) it is 0, and the fetch loops
// wait for more room: near the bound, fetches of a few messages each would
// cost a pull request per few jobs.
func (n *Node) submitRoom() int {
	room := n.env.MaxUnwrittenWaits - n.env.Unwritten.Load()
	if n.env.MaxAdmitting > 0 {
		room = min(room, n.env.MaxAdmitting-n.env.Admitting.Load())
		if low := min(submitRoomLow, max(n.env.MaxAdmitting/8, 1)); room < low {
			return 0
		}
	}
	return int(max(room, 0))
}

// submitRoomLow is the most room submitRoom waits for (see there).
const submitRoomLow = 64

// QueuePosition says how many jobs wait before jobID in its pool's
// capacity queue, asking the node that owns the job (its lock holder) when
// that is another node; -1 when the job does not wait for capacity.
func (n *Node) QueuePosition(ctx context.Context, jobID string) (int, error) {
	rec, err := n.store.GetJob(ctx, jobID)
	if err != nil {
		return -1, err
	}
	if rec.State != jobstate.StateScheduled {
		return -1, nil
	}
	owner, _, _ := strings.Cut(rec.LockHolder, "|")
	if owner == "" {
		return -1, nil
	}
	if owner == n.cfg.NodeID {
		return n.localQueuePosition(jobID), nil
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	msg, err := n.nc.RequestMsgWithContext(cctx, bus.NewSignedMsg(n.subj.QueueAsk(owner), n.cfg.NodeID, []byte(jobID)))
	if err != nil {
		return -1, fmt.Errorf("troupe: ask node %s for the queue position of %s: %w", owner, jobID, err)
	}
	pos, err := strconv.Atoi(string(msg.Data))
	if err != nil {
		return -1, fmt.Errorf("troupe: node %s answered %q for a queue position", owner, msg.Data)
	}
	return pos, nil
}

// WaitingJob describes jobID if it waits for room in a capacity queue —
// this node's, else that of a replica this node hears — or returns nil. It
// is how a job waiting within its capacity grace, which has no record yet,
// is seen: SCHEDULED with its reason and queue position.
func (n inspector) WaitingJob(ctx context.Context, jobID string) (*router.Waiting, error) {
	if w := n.localWaiting(jobID); w != nil {
		return w, nil
	}
	replies, err := n.askPeers(ctx, n.subj.QueueFind, []byte(jobID))
	if err != nil {
		return nil, err
	}
	for _, data := range replies {
		var w router.Waiting
		if len(data) > 0 && json.Unmarshal(data, &w) == nil {
			return &w, nil
		}
	}
	return nil, nil
}

// waitingNode names the node on which jobID waits for room ("" when none
// says so): intake.Intake.FindWaiting.
func (n *Node) waitingNode(ctx context.Context, jobID string) string {
	if w, err := (inspector{n}).WaitingJob(ctx, jobID); err == nil && w != nil {
		return w.Node
	}
	return ""
}

// WaitingJobs lists the jobs waiting for room within their capacity grace
// — no record yet — on this node and the replicas it hears, of tenant (""
// for all), newest first, at most limit (each node is asked for that many).
// Waits already written SCHEDULED are left out: they are listed from Redis.
func (n inspector) WaitingJobs(ctx context.Context, tenant string, limit int) ([]router.Waiting, error) {
	all := n.localWaitingList(tenant, limit)
	body, _ := json.Marshal(waitListQuery{Tenant: tenant, Limit: limit})
	replies, err := n.askPeers(ctx, n.subj.QueueList, body)
	if err != nil {
		return nil, err
	}
	for _, data := range replies {
		var ws []router.Waiting
		if json.Unmarshal(data, &ws) == nil {
			all = append(all, ws...)
		}
	}
	if len(all) == 0 {
		return nil, nil
	}
	ids := make([]string, len(all))
	for i, w := range all {
		ids[i] = w.JobID
	}
	states, err := n.store.States(ctx, ids)
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, w := range all {
		if _, written := states[w.JobID]; !written {
			out = append(out, w)
		}
	}
	slices.SortFunc(out, func(a, b router.Waiting) int { return b.Since.Compare(a.Since) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// askPeers sends body to every replica this node's router hears, on the
// subject subject(peer), all at once, and returns the replies that came
// within a second (core NATS request/reply).
func (n *Node) askPeers(ctx context.Context, subject func(peer string) string, body []byte) ([][]byte, error) {
	res, err := n.sys.Root.RequestFuture(n.router, &router.ListPeers{}, 2*time.Second).Result()
	if err != nil {
		return nil, err
	}
	peers, _ := res.([]string)
	if len(peers) == 0 {
		return nil, nil
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	replies := make(chan []byte, len(peers))
	for _, peer := range peers {
		go func() {
			var data []byte
			if msg, err := n.nc.RequestMsgWithContext(cctx, bus.NewSignedMsg(subject(peer), n.cfg.NodeID, body)); err == nil {
				data = msg.Data
			}
			replies <- data
		}()
	}
	out := make([][]byte, 0, len(peers))
	for range peers {
		if data := <-replies; data != nil {
			out = append(out, data)
		}
	}
	return out, nil
}

// maxWaitList bounds the jobs one node lists for another.
const maxWaitList = 1000

// waitListQuery is the body of a QueueList request.
type waitListQuery struct {
	Tenant string `json:"tenant"`
	Limit  int    `json:"limit"`
}

func (n *Node) localWaitingList(tenant string, limit int) []router.Waiting {
	res, err := n.sys.Root.RequestFuture(n.router, &router.ListWaiting{Tenant: tenant, Limit: limit}, 2*time.Second).Result()
	if err != nil {
		return nil
	}
	ws, _ := res.([]router.Waiting)
	return ws
}

func (n *Node) localWaiting(jobID string) *router.Waiting {
	res, err := n.sys.Root.RequestFuture(n.router, &router.FindWaiting{JobID: jobID}, 2*time.Second).Result()
	if err != nil {
		return nil
	}
	w, _ := res.(*router.Waiting)
	return w
}

func (n *Node) localQueuePosition(jobID string) int {
	res, err := n.sys.Root.RequestFuture(n.router, &router.QueuePosition{JobID: jobID}, 2*time.Second).Result()
	if err != nil {
		return -1
	}
	pos, _ := res.(int)
	return pos
}

// LiveJobActors counts the job actors alive on this node.
func (n inspector) LiveJobActors() (int, error) {
	total := 0
	for _, pid := range n.shards {
		res, err := n.sys.Root.RequestFuture(pid, &supervisor.CountLive{}, 5*time.Second).Result()
		if err != nil {
			return 0, err
		}
		total += res.(int)
	}
	return total, nil
}

// apiSender is the sender id of a packet the node publishes for its API:
// with a Signer, the node's own id (the one it signs as), else sender.
func (n *Node) apiSender(sender string) string {
	if n.cfg.Signer != nil {
		return n.cfg.NodeID
	}
	return sender
}
