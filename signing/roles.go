package signing

import (
	"crypto/ecdsa"
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// Role is what a key's holder is: it decides which packets the node takes
// from it (SECURITY.md, "Roles and scopes").
type Role string

// Roles a key set entry can name.
const (
	// RoleNode: a Troupe node (replica). It dispatches jobs, tells
	// outcomes, cancels, and speaks on the node-to-node subjects.
	RoleNode Role = "node"
	// RoleWorker: a worker. It heartbeats for itself (or the worker ids
	// its entry lists) in its pools, and reports progress and results for
	// the jobs dispatched to it.
	RoleWorker Role = "worker"
	// RoleClient: a submitter. It submits and cancels jobs of its tenants.
	RoleClient Role = "client"
	// RoleOperator: a person or tool that cancels any tenant's jobs.
	RoleOperator Role = "operator"
)

// Wildcard in a scope list means every pool (or tenant).
const Wildcard = "*"

// maxScopeEntries bounds each scope list of one key set entry.
const maxScopeEntries = 1024

// Principal is who a verified packet is from: its sender id and what the
// key set says that sender may do. Role "" is a legacy entry (PEM keys
// only, in a key set where no entry names a role): it may act as every
// role, with no scope, which is how signatures worked before roles.
type Principal struct {
	Sender  string
	Role    Role
	Pools   []string // a worker's pools
	Tenants []string // a client's tenants
	Workers []string // worker ids a worker key may speak for besides its sender id
}

// Legacy reports whether the principal comes from an entry without a role.
func (p Principal) Legacy() bool { return p.Role == "" }

// Is reports whether the principal has one of roles (a legacy one has all).
func (p Principal) Is(roles ...Role) bool {
	return p.Legacy() || slices.Contains(roles, p.Role)
}

// SpeaksFor reports whether the principal may speak as worker id: its own
// sender id or one its entry lists (a legacy principal for any).
func (p Principal) SpeaksFor(worker string) bool {
	if p.Legacy() {
		return true
	}
	return p.Role == RoleWorker && worker != "" && (worker == p.Sender || slices.Contains(p.Workers, worker))
}

// InPool reports whether a worker principal serves pool.
func (p Principal) InPool(pool string) bool {
	if p.Legacy() {
		return true
	}
	return p.Role == RoleWorker && inScope(p.Pools, pool)
}

// ForTenant reports whether the principal may submit or cancel for tenant:
// nodes and operators for every tenant, clients for theirs.
func (p Principal) ForTenant(tenant string) bool {
	switch {
	case p.Legacy(), p.Role == RoleNode, p.Role == RoleOperator:
		return true
	case p.Role == RoleClient:
		return inScope(p.Tenants, tenant)
	}
	return false
}

func inScope(list []string, v string) bool {
	return slices.Contains(list, Wildcard) || slices.Contains(list, v)
}

// entry is one key set entry: its keys and what its holder may do.
type entry struct {
	keys []*ecdsa.PublicKey
	p    Principal // Sender left empty: filled with the packet's sender id
}

// parseEntry reads one sender's value: PEM keys (the legacy form) or a
// mapping {role, pools, tenants, workers, keys}. roled reports which form.
func parseEntry(v *yaml.Node, sender string) (e entry, roled bool, err error) {
	if v.Kind != yaml.MappingNode {
		keys, err := parseSenderKeys(v, sender)
		return entry{keys: keys}, false, err
	}
	var keysNode *yaml.Node
	seen := map[string]bool{}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, val := v.Content[i], v.Content[i+1]
		if seen[k.Value] {
			return e, true, ksErr(k, sender, "%q listed twice", k.Value)
		}
		seen[k.Value] = true
		switch k.Value {
		case "role":
			if val.Kind != yaml.ScalarNode {
				return e, true, ksErr(val, sender, "role: want one of node, worker, client, operator")
			}
			switch r := Role(val.Value); r {
			case RoleNode, RoleWorker, RoleClient, RoleOperator:
				e.p.Role = r
			default:
				return e, true, ksErr(val, sender, "role %q: want one of node, worker, client, operator", val.Value)
			}
		case "pools":
			if e.p.Pools, err = scopeList(val, sender, "pools"); err != nil {
				return e, true, err
			}
		case "tenants":
			if e.p.Tenants, err = scopeList(val, sender, "tenants"); err != nil {
				return e, true, err
			}
		case "workers":
			if e.p.Workers, err = scopeList(val, sender, "workers"); err != nil {
				return e, true, err
			}
		case "keys":
			keysNode = val
		default:
			return e, true, ksErr(k, sender, "unknown key %q (want role, pools, tenants, workers, keys)", k.Value)
		}
	}
	if e.p.Role == "" {
		return e, true, ksErr(v, sender, "no role (want role: node, worker, client or operator)")
	}
	if keysNode == nil {
		return e, true, ksErr(v, sender, "no keys")
	}
	if e.keys, err = parseSenderKeys(keysNode, sender); err != nil {
		return e, true, err
	}
	// A scope belongs to one role: a stray one is a mistake in the file
	// (a client with pools would suggest it serves them).
	switch {
	case e.p.Role == RoleWorker && len(e.p.Pools) == 0:
		return e, true, ksErr(v, sender, `a worker needs pools (its pools, or ["*"])`)
	case e.p.Role == RoleClient && len(e.p.Tenants) == 0:
		return e, true, ksErr(v, sender, `a client needs tenants (its tenants, or ["*"])`)
	case e.p.Role != RoleWorker && (len(e.p.Pools) > 0 || len(e.p.Workers) > 0):
		return e, true, ksErr(v, sender, "pools and workers are for role worker")
	case e.p.Role != RoleClient && len(e.p.Tenants) > 0:
		return e, true, ksErr(v, sender, "tenants are for role client")
	}
	return e, true, nil
}

func scopeList(v *yaml.Node, sender, what string) ([]string, error) {
	var items []*yaml.Node
	switch v.Kind {
	case yaml.ScalarNode:
		items = []*yaml.Node{v}
	case yaml.SequenceNode:
		items = v.Content
	default:
		return nil, ksErr(v, sender, "%s: want a list of names", what)
	}
	if len(items) > maxScopeEntries {
		return nil, ksErr(v, sender, "%s: more than %d entries", what, maxScopeEntries)
	}
	out := make([]string, 0, len(items))
	for _, it := range items {
		if it.Kind != yaml.ScalarNode || it.Value == "" || len(it.Value) > maxSenderLen ||
			strings.ContainsFunc(it.Value, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return nil, ksErr(it, sender, "%s: want non-empty names of at most %d bytes without spaces", what, maxSenderLen)
		}
		out = append(out, it.Value)
	}
	return out, nil
}

// String names the principal for logs and errors.
func (p Principal) String() string {
	role := string(p.Role)
	if role == "" {
		role = "legacy"
	}
	return fmt.Sprintf("%s (%s)", truncate(p.Sender), role)
}
