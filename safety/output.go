package safety

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/troupe-run/troupe/proto/capv1"
)

// OutputChecker decides whether a job's result may be released. It runs in
// two phases:
//
//   - CheckMeta (phase 1) looks at metadata only: the result pointer, the
//     error fields, the artifact pointers, the job's topic, tenant and
//     labels. It runs before the result is called SUCCEEDED, so it must be
//     fast (the built-in checker: microseconds; target ≤ 1 ms).
//   - ScanContent (phase 2) scans the content behind the result pointer,
//     which the caller fetched, after SUCCEEDED (budget: 30 s).
//
// Decisions: ALLOW releases; QUARANTINE and DENY hold the result back
// (OUTPUT_QUARANTINED); REDACT releases a redacted copy (OutputVerdict.
// Redacted, or RedactedPtr when the checker stored the copy itself). An
// error means no decision: callers release the result (fail open) and count
// it. Implementations are safe for concurrent use.
type OutputChecker interface {
	CheckMeta(ctx context.Context, req *capv1.OutputCheckRequest) (*OutputVerdict, error)
	ScanContent(ctx context.Context, req *capv1.OutputCheckRequest, content []byte) (*OutputVerdict, error)
}

// OutputVerdict is an output check's decision.
type OutputVerdict struct {
	Decision       capv1.OutputDecision
	Reason         string
	RuleID         string
	PolicySnapshot string
	// Findings says what was found where (never the text itself).
	Findings []Finding
	// Redacted is the redacted content (REDACT from ScanContent of the
	// built-in checker): the caller stores it and swaps the pointer.
	Redacted []byte
	// RedactedPtr points at a redacted copy a remote checker stored
	// itself: the caller swaps the pointer to it.
	RedactedPtr string
	// SkipContent: phase 2 has nothing to add (a rule allowed the result
	// without scanning).
	SkipContent bool
}

// Response is v on the wire.
func (v *OutputVerdict) Response() *capv1.OutputCheckResponse {
	return &capv1.OutputCheckResponse{Decision: v.Decision, Reason: v.Reason, RuleId: v.RuleID,
		RedactedPtr: v.RedactedPtr, PolicySnapshot: v.PolicySnapshot}
}

// severity orders decisions: the strictest of several findings wins.
func severity(d capv1.OutputDecision) int {
	switch d {
	case capv1.OutputDecision_OUTPUT_DECISION_DENY:
		return 3
	case capv1.OutputDecision_OUTPUT_DECISION_QUARANTINE:
		return 2
	case capv1.OutputDecision_OUTPUT_DECISION_REDACT:
		return 1
	}
	return 0
}

// OutputDecisionName is d's lower-case name ("allow", "redact", ...), as
// used in metric labels and job records.
func OutputDecisionName(d capv1.OutputDecision) string {
	return strings.ToLower(strings.TrimPrefix(d.String(), "OUTPUT_DECISION_"))
}

func parseOutputDecision(s string) (capv1.OutputDecision, bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "allow", "permit":
		return capv1.OutputDecision_OUTPUT_DECISION_ALLOW, true
	case "quarantine":
		return capv1.OutputDecision_OUTPUT_DECISION_QUARANTINE, true
	case "deny", "block":
		return capv1.OutputDecision_OUTPUT_DECISION_DENY, true
	case "redact":
		return capv1.OutputDecision_OUTPUT_DECISION_REDACT, true
	}
	return 0, false
}

// outputMaxResultBytesDefault is the largest content phase 2 scans. Larger
// results take the limits decision (quarantine by default): content that
// was not scanned is not released as if it had been.
const outputMaxResultBytesDefault = 16 << 20

// The output policy file (Troupe's own format):
//
//	version: "v1"
//	enabled: true                 # default true when a file is given
//	rules:                        # metadata only; first match wins; before the scanners
//	  - id: internal
//	    match: {topics: ["job.internal.*"], tenants: [], labels: {k: v}, has_error: false}
//	    decision: allow           # allow (skip scanning) | quarantine | deny | redact
//	    reason: "..."
//	limits:
//	  max_artifacts: 100          # phase 1; 0 = no limit
//	  max_result_bytes: 16777216  # phase 2; 0 = the default (16 MiB)
//	  decision: quarantine        # for a limit exceeded
//	scanners:
//	  secrets: {enabled: true, decision: quarantine, detectors: [private_key, aws_access_key, ...]}
//	  pii:     {enabled: false, decision: redact, detectors: [email, phone, credit_card]}
type outputDoc struct {
	Version  string          `yaml:"version"`
	Enabled  *bool           `yaml:"enabled"`
	Rules    []outputRuleDoc `yaml:"rules"`
	Limits   outputLimitsDoc `yaml:"limits"`
	Scanners struct {
		Secrets scannerDoc `yaml:"secrets"`
		PII     scannerDoc `yaml:"pii"`
	} `yaml:"scanners"`
}

type outputRuleDoc struct {
	ID    string `yaml:"id"`
	Match struct {
		Topics   []string          `yaml:"topics"`
		Tenants  []string          `yaml:"tenants"`
		Labels   map[string]string `yaml:"labels"`
		HasError *bool             `yaml:"has_error"`
	} `yaml:"match"`
	Decision string `yaml:"decision"`
	Reason   string `yaml:"reason"`
}

type outputLimitsDoc struct {
	MaxArtifacts   int    `yaml:"max_artifacts"`
	MaxResultBytes int64  `yaml:"max_result_bytes"`
	Decision       string `yaml:"decision"`
}

type scannerDoc struct {
	Enabled   *bool    `yaml:"enabled"`
	Decision  string   `yaml:"decision"`
	Detectors []string `yaml:"detectors"`
}

// OutputPolicy is the built-in output checker: metadata rules, limits and
// the secrets and PII scanners, compiled from an output policy file.
// Immutable; safe for concurrent use.
type OutputPolicy struct {
	Version  string
	Hash     string
	Snapshot string
	// Enabled is the file's enabled: (default true). The node decides
	// with it and OUTPUT_POLICY_ENABLED whether to check outputs at all.
	Enabled bool

	rules          []outputRule
	maxArtifacts   int
	maxResultBytes int64
	limitDecision  capv1.OutputDecision
	scanners       []outputScanner
}

type outputRule struct {
	id       string
	topics   []topicPattern
	tenants  []string
	labels   map[string]string
	hasError *bool
	decision capv1.OutputDecision
	reason   string
}

type outputScanner struct {
	name      string // "secrets" | "pii"
	decision  capv1.OutputDecision
	detectors []*detector
}

// DefaultOutputPolicy is the policy without a file: the secrets scanner
// quarantines, PII is not scanned, results over 16 MiB are quarantined.
func DefaultOutputPolicy() *OutputPolicy {
	p, err := ParseOutputPolicy(nil)
	if err != nil {
		panic(err) // the empty policy is valid by construction
	}
	return p
}

// LoadOutputPolicy reads and parses an output policy file.
func LoadOutputPolicy(file string) (*OutputPolicy, error) {
	data, err := readPolicyFile(file)
	if err != nil {
		return nil, err
	}
	p, err := ParseOutputPolicy(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return p, nil
}

// ParseOutputPolicy parses and validates an output policy file: unknown
// keys and bad values are errors naming their line (wrapping
// ErrInvalidPolicy).
func ParseOutputPolicy(data []byte) (*OutputPolicy, error) {
	var doc outputDoc
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, yamlError(err)
	}
	var root yaml.Node
	_ = yaml.Unmarshal(data, &root)
	sum := sha256.Sum256(data)
	p := &OutputPolicy{Version: strings.TrimSpace(doc.Version), Hash: hex.EncodeToString(sum[:]), Enabled: true,
		maxArtifacts: doc.Limits.MaxArtifacts, maxResultBytes: doc.Limits.MaxResultBytes}
	p.Snapshot = "output:" + p.Hash
	if p.Version != "" {
		p.Snapshot = "output:" + p.Version + ":" + p.Hash
	}
	if doc.Enabled != nil {
		p.Enabled = *doc.Enabled
	}
	for i, rd := range doc.Rules {
		at := func(keys ...any) int { return lineOf(&root, append([]any{"rules", i}, keys...)...) }
		r := outputRule{id: strings.TrimSpace(rd.ID), tenants: cleanList(rd.Match.Tenants), labels: rd.Match.Labels,
			hasError: rd.Match.HasError, reason: rd.Reason}
		if r.id == "" {
			r.id = fmt.Sprintf("output-rule:%d", i+1)
		}
		d, ok := parseOutputDecision(rd.Decision)
		if !ok {
			return nil, &PolicyError{Line: at("decision"), Msg: fmt.Sprintf(
				"rules[%d] (%s): decision %q: want allow, quarantine, deny or redact", i, r.id, rd.Decision)}
		}
		r.decision = d
		for j, pat := range rd.Match.Topics {
			pat = strings.TrimSpace(pat)
			if _, err := path.Match(pat, ""); err != nil || pat == "" {
				return nil, &PolicyError{Line: at("match", "topics", j), Msg: fmt.Sprintf("rules[%d] (%s): bad topic pattern %q", i, r.id, pat)}
			}
			r.topics = append(r.topics, compileTopic(pat))
		}
		p.rules = append(p.rules, r)
	}
	if p.maxArtifacts < 0 {
		return nil, &PolicyError{Line: lineOf(&root, "limits", "max_artifacts"), Msg: "limits.max_artifacts must not be negative"}
	}
	if p.maxResultBytes < 0 {
		return nil, &PolicyError{Line: lineOf(&root, "limits", "max_result_bytes"), Msg: "limits.max_result_bytes must not be negative"}
	}
	if p.maxResultBytes == 0 {
		p.maxResultBytes = outputMaxResultBytesDefault
	}
	p.limitDecision = capv1.OutputDecision_OUTPUT_DECISION_QUARANTINE
	if doc.Limits.Decision != "" {
		d, ok := parseOutputDecision(doc.Limits.Decision)
		if !ok || d == capv1.OutputDecision_OUTPUT_DECISION_ALLOW || d == capv1.OutputDecision_OUTPUT_DECISION_REDACT {
			return nil, &PolicyError{Line: lineOf(&root, "limits", "decision"),
				Msg: fmt.Sprintf("limits.decision %q: want quarantine or deny", doc.Limits.Decision)}
		}
		p.limitDecision = d
	}
	for _, sc := range []struct {
		name     string
		doc      scannerDoc
		on       bool
		decision capv1.OutputDecision
		defaults []string
	}{
		{"secrets", doc.Scanners.Secrets, true, capv1.OutputDecision_OUTPUT_DECISION_QUARANTINE, secretDetectors},
		{"pii", doc.Scanners.PII, false, capv1.OutputDecision_OUTPUT_DECISION_REDACT, pIIDetectors},
	} {
		at := func(keys ...any) int { return lineOf(&root, append([]any{"scanners", sc.name}, keys...)...) }
		on, dec := sc.on, sc.decision
		if sc.doc.Enabled != nil {
			on = *sc.doc.Enabled
		}
		if sc.doc.Decision != "" {
			d, ok := parseOutputDecision(sc.doc.Decision)
			if !ok || d == capv1.OutputDecision_OUTPUT_DECISION_ALLOW {
				return nil, &PolicyError{Line: at("decision"), Msg: fmt.Sprintf(
					"scanners.%s.decision %q: want quarantine, deny or redact", sc.name, sc.doc.Decision)}
			}
			dec = d
		}
		names := sc.defaults
		if len(sc.doc.Detectors) > 0 {
			names = sc.doc.Detectors
		}
		s := outputScanner{name: sc.name, decision: dec}
		for j, n := range names {
			d, ok := detectors[strings.TrimSpace(n)]
			if !ok {
				return nil, &PolicyError{Line: at("detectors", j), Msg: fmt.Sprintf(
					"scanners.%s: unknown detector %q (known: %s)", sc.name, n,
					strings.Join(append(append([]string(nil), secretDetectors...), pIIDetectors...), ", "))}
			}
			s.detectors = append(s.detectors, d)
		}
		if on && len(s.detectors) > 0 {
			p.scanners = append(p.scanners, s)
		}
	}
	return p, nil
}

func (p *OutputPolicy) match(req *capv1.OutputCheckRequest) *outputRule {
	res := req.GetResult()
	hasErr := res.GetErrorCode() != "" || res.GetErrorMessage() != ""
	for i := range p.rules {
		r := &p.rules[i]
		if len(r.topics) > 0 && matchTopic(r.topics, req.GetTopic()) == "" {
			continue
		}
		if len(r.tenants) > 0 && !hasFold(r.tenants, req.GetTenant()) {
			continue
		}
		if r.hasError != nil && *r.hasError != hasErr {
			continue
		}
		ok := true
		for k, v := range r.labels {
			if got, present := req.GetLabels()[k]; !present || got != v {
				ok = false
				break
			}
		}
		if ok {
			return r
		}
	}
	return nil
}

func (p *OutputPolicy) verdict(d capv1.OutputDecision, ruleID, reason string) *OutputVerdict {
	return &OutputVerdict{Decision: d, RuleID: ruleID, Reason: reason, PolicySnapshot: p.Snapshot}
}

func ruleReason(r *outputRule) string {
	if r.reason != "" {
		return r.reason
	}
	return "output rule " + r.id
}

// CheckMeta is phase 1: rules, the artifact limit, and the scanners over
// the metadata a worker wrote (result pointer, error message, artifact
// pointers; not the job's own labels, which the submitter chose). A
// finding of a redacting scanner quarantines here: a pointer cannot be
// redacted and stay a pointer.
func (p *OutputPolicy) CheckMeta(ctx context.Context, req *capv1.OutputCheckRequest) (*OutputVerdict, error) {
	if r := p.match(req); r != nil {
		v := p.verdict(r.decision, r.id, ruleReason(r))
		v.SkipContent = r.decision == capv1.OutputDecision_OUTPUT_DECISION_ALLOW
		return v, nil
	}
	res := req.GetResult()
	if p.maxArtifacts > 0 && len(res.GetArtifactPtrs()) > p.maxArtifacts {
		return p.verdict(p.limitDecision, "limits:max_artifacts",
			fmt.Sprintf("%d artifacts, more than the %d allowed", len(res.GetArtifactPtrs()), p.maxArtifacts)), nil
	}
	type field struct {
		where string
		text  []byte
	}
	fields := make([]field, 0, 2+len(res.GetArtifactPtrs()))
	if s := res.GetResultPtr(); s != "" {
		fields = append(fields, field{"result_ptr", []byte(s)})
	}
	if s := res.GetErrorMessage(); s != "" {
		fields = append(fields, field{"error_message", []byte(s)})
	}
	for j, a := range res.GetArtifactPtrs() {
		fields = append(fields, field{fmt.Sprintf("artifact_ptrs[%d]", j), []byte(a)})
	}
	var findings []Finding
	best := capv1.OutputDecision_OUTPUT_DECISION_ALLOW
	bestScanner := ""
	for i := range p.scanners {
		s := &p.scanners[i]
		n := len(findings)
		for _, f := range fields {
			var err error
			if findings, err = scanAll(ctx, s.detectors, f.text, f.where, findings); err != nil {
				return nil, err
			}
		}
		if len(findings) > n {
			d := s.decision
			if d == capv1.OutputDecision_OUTPUT_DECISION_REDACT {
				d = capv1.OutputDecision_OUTPUT_DECISION_QUARANTINE
			}
			if severity(d) > severity(best) {
				best, bestScanner = d, s.name
			}
		}
	}
	if len(findings) == 0 {
		return p.verdict(capv1.OutputDecision_OUTPUT_DECISION_ALLOW, "", "no finding in metadata"), nil
	}
	v := p.verdict(best, "scanner:"+bestScanner, DescribeFindings(findings)+" in result metadata")
	v.Findings = findings
	return v, nil
}

// ScanContent is phase 2: rules, the size limit, and the scanners over the
// content. A rule deciding redact makes every finding redacted whatever
// its scanner's decision; otherwise the strictest scanner decision with a
// finding wins, and REDACT comes with the redacted bytes.
func (p *OutputPolicy) ScanContent(ctx context.Context, req *capv1.OutputCheckRequest, content []byte) (*OutputVerdict, error) {
	forceRedact := ""
	if r := p.match(req); r != nil {
		if r.decision != capv1.OutputDecision_OUTPUT_DECISION_REDACT {
			v := p.verdict(r.decision, r.id, ruleReason(r))
			v.SkipContent = r.decision == capv1.OutputDecision_OUTPUT_DECISION_ALLOW
			return v, nil
		}
		forceRedact = r.id
	}
	if int64(len(content)) > p.maxResultBytes {
		return p.verdict(p.limitDecision, "limits:max_result_bytes",
			fmt.Sprintf("result is %d bytes, more than the %d scanned", len(content), p.maxResultBytes)), nil
	}
	var findings []Finding
	best := capv1.OutputDecision_OUTPUT_DECISION_ALLOW
	bestScanner := ""
	for i := range p.scanners {
		s := &p.scanners[i]
		n := len(findings)
		var err error
		if findings, err = scanAll(ctx, s.detectors, content, "content", findings); err != nil {
			return nil, fmt.Errorf("safety: output scan: %w", err)
		}
		if len(findings) > n && severity(s.decision) > severity(best) {
			best, bestScanner = s.decision, s.name
		}
	}
	if len(findings) == 0 {
		reason := "no finding in content"
		if forceRedact != "" {
			reason = "rule " + forceRedact + ": nothing to redact"
		}
		return p.verdict(capv1.OutputDecision_OUTPUT_DECISION_ALLOW, forceRedact, reason), nil
	}
	ruleID := "scanner:" + bestScanner
	if forceRedact != "" {
		best, ruleID = capv1.OutputDecision_OUTPUT_DECISION_REDACT, forceRedact
	}
	v := p.verdict(best, ruleID, DescribeFindings(findings)+" in content")
	v.Findings = findings
	if best == capv1.OutputDecision_OUTPUT_DECISION_REDACT {
		v.Redacted = redact(content, findings)
	}
	return v, nil
}

// DescribeFindings summarises findings by detector: "2 email, 1
// aws_access_key" (also the job record's output_*_findings field).
func DescribeFindings(fs []Finding) string {
	counts := map[string]int{}
	var order []string
	for _, f := range fs {
		if counts[f.Detector] == 0 {
			order = append(order, f.Detector)
		}
		counts[f.Detector]++
	}
	parts := make([]string, len(order))
	for i, d := range order {
		parts[i] = fmt.Sprintf("%d %s", counts[d], d)
	}
	return strings.Join(parts, ", ")
}
