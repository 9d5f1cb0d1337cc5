package intake

import (
	"slices"
	"testing"

	"github.com/troupe-run/troupe/internal/store"
	"github.com/troupe-run/troupe/signing"
)

// TestCancelMarksNameTheCancellersTenants: a cancel mark applies to the
// tenants its canceller may cancel for — any for an unsigned cancel, a
// node, an operator or a legacy key; a client key's own; none for a worker
// key (its cancel is not recorded).
func TestCancelMarksNameTheCancellersTenants(t *testing.T) {
	any := []string{store.AnyTenant}
	cases := []struct {
		name string
		p    *signing.Principal
		want []string
	}{
		{"unsigned", nil, any},
		{"legacy", &signing.Principal{Sender: "x"}, any},
		{"node", &signing.Principal{Role: signing.RoleNode}, any},
		{"operator", &signing.Principal{Role: signing.RoleOperator}, any},
		{"client", &signing.Principal{Role: signing.RoleClient, Tenants: []string{"a", "b"}}, []string{"a", "b"}},
		{"client of every tenant", &signing.Principal{Role: signing.RoleClient, Tenants: []string{signing.Wildcard}}, any},
		{"client of no tenant", &signing.Principal{Role: signing.RoleClient}, nil},
		{"worker", &signing.Principal{Role: signing.RoleWorker, Pools: []string{"p"}}, nil},
	}
	for _, c := range cases {
		if got := markTenants(c.p); !slices.Equal(got, c.want) {
			t.Errorf("%s: tenants %v, want %v", c.name, got, c.want)
		}
	}
}
