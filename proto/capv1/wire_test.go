package capv1_test

import (
	"bytes"
	"math"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/troupe-run/troupe/proto/capv1"
)

// These tests build CAP messages byte by byte from the field numbers and wire
// types of the protocol (not from our generated code), decode them with our
// types, check every field, and re-encode to the same bytes. A renumbered or
// retyped field fails here.

type wb []byte

func (b wb) str(n protowire.Number, s string) wb {
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendString(b, s)
}
func (b wb) raw(n protowire.Number, v []byte) wb {
	b = protowire.AppendTag(b, n, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}
func (b wb) varint(n protowire.Number, v uint64) wb {
	b = protowire.AppendTag(b, n, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}
func (b wb) f32(n protowire.Number, v float32) wb {
	b = protowire.AppendTag(b, n, protowire.Fixed32Type)
	return protowire.AppendFixed32(b, math.Float32bits(v))
}
func (b wb) f64(n protowire.Number, v float64) wb {
	b = protowire.AppendTag(b, n, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, math.Float64bits(v))
}
func (b wb) msg(n protowire.Number, sub wb) wb { return b.raw(n, sub) }
func (b wb) kv(n protowire.Number, k, v string) wb {
	return b.msg(n, wb{}.str(1, k).str(2, v))
}

func roundTrip(t *testing.T, name string, wire []byte, got, want proto.Message) {
	t.Helper()
	if err := proto.Unmarshal(wire, got); err != nil {
		t.Fatalf("%s: decode: %v", name, err)
	}
	if !proto.Equal(got, want) {
		t.Fatalf("%s: decoded\n%v\nwant\n%v", name, got, want)
	}
	if len(got.ProtoReflect().GetUnknown()) != 0 {
		t.Fatalf("%s: fields decoded as unknown: %x", name, got.ProtoReflect().GetUnknown())
	}
	out, err := proto.MarshalOptions{Deterministic: true}.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, wire) {
		t.Fatalf("%s: re-encoded\n%x\nwant\n%x", name, out, wire)
	}
}

func budgetWire() wb { return wb{}.varint(1, 100).varint(2, 200).varint(3, 300).varint(4, 4000) }
func budgetWant() *capv1.Budget {
	return &capv1.Budget{MaxInputTokens: 100, MaxOutputTokens: 200, MaxTotalTokens: 300, DeadlineMs: 4000}
}

func metaWire() wb {
	return wb{}.str(1, "ten").str(2, "actor").varint(3, 2).str(4, "idem").str(5, "cap").
		str(6, "risk1").str(6, "risk2").str(7, "docker").str(8, "pack").kv(9, "mk", "mv")
}
func metaWant() *capv1.JobMetadata {
	return &capv1.JobMetadata{TenantId: "ten", ActorId: "actor", ActorType: capv1.ActorType_ACTOR_TYPE_SERVICE,
		IdempotencyKey: "idem", Capability: "cap", RiskTags: []string{"risk1", "risk2"}, Requires: []string{"docker"},
		PackId: "pack", Labels: map[string]string{"mk": "mv"}}
}

func jobRequestWire() wb {
	return wb{}.str(1, "job-1").str(2, "job.echo").varint(3, 3).str(4, "redis://ctx:job-1").str(5, "adapter").
		kv(6, "ek", "ev").str(7, "parent").str(8, "wf").varint(9, 2).str(10, "mem").
		msg(11, wb{}.varint(1, 512).varint(2, 1).varint(3, 1).str(4, "t1")).
		msg(12, budgetWire()).str(13, "tenant").str(14, "principal").kv(15, "lk", "lv").msg(16, metaWire())
}
func jobRequestWant() *capv1.JobRequest {
	return &capv1.JobRequest{JobId: "job-1", Topic: "job.echo", Priority: capv1.JobPriority_JOB_PRIORITY_CRITICAL,
		ContextPtr: "redis://ctx:job-1", AdapterId: "adapter", Env: map[string]string{"ek": "ev"}, ParentJobId: "parent",
		WorkflowId: "wf", StepIndex: 2, MemoryId: "mem",
		ContextHints: &capv1.ContextHints{MaxInputTokens: 512, AllowSummarization: true, AllowRetrieval: true, Tags: []string{"t1"}},
		Budget:       budgetWant(), TenantId: "tenant", PrincipalId: "principal", Labels: map[string]string{"lk": "lv"},
		Meta: metaWant()}
}

func TestJobRequestWire(t *testing.T) {
	roundTrip(t, "JobRequest", jobRequestWire(), &capv1.JobRequest{}, jobRequestWant())
}

func TestJobResultWire(t *testing.T) {
	w := wb{}.str(1, "job-1").varint(2, 5).str(3, "redis://res:job-1").str(4, "w1").varint(5, 42).
		str(6, "code").str(7, "msg").str(8, "a1").str(8, "a2")
	want := &capv1.JobResult{JobId: "job-1", Status: capv1.JobStatus_JOB_STATUS_SUCCEEDED, ResultPtr: "redis://res:job-1",
		WorkerId: "w1", ExecutionMs: 42, ErrorCode: "code", ErrorMessage: "msg", ArtifactPtrs: []string{"a1", "a2"}}
	roundTrip(t, "JobResult", w, &capv1.JobResult{}, want)
}

func heartbeatWire() wb {
	return wb{}.str(1, "w1").str(2, "eu").str(3, "gpu").f32(4, 12.5).f32(5, 50).varint(6, 3).
		str(7, "c1").str(11, "default").varint(12, 8).kv(13, "zone", "a")
}

func TestHeartbeatWire(t *testing.T) {
	want := &capv1.Heartbeat{WorkerId: "w1", Region: "eu", Type: "gpu", CpuLoad: 12.5, GpuUtilization: 50, ActiveJobs: 3,
		Capabilities: []string{"c1"}, Pool: "default", MaxParallelJobs: 8, Labels: map[string]string{"zone": "a"}}
	roundTrip(t, "Heartbeat", heartbeatWire(), &capv1.Heartbeat{}, want)
}

func TestJobProgressCancelAlertWire(t *testing.T) {
	roundTrip(t, "JobProgress",
		wb{}.str(1, "job-1").str(2, "s1").varint(3, 40).str(4, "m").str(5, "ptr").str(6, "a").varint(7, 4),
		&capv1.JobProgress{}, &capv1.JobProgress{JobId: "job-1", StepId: "s1", Percent: 40, Message: "m", ResultPtr: "ptr",
			ArtifactPtrs: []string{"a"}, Status: capv1.JobStatus_JOB_STATUS_RUNNING})
	roundTrip(t, "JobCancel", wb{}.str(1, "job-1").str(2, "why").str(3, "me"),
		&capv1.JobCancel{}, &capv1.JobCancel{JobId: "job-1", Reason: "why", RequestedBy: "me"})
	roundTrip(t, "SystemAlert", wb{}.str(1, "warn").str(2, "m").str(3, "c").str(4, "x"),
		&capv1.SystemAlert{}, &capv1.SystemAlert{Level: "warn", Message: "m", Component: "c", Code: "x"})
}

func TestBusPacketWire(t *testing.T) {
	head := func() wb {
		return wb{}.str(1, "trace").str(2, "sender").msg(3, wb{}.varint(1, 1700000000).varint(2, 5)).varint(4, 1)
	}
	want := func() *capv1.BusPacket {
		return &capv1.BusPacket{TraceId: "trace", SenderId: "sender",
			CreatedAt: &timestamppb.Timestamp{Seconds: 1700000000, Nanos: 5}, ProtocolVersion: 1}
	}
	p := want()
	p.Payload = &capv1.BusPacket_JobRequest{JobRequest: jobRequestWant()}
	p.Signature = []byte{1, 2, 3}
	// protobuf-go writes plain fields before oneof members, so the signature
	// (14) precedes the payload (10) when we encode; a peer writing in field
	// number order must decode the same.
	roundTrip(t, "BusPacket{job_request}", head().raw(14, []byte{1, 2, 3}).msg(10, jobRequestWire()), &capv1.BusPacket{}, p)
	inOrder := &capv1.BusPacket{}
	if err := proto.Unmarshal(head().msg(10, jobRequestWire()).raw(14, []byte{1, 2, 3}), inOrder); err != nil || !proto.Equal(inOrder, p) {
		t.Fatalf("field-number-ordered packet decodes differently: %v", err)
	}

	p = want()
	p.Payload = &capv1.BusPacket_Heartbeat{Heartbeat: &capv1.Heartbeat{WorkerId: "w1", Region: "eu", Type: "gpu",
		CpuLoad: 12.5, GpuUtilization: 50, ActiveJobs: 3, Capabilities: []string{"c1"}, Pool: "default",
		MaxParallelJobs: 8, Labels: map[string]string{"zone": "a"}}}
	roundTrip(t, "BusPacket{heartbeat}", head().msg(12, heartbeatWire()), &capv1.BusPacket{}, p)

	for _, c := range []struct {
		name string
		n    protowire.Number
		body wb
		set  func(*capv1.BusPacket)
	}{
		{"job_result", 11, wb{}.str(1, "j"), func(p *capv1.BusPacket) {
			p.Payload = &capv1.BusPacket_JobResult{JobResult: &capv1.JobResult{JobId: "j"}}
		}},
		{"alert", 13, wb{}.str(1, "l"), func(p *capv1.BusPacket) {
			p.Payload = &capv1.BusPacket_Alert{Alert: &capv1.SystemAlert{Level: "l"}}
		}},
		{"job_progress", 15, wb{}.str(1, "j"), func(p *capv1.BusPacket) {
			p.Payload = &capv1.BusPacket_JobProgress{JobProgress: &capv1.JobProgress{JobId: "j"}}
		}},
		{"job_cancel", 16, wb{}.str(1, "j"), func(p *capv1.BusPacket) {
			p.Payload = &capv1.BusPacket_JobCancel{JobCancel: &capv1.JobCancel{JobId: "j"}}
		}},
	} {
		p := want()
		c.set(p)
		roundTrip(t, "BusPacket{"+c.name+"}", head().msg(c.n, c.body), &capv1.BusPacket{}, p)
	}
}

func TestPolicyCheckWire(t *testing.T) {
	req := wb{}.str(1, "job-1").str(2, "job.echo").str(3, "tenant").varint(4, 1).f64(5, 1.5).msg(6, budgetWire()).
		str(7, "p").kv(8, "k", "v").str(9, "mem").raw(10, []byte(`{"a":1}`)).msg(11, metaWire())
	roundTrip(t, "PolicyCheckRequest", req, &capv1.PolicyCheckRequest{}, &capv1.PolicyCheckRequest{
		JobId: "job-1", Topic: "job.echo", Tenant: "tenant", Priority: capv1.JobPriority_JOB_PRIORITY_INTERACTIVE,
		EstimatedCost: 1.5, Budget: budgetWant(), PrincipalId: "p", Labels: map[string]string{"k": "v"}, MemoryId: "mem",
		EffectiveConfig: []byte(`{"a":1}`), Meta: metaWant()})

	cons := wb{}.msg(1, wb{}.varint(1, 1000).varint(2, 3).varint(3, 4096).varint(4, 2)).
		msg(2, wb{}.varint(1, 1).str(2, "host").str(3, "/ro").str(4, "/rw")).
		msg(3, wb{}.str(1, "git").str(2, "ls")).
		msg(4, wb{}.varint(1, 10).varint(2, 500).str(3, "*.key")).
		str(5, "strict")
	rem := wb{}.str(1, "r1").str(2, "title").str(3, "sum").str(4, "job.safe").str(5, "cap2").kv(6, "a", "b").str(7, "c")
	resp := wb{}.varint(1, 5).str(2, "ok").str(3, "ptr").str(4, "v1:abc").str(5, "rule").msg(6, cons).
		varint(7, 1).str(8, "job-1").msg(9, rem)
	roundTrip(t, "PolicyCheckResponse", resp, &capv1.PolicyCheckResponse{}, &capv1.PolicyCheckResponse{
		Decision: capv1.DecisionType_DECISION_TYPE_ALLOW_WITH_CONSTRAINTS, Reason: "ok", RedactedContextPtr: "ptr",
		PolicySnapshot: "v1:abc", RuleId: "rule",
		Constraints: &capv1.PolicyConstraints{
			Budgets:        &capv1.BudgetConstraints{MaxRuntimeMs: 1000, MaxRetries: 3, MaxArtifactBytes: 4096, MaxConcurrentJobs: 2},
			Sandbox:        &capv1.SandboxProfile{Isolated: true, NetworkAllowlist: []string{"host"}, FsReadOnly: []string{"/ro"}, FsReadWrite: []string{"/rw"}},
			Toolchain:      &capv1.ToolchainConstraints{AllowedTools: []string{"git"}, AllowedCommands: []string{"ls"}},
			Diff:           &capv1.DiffConstraints{MaxFiles: 10, MaxLines: 500, DenyPathGlobs: []string{"*.key"}},
			RedactionLevel: "strict"},
		ApprovalRequired: true, ApprovalRef: "job-1",
		Remediations: []*capv1.PolicyRemediation{{Id: "r1", Title: "title", Summary: "sum", ReplacementTopic: "job.safe",
			ReplacementCapability: "cap2", AddLabels: map[string]string{"a": "b"}, RemoveLabels: []string{"c"}}}})
}

func TestSafetyKernelMethodNames(t *testing.T) {
	for _, m := range []string{capv1.SafetyKernel_Check_FullMethodName, capv1.SafetyKernel_Evaluate_FullMethodName,
		capv1.SafetyKernel_Explain_FullMethodName, capv1.SafetyKernel_Simulate_FullMethodName,
		capv1.SafetyKernel_ListSnapshots_FullMethodName} {
		if len(m) < 30 || m[:29] != "/cordum.agent.v1.SafetyKernel" {
			t.Fatalf("method %q is not on cordum.agent.v1.SafetyKernel", m)
		}
	}
	if capv1.SafetyKernel_Check_FullMethodName != "/cordum.agent.v1.SafetyKernel/Check" {
		t.Fatal(capv1.SafetyKernel_Check_FullMethodName)
	}
}

// Troupe's additions decode as unknown fields in a CAP peer and must not
// collide with CAP's numbers: a CAP JobStatus value never means a Troupe state.
func TestTroupeAdditionsUseNewNumbers(t *testing.T) {
	for _, v := range []capv1.JobStatus{capv1.JobStatus_JOB_STATUS_APPROVAL_REQUIRED,
		capv1.JobStatus_JOB_STATUS_OUTPUT_QUARANTINED, capv1.JobStatus_JOB_STATUS_FAILED_FATAL} {
		if v <= capv1.JobStatus_JOB_STATUS_TIMEOUT {
			t.Fatalf("%v reuses a CAP number", v)
		}
	}
	fd := (&capv1.JobRequest{}).ProtoReflect().Descriptor().Fields().ByName("compensation")
	if fd == nil || fd.Number() <= 16 {
		t.Fatalf("compensation field number %v collides with CAP", fd)
	}
}
