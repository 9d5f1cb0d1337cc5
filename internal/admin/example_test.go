package admin_test

import (
	"context"
	"log"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/inspect"
)

// An embedding program serves the admin API, the metrics and the dashboard
// of its node. With API keys it may listen on every interface; each key
// sees its own tenant's jobs, and "*" sees all of them.
func ExampleNewServer() {
	node, err := troupe.NewNode(troupe.Config{PoolsFile: "pools.yaml"})
	if err != nil {
		log.Fatal(err)
	}
	if err := node.Start(context.Background()); err != nil {
		log.Fatal(err)
	}
	defer node.Stop(context.Background())

	srv, err := admin.NewServer(admin.Config{
		Node:     inspect.Of(node),
		Registry: node.Metrics(),
		Listen:   ":8080", // every interface: API keys required
		APIKeys: map[string]string{
			"3f1c0d2e9a8b7c6d5e4f3a2b1c0d9e8f": admin.AllTenants, // operators
			"9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b": "acme",           // one tenant's automation
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		log.Fatal(err)
	}
	defer srv.Stop(context.Background())
	// ... serve until told to stop; /ui is the dashboard, /metrics the
	// node's Prometheus registry, /readyz its readiness.
}
