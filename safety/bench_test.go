package safety_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/troupe-run/troupe/internal/policyx"
	"github.com/troupe-run/troupe/internal/testenv"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// latencies times n calls of f one by one and returns the p50, p99 and
// maximum. Timing each call adds ~50 ns of clock reads to each figure.
func latencies(n int, f func()) (p50, p99, worst time.Duration) {
	d := make([]time.Duration, n)
	for i := range d {
		s := time.Now()
		f()
		d[i] = time.Since(s)
	}
	slices.Sort(d)
	return d[n/2], d[n*99/100], d[n-1]
}

// reportLatencies measures n calls, logs the percentiles and reports p99
// on the benchmark line. No assertion: the machine is shared.
func reportLatencies(b *testing.B, n int, f func()) {
	b.Helper()
	p50, p99, worst := latencies(n, f)
	b.Logf("%d calls: p50 %v, p99 %v, max %v", n, p50, p99, worst)
	b.ReportMetric(float64(p99.Nanoseconds()), "p99-ns")
}

// policy50 is a 50-rule policy of the shapes real policies have: tenant
// and topic scoping, capabilities, risk tags, labels, MCP lists, a few
// with constraints. The request the benchmarks use matches only the last
// rule, so every check walks all 50.
func policy50() []byte {
	var sb strings.Builder
	sb.WriteString("version: bench\nrules:\n")
	for i := 0; i < 49; i++ {
		fmt.Fprintf(&sb, "  - id: r%02d\n    match:\n", i)
		switch i % 5 {
		case 0:
			fmt.Fprintf(&sb, "      tenants: [tenant-%d, other-%d]\n      topics: [\"job.svc%d.*\"]\n", i, i, i)
		case 1:
			fmt.Fprintf(&sb, "      topics: [\"job.team%d.*\", \"job.batch%d\"]\n      capabilities: [cap-%d]\n", i, i, i)
		case 2:
			fmt.Fprintf(&sb, "      risk_tags: [risk-%d, prod-%d]\n", i, i)
		case 3:
			fmt.Fprintf(&sb, "      labels: {team: t%d, env: prod}\n      topics: [\"job.*\"]\n", i)
		case 4:
			fmt.Fprintf(&sb, "      topics: [\"job.mcp%d.*\"]\n      mcp: {allow_servers: [s%d, github], deny_tools: [rm]}\n", i, i)
		}
		switch i % 4 {
		case 0:
			sb.WriteString("    decision: deny\n    reason: bench\n")
		case 1:
			sb.WriteString("    decision: require_approval\n")
		case 2:
			sb.WriteString("    decision: allow\n    constraints: {budgets: {max_runtime_ms: 1000}, redaction_level: basic}\n")
		case 3:
			sb.WriteString("    decision: throttle\n")
		}
	}
	sb.WriteString("  - id: last\n    match: {tenants: [acme], topics: [\"job.bench.*\"]}\n    decision: allow\n")
	return []byte(sb.String())
}

func benchRequest() *capv1.PolicyCheckRequest {
	return &capv1.PolicyCheckRequest{JobId: "job-bench", Topic: "job.bench.run", Tenant: "acme",
		Labels: map[string]string{"team": "core", "env": "dev", "mcp.server": "github", "mcp.tool": "list"},
		Meta: &capv1.JobMetadata{Capability: "cap-x", RiskTags: []string{"low"}, Requires: []string{"docker"},
			ActorType: capv1.ActorType_ACTOR_TYPE_SERVICE}}
}

// BenchmarkEngineCheck50Rules: the in-process engine (troupe dev, node
// --policy) against 50 rules, walking all of them. Target: p99 ≤ 10 µs.
func BenchmarkEngineCheck50Rules(b *testing.B) {
	e, err := safety.NewEngine(policy50())
	if err != nil {
		b.Fatal(err)
	}
	if e.Policy().Rules() != 50 {
		b.Fatalf("%d rules", e.Policy().Rules())
	}
	ctx, r := context.Background(), benchRequest()
	if resp, _ := e.Check(ctx, r); resp.RuleId != "last" {
		b.Fatalf("matched %s", resp.RuleId)
	}
	reportLatencies(b, 100_000, func() { _, _ = e.Check(ctx, r) })
	b.ReportAllocs()
	for b.Loop() {
		_, _ = e.Check(ctx, r)
	}
}

// BenchmarkEngineCheckConstraints: a match early in the list that returns
// constraints (the response carries copies of them).
func BenchmarkEngineCheckConstraints(b *testing.B) {
	e, _ := safety.NewEngine(policy50())
	ctx := context.Background()
	r := benchRequest()
	r.Meta.RiskTags = []string{"risk-2"} // r02: allow + constraints
	if resp, _ := e.Check(ctx, r); resp.RuleId != "r02" || resp.Decision != allowWith {
		b.Fatalf("matched %v", resp)
	}
	reportLatencies(b, 100_000, func() { _, _ = e.Check(ctx, r) })
	b.ReportAllocs()
	for b.Loop() {
		_, _ = e.Check(ctx, r)
	}
}

// BenchmarkKernelCheckGRPC: one Check round trip on loopback, through a
// stock client, Troupe's KernelClient with the in-process breaker, and the
// KernelClient with the breaker shared in Redis (one more round trip).
func BenchmarkKernelCheckGRPC(b *testing.B) {
	e, _ := safety.NewEngine(policy50())
	addr := serve(b, nil, func(s *grpc.Server) { capv1.RegisterSafetyKernelServer(s, policyx.NewKernelServer(e)) })
	ctx, r := context.Background(), benchRequest()

	b.Run("stock-client", func(b *testing.B) {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		k := capv1.NewSafetyKernelClient(conn)
		if _, err := k.Check(ctx, r); err != nil {
			b.Fatal(err)
		}
		reportLatencies(b, 5_000, func() { _, _ = k.Check(ctx, r) })
		b.ReportAllocs()
		for b.Loop() {
			if _, err := k.Check(ctx, r); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, shared := range []bool{false, true} {
		name := "kernel-client-local-breaker"
		cfg := policyx.KernelClientConfig{Addr: addr, Log: quietLog}
		if shared {
			name = "kernel-client-redis-breaker"
			env := testenv.New(b)
			cfg.Redis, cfg.KeyPrefix = env.Redis, env.KeyPrefix()
		}
		b.Run(name, func(b *testing.B) {
			c, err := policyx.NewKernelClient(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Check(ctx, r); err != nil {
				b.Fatal(err)
			}
			reportLatencies(b, 5_000, func() { _, _ = c.Check(ctx, r) })
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Check(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkOutputPhase1: the metadata check before SUCCEEDED, with both
// scanners on and a result with three artifact pointers. Target: p99 ≤ 1 ms.
func BenchmarkOutputPhase1(b *testing.B) {
	p := outputPolicy(b)
	ctx := context.Background()
	r := outReq("job.x", "beta", "redis://res:job-bench", func(r *capv1.OutputCheckRequest) {
		r.Result.ArtifactPtrs = []string{"redis://art:job-bench:1", "s3://bucket/job-bench/2"}
		r.Result.ExecutionMs = 1234
	})
	if v, _ := p.CheckMeta(ctx, r); v.Decision != oAllow {
		b.Fatalf("decision %v", v.Decision)
	}
	reportLatencies(b, 100_000, func() { _, _ = p.CheckMeta(ctx, r) })
	b.ReportAllocs()
	for b.Loop() {
		_, _ = p.CheckMeta(ctx, r)
	}
}

// BenchmarkOutputPhase2: the content scan of a 1 MiB JSON-ish result with
// both scanners on and nothing to find (the common case; throughput in
// MB/s).
func BenchmarkOutputPhase2(b *testing.B) {
	p2, err := safety.ParseOutputPolicy([]byte("limits: {max_result_bytes: 2097152}\nscanners: {pii: {enabled: true}}\n"))
	if err != nil {
		b.Fatal(err)
	}
	for name, line := range map[string]string{
		"plain-json": `{"id": 12345, "name": "widget", "tags": ["a", "b"], "score": 0.75, "note": "nothing sensitive here"},`,
		// URLs and @handles wake the url_password and email regexps.
		"urls-and-handles": `{"url": "https://example.com/a/b?c=d", "by": "@someone", "at": "2024-01-15T10:00:00Z", "n": 42},`,
	} {
		b.Run(name, func(b *testing.B) {
			content := []byte(strings.Repeat(line+"\n", (1<<20)/(len(line)+1)))
			ctx, r := context.Background(), outReq("job.x", "beta", "redis://res:job-bench")
			if v, _ := p2.ScanContent(ctx, r, content); v.Decision != oAllow {
				b.Fatalf("decision %v %v", v.Decision, v.Reason)
			}
			b.SetBytes(int64(len(content)))
			b.ReportAllocs()
			for b.Loop() {
				_, _ = p2.ScanContent(ctx, r, content)
			}
		})
	}
}
