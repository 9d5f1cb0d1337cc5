package policyx

import (
	"context"

	"github.com/troupe-run/troupe/proto/capv1"
	"github.com/troupe-run/troupe/safety"
)

// KernelServer serves an Engine as the CAP SafetyKernel gRPC service
// (/cordum.agent.v1.SafetyKernel/*), so that existing schedulers and
// Troupe's KernelClient can use it. Check, Evaluate and Simulate decide
// alike (as CAP kernels do); Explain puts the why in the reason;
// ListSnapshots lists the policy versions the engine has had in force.
type KernelServer struct {
	capv1.UnimplementedSafetyKernelServer
	engine *safety.Engine
}

// NewKernelServer returns the service for engine; register it with
// capv1.RegisterSafetyKernelServer.
func NewKernelServer(engine *safety.Engine) *KernelServer {
	return &KernelServer{engine: engine}
}

// Check decides req. A request the engine cannot place (an empty topic) is
// denied like any topic outside job.*, not refused: an error would read as
// "kernel unavailable" and be retried for ever.
func (s *KernelServer) Check(ctx context.Context, req *capv1.PolicyCheckRequest) (*capv1.PolicyCheckResponse, error) {
	return s.engine.Check(ctx, req)
}

// Evaluate is Check (CAP serves the four decision RPCs alike).
func (s *KernelServer) Evaluate(ctx context.Context, req *capv1.PolicyCheckRequest) (*capv1.PolicyCheckResponse, error) {
	return s.Check(ctx, req)
}

// Simulate is Check: the engine has no side effects to skip.
func (s *KernelServer) Simulate(ctx context.Context, req *capv1.PolicyCheckRequest) (*capv1.PolicyCheckResponse, error) {
	return s.Check(ctx, req)
}

// Explain decides req and says why in the reason.
func (s *KernelServer) Explain(ctx context.Context, req *capv1.PolicyCheckRequest) (*capv1.PolicyCheckResponse, error) {
	return s.engine.Explain(ctx, req)
}

// ListSnapshots lists the policy versions seen, the one in force last.
func (s *KernelServer) ListSnapshots(context.Context, *capv1.ListSnapshotsRequest) (*capv1.ListSnapshotsResponse, error) {
	return &capv1.ListSnapshotsResponse{Snapshots: s.engine.Snapshots()}, nil
}
