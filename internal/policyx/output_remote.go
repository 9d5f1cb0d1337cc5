package policyx

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/troupe-run/troupe/internal/outputgate"
	"github.com/troupe-run/troupe/internal/policyenv"
	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// Output check phases as OutputCheckRequest.phase carries them.
const (
	OutputPhaseMeta    int32 = 1
	OutputPhaseContent int32 = 2
)

// Timeouts of the remote output checker.
const (
	// RemoteOutputMetaTimeoutDefault bounds a phase-1 call: phase 1 holds
	// a result back from SUCCEEDED, so a slow service must not hold it
	// long (an error then releases the result, fail open).
	RemoteOutputMetaTimeoutDefault = 500 * time.Millisecond
)

// RemoteOutputConfig configures a RemoteOutputChecker.
type RemoteOutputConfig struct {
	// Addr is the OutputPolicy service's host:port (required).
	Addr string
	// TLS reaches it (same rules as the kernel client's).
	TLS ClientTLS
	// MetaTimeout bounds phase 1 (default RemoteOutputMetaTimeoutDefault).
	MetaTimeout time.Duration
	// ContentTimeout bounds phase 2 (default outputgate.ContentBudgetDefault).
	ContentTimeout time.Duration
	// DialOptions are appended to the client's own.
	DialOptions []grpc.DialOption
}

// RemoteOutputChecker is an safety.OutputChecker backed by an external
// OutputPolicy gRPC service. The service reads the content behind the
// result pointer itself, so ScanContent sends no bytes (the caller need not
// fetch them: see ReadsContentItself), and a REDACT comes back as a pointer
// to the copy the service stored.
type RemoteOutputChecker struct {
	cfg    RemoteOutputConfig
	conn   *grpc.ClientConn
	client capv1.OutputPolicyClient
}

// NewRemoteOutputChecker builds the client; it dials on first use.
func NewRemoteOutputChecker(cfg RemoteOutputConfig) (*RemoteOutputChecker, error) {
	if strings.TrimSpace(cfg.Addr) == "" {
		return nil, errors.New("safety.safety: output policy client needs an address")
	}
	if cfg.MetaTimeout <= 0 {
		cfg.MetaTimeout = RemoteOutputMetaTimeoutDefault
	}
	if cfg.ContentTimeout <= 0 {
		cfg.ContentTimeout = outputgate.ContentBudgetDefault
	}
	creds, err := cfg.TLS.Credentials(cfg.Addr)
	if err != nil {
		return nil, err
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: policyenv.ReconnectBackoff})}, cfg.DialOptions...)
	conn, err := grpc.NewClient(cfg.Addr, opts...)
	if err != nil {
		return nil, fmt.Errorf("safety.safety: output policy %s: %w", cfg.Addr, err)
	}
	return &RemoteOutputChecker{cfg: cfg, conn: conn, client: capv1.NewOutputPolicyClient(conn)}, nil
}

// Close closes the connection.
func (c *RemoteOutputChecker) Close() error { return c.conn.Close() }

// ReadsContentItself tells OutputGate not to fetch content for phase 2.
func (c *RemoteOutputChecker) ReadsContentItself() bool { return true }

// CheckMeta asks the service for a phase-1 decision.
func (c *RemoteOutputChecker) CheckMeta(ctx context.Context, req *capv1.OutputCheckRequest) (*safety.OutputVerdict, error) {
	return c.call(ctx, req, OutputPhaseMeta, c.cfg.MetaTimeout)
}

// ScanContent asks the service for a phase-2 decision; content is ignored
// (the service reads result_ptr).
func (c *RemoteOutputChecker) ScanContent(ctx context.Context, req *capv1.OutputCheckRequest, _ []byte) (*safety.OutputVerdict, error) {
	return c.call(ctx, req, OutputPhaseContent, c.cfg.ContentTimeout)
}

func (c *RemoteOutputChecker) call(ctx context.Context, req *capv1.OutputCheckRequest, phase int32, timeout time.Duration) (*safety.OutputVerdict, error) {
	r := proto.Clone(req).(*capv1.OutputCheckRequest)
	r.Phase = phase
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := c.client.CheckOutput(cctx, r)
	if err != nil {
		return nil, fmt.Errorf("safety.safety: output policy: %w", err)
	}
	if resp.Decision == capv1.OutputDecision_OUTPUT_DECISION_UNSPECIFIED {
		return nil, errors.New("safety.safety: output policy answered with no decision")
	}
	return &safety.OutputVerdict{Decision: resp.Decision, Reason: resp.Reason, RuleID: resp.RuleId,
		RedactedPtr: resp.RedactedPtr, PolicySnapshot: resp.PolicySnapshot}, nil
}

// OutputServer serves an safety.OutputChecker as the OutputPolicy gRPC service.
// Phase 1 (or 0) checks metadata; phase 2 fetches the content behind
// result_ptr from Results, scans it, and stores a redacted copy there,
// answering with its pointer.
type OutputServer struct {
	capv1.UnimplementedOutputPolicyServer
	checker safety.OutputChecker
	results safety.ResultStore
}

// NewOutputServer returns the service. results may be nil: phase-2
// requests are then refused (FailedPrecondition), which callers treat as
// "no decision" (fail open).
func NewOutputServer(checker safety.OutputChecker, results safety.ResultStore) *OutputServer {
	return &OutputServer{checker: checker, results: results}
}

// CheckOutput decides one phase for one result.
func (s *OutputServer) CheckOutput(ctx context.Context, req *capv1.OutputCheckRequest) (*capv1.OutputCheckResponse, error) {
	if req.GetPhase() != OutputPhaseContent {
		v, err := s.checker.CheckMeta(ctx, req)
		if err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		return v.Response(), nil
	}
	if s.results == nil {
		return nil, status.Error(codes.FailedPrecondition, "this output policy service has no access to result content")
	}
	ptr := req.GetResult().GetResultPtr()
	if ptr == "" {
		return &capv1.OutputCheckResponse{Decision: capv1.OutputDecision_OUTPUT_DECISION_ALLOW, Reason: "no result pointer"}, nil
	}
	content, err := s.results.Fetch(ctx, ptr)
	if err != nil {
		return nil, status.Error(codes.Unavailable, "fetch result: "+err.Error())
	}
	v, err := s.checker.ScanContent(ctx, req, content)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if v.Decision == capv1.OutputDecision_OUTPUT_DECISION_REDACT && v.RedactedPtr == "" {
		// No redacted copy means the result cannot be released: an error
		// here would read as "no decision" and release it unredacted.
		var serr error = errors.New("redact decision without redacted content")
		if v.Redacted != nil {
			v.RedactedPtr, serr = s.results.StoreRedacted(ctx, req.GetJobId(), ptr, v.Redacted)
		}
		if serr != nil {
			v.Decision = capv1.OutputDecision_OUTPUT_DECISION_QUARANTINE
			v.Reason += "; quarantined: no redacted copy could be stored: " + serr.Error()
		}
	}
	return v.Response(), nil
}

// Environment variables OutputConfigFromEnv reads.
const (
	EnvOutputEnabled = "OUTPUT_POLICY_ENABLED"
	EnvOutputFile    = "OUTPUT_POLICY_FILE"
	EnvOutputAddr    = "OUTPUT_POLICY_ADDR"
)

// OutputConfig selects the node's output checker.
type OutputConfig struct {
	// Enabled: check outputs at all. When unset (nil), an Addr enables
	// checking, a File's enabled: decides, and with neither outputs are not
	// checked.
	Enabled *bool
	// File is an output policy file for the built-in checker.
	File string
	// Addr, instead of File, is an external OutputPolicy gRPC service.
	Addr string
	// TLS reaches Addr.
	TLS ClientTLS
}

// OutputConfigFromEnv reads OUTPUT_POLICY_ENABLED, OUTPUT_POLICY_FILE and
// OUTPUT_POLICY_ADDR (TLS for the address: the SAFETY_KERNEL_TLS_* and
// SAFETY_KERNEL_INSECURE settings).
func OutputConfigFromEnv() (OutputConfig, error) {
	cfg := OutputConfig{File: strings.TrimSpace(os.Getenv(EnvOutputFile)), Addr: strings.TrimSpace(os.Getenv(EnvOutputAddr)),
		TLS: ClientTLS{CAFile: strings.TrimSpace(os.Getenv(EnvKernelTLSCA))}}
	if v := strings.TrimSpace(os.Getenv(EnvOutputEnabled)); v != "" {
		b, err := policyenv.EnvBool(EnvOutputEnabled)
		if err != nil {
			return cfg, err
		}
		cfg.Enabled = &b
	}
	var err error
	if cfg.TLS.Required, err = policyenv.EnvBool(EnvKernelTLSReq); err != nil {
		return cfg, err
	}
	if cfg.TLS.Insecure, err = policyenv.EnvBool(EnvKernelInsecure); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// NewOutputChecker builds the checker cfg selects, or nil when output
// checking is off. Enabled without a file or an address is the built-in
// default policy (secrets quarantined).
func NewOutputChecker(cfg OutputConfig) (safety.OutputChecker, error) {
	if cfg.File != "" && cfg.Addr != "" {
		return nil, errors.New("safety.safety: output policy: a file or an address, not both")
	}
	if cfg.Addr != "" {
		if cfg.Enabled != nil && !*cfg.Enabled {
			return nil, nil
		}
		return NewRemoteOutputChecker(RemoteOutputConfig{Addr: cfg.Addr, TLS: cfg.TLS})
	}
	p := safety.DefaultOutputPolicy()
	if cfg.File != "" {
		var err error
		if p, err = safety.LoadOutputPolicy(cfg.File); err != nil {
			return nil, err
		}
	}
	on := cfg.File != "" && p.Enabled
	if cfg.Enabled != nil {
		on = *cfg.Enabled
	}
	if !on {
		return nil, nil
	}
	return p, nil
}

var _ safety.OutputChecker = (*RemoteOutputChecker)(nil)
