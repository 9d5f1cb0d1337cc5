package supervisor

import "github.com/asynkron/protoactor-go/actor"

// Ask queues d, from shard, for resolving, as a shard does.
func (r *Resolver) Ask(shard *actor.PID, d *Deliver) bool { return r.ask(shard, d) }
