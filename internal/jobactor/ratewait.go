package jobactor

import (
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/troupe-run/troupe/internal/lifecycle"
	"github.com/troupe-run/troupe/internal/ratelimit"
)

// takeTokens asks the node's limiter for the job's tokens. An answer the
// limiter gives at once is the next event; a later one (the grant, or
// "not yet" after its first call to Redis) comes by message.
func (a *JobActor) takeTokens(c actor.Context, e lifecycle.TakeTokens) any {
	answer := func(granted bool) *lifecycle.Tokens {
		return &lifecycle.Tokens{Epoch: e.Epoch, Granted: granted, Bucket: e.Bucket, Units: e.Units}
	}
	if a.env.Rates == nil {
		return answer(true) // no limiter: nothing to wait for
	}
	self, root := c.Self(), a.env.Root
	switch a.env.Rates.Take(a.id, e.Bucket, e.Units, e.Epoch, func(granted bool, problem string) {
		t := answer(granted)
		t.Invalid = problem
		root.Send(self, t)
	}) {
	case ratelimit.Granted:
		return answer(true)
	case ratelimit.Unknown:
		// A pools reload removed the bucket, or cut its burst below the
		// units, since the core resolved them: never grantable.
		t := answer(false)
		t.Invalid = fmt.Sprintf("rate limit bucket %q no longer declared with a burst of %d units or more (pools reload)",
			e.Bucket, e.Units)
		return t
	case ratelimit.Queued:
		return answer(false)
	}
	return nil
}

// parkTokens keeps the job's ask in the limiter's queue while the job
// parks: the grant (or never) is handed to the job's shard, which spawns
// the job's next actor with it (see supervisor.JobShard's Redeliver).
func (a *JobActor) parkTokens(c actor.Context, e lifecycle.ParkTokens) {
	if a.env.Rates == nil {
		return
	}
	shard, root, id := c.Parent(), a.env.Root, a.id
	a.env.Rates.Park(id, e.Bucket, e.Epoch, func(granted bool, problem string) {
		t := &lifecycle.Tokens{Granted: granted, Bucket: e.Bucket, Units: e.Units, Invalid: problem}
		root.Send(shard, &Redeliver{JobID: id, Msgs: []any{t}})
	})
}
