// Package bus is Troupe's side of NATS: CAP subject names, the JetStream
// streams and durable consumers that carry submits, results and cancels, and
// packet encoding helpers.
package bus

import "strings"

// Subjects names every CAP subject, optionally under a prefix (tests give each
// test its own prefix so they can share one NATS server).
type Subjects struct {
	prefix    string
	Submit    string
	Result    string
	Progress  string
	Cancel    string
	DLQ       string
	Heartbeat string
}

// NewSubjects returns the CAP subjects under prefix ("" for the standard names).
func NewSubjects(prefix string) Subjects {
	if prefix != "" && !strings.HasSuffix(prefix, ".") {
		prefix += "."
	}
	return Subjects{
		prefix:    prefix,
		Submit:    prefix + "sys.job.submit",
		Result:    prefix + "sys.job.result",
		Progress:  prefix + "sys.job.progress",
		Cancel:    prefix + "sys.job.cancel",
		DLQ:       prefix + "sys.job.dlq",
		Heartbeat: prefix + "sys.heartbeat",
	}
}

// Prefix returns the subject prefix, with its trailing dot.
func (s Subjects) Prefix() string { return s.prefix }

// Worker is the direct subject of one worker: worker.<id>.jobs.
func (s Subjects) Worker(workerID string) string { return s.prefix + "worker." + workerID + ".jobs" }

// IsWorker reports whether subject is Worker(workerID), without building
// it (a dispatch asks once per job).
func (s Subjects) IsWorker(subject, workerID string) bool {
	const head, tail = "worker.", ".jobs"
	if len(subject) != len(s.prefix)+len(head)+len(workerID)+len(tail) {
		return false
	}
	rest, ok := strings.CutPrefix(subject, s.prefix)
	if !ok {
		return false
	}
	rest, ok = strings.CutPrefix(rest, head)
	return ok && rest[:len(workerID)] == workerID && rest[len(workerID):] == tail
}

// Inbox is the subject on which a node takes results and cancels forwarded
// by other replicas for jobs it owns (core NATS request/reply).
func (s Subjects) Inbox(nodeID string) string { return s.prefix + "troupe.node." + nodeID + ".inbox" }

// QueueAsk is the subject on which a node answers where a job it owns
// waits in its capacity queue (core NATS request/reply: the job id in, the
// position as a decimal out, -1 when the job does not wait there).
func (s Subjects) QueueAsk(nodeID string) string {
	return s.prefix + "troupe.node." + nodeID + ".queue"
}

// QueueFind is the subject on which a node describes a job waiting in its
// capacity queue (core NATS request/reply: the job id in, a JSON
// router.Waiting out, an empty body when the job does not wait there).
func (s Subjects) QueueFind(nodeID string) string {
	return s.prefix + "troupe.node." + nodeID + ".waiting"
}

// QueueList is the subject on which a node lists the jobs waiting in its
// capacity queue (core NATS request/reply: a JSON {tenant, limit} in, a
// JSON list of router.Waiting out).
func (s Subjects) QueueList(nodeID string) string {
	return s.prefix + "troupe.node." + nodeID + ".waitlist"
}

// Capacity is the subject on which replicas share how many jobs each has
// in flight on each worker (core NATS; see router/gossip.go).
func (s Subjects) Capacity() string { return s.prefix + "troupe.capacity" }

// Probe is the subject inside kind's stream that a StreamKeeper publishes
// its write probes to. No CAP client or worker listens on it (a probe on the
// CAP subject itself would reach their core subscriptions); the stream's
// consumer takes it and Consume acks it unread.
func (s Subjects) Probe(kind StreamKind) string {
	return s.prefix + "troupe.probe." + strings.ToLower(string(kind))
}

// Pool is the subject a pool's stock CAP workers queue-subscribe to: the
// job's topic itself (queue group = the subject).
func (s Subjects) Pool(topic string) string { return s.prefix + topic }
