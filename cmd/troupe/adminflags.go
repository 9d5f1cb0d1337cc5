package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/troupe-run/troupe"
	"github.com/troupe-run/troupe/internal/admin"
	"github.com/troupe-run/troupe/internal/inspect"
	"github.com/troupe-run/troupe/internal/jobdata"
)

// adminFlags start the node's admin HTTP server: /metrics, /healthz,
// /readyz, the JSON API and the /ui dashboard.
type adminFlags struct {
	listen         string
	keysFile       string
	metricsNeedKey bool
	selfApproval   bool
	maxPayload     int64
}

func (a *adminFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&a.listen, "admin-listen", envOr("TROUPE_ADMIN_LISTEN", admin.ListenDefault),
		`admin HTTP address ("" turns it off); anything but loopback needs API keys`)
	fs.StringVar(&a.keysFile, "api-keys-file", os.Getenv("TROUPE_API_KEYS_FILE"),
		`file of "key=tenant [role=client|operator] [name=who]" entries ("*" = every tenant); also TROUPE_API_KEYS`)
	fs.BoolVar(&a.metricsNeedKey, "metrics-need-key", envBool("TROUPE_METRICS_NEED_KEY"),
		"/metrics needs an all-tenant API key and /readyz any API key (also TROUPE_METRICS_NEED_KEY=1)")
	fs.BoolVar(&a.selfApproval, "allow-self-approval", envBool("TROUPE_ALLOW_SELF_APPROVAL"),
		"let an API principal approve or reject a job it submitted (also TROUPE_ALLOW_SELF_APPROVAL=1)")
	fs.Int64Var(&a.maxPayload, "max-payload", jobdata.MaxBytesDefault,
		"the largest payload (bytes) a submit through the API stores as a job's input; a larger one is refused 413")
}

// envBool reads a boolean variable: 1, true, yes (any case) are true.
func envBool(name string) bool {
	switch strings.ToLower(strings.TrimSpace(os.Getenv(name))) {
	case "1", "true", "yes":
		return true
	}
	return false
}

// start runs the admin server for node, or nothing when turned off. The
// returned stop is safe to call either way.
func (a *adminFlags) start(node *troupe.Node, log *slog.Logger) (func(), error) {
	if a.listen == "" {
		return func() {}, nil
	}
	raw := os.Getenv("TROUPE_API_KEYS")
	if a.keysFile != "" {
		b, err := os.ReadFile(a.keysFile)
		if err != nil {
			return nil, fmt.Errorf("api keys: %w", err)
		}
		raw += "\n" + string(b)
	}
	keys, err := admin.ParseKeyEntries(strings.TrimSpace(raw))
	if err != nil {
		return nil, err
	}
	srv, err := admin.NewServer(admin.Config{Node: inspect.Of(node), Registry: node.Metrics(), Listen: a.listen, Keys: keys,
		MetricsNeedKey: a.metricsNeedKey, AllowSelfApproval: a.selfApproval, MaxPayloadBytes: a.maxPayload, Log: log})
	if err != nil {
		return nil, err
	}
	if err := srv.Start(); err != nil {
		return nil, err
	}
	log.Info("admin API and dashboard", "url", "http://"+srv.Addr()+"/ui", "api_keys", len(keys))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Stop(ctx)
	}, nil
}
