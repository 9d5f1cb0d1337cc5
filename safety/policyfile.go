package safety

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	"gopkg.in/yaml.v3"

	"github.com/troupe-run/troupe/proto/capv1"
)

// The safety policy file, as existing CAP deployments write it (see
// CAP-WIRE.md). These types mirror the YAML one to one; decoding is strict
// (an unknown key is an error naming its line), then ParsePolicy compiles
// the document into a Policy that evaluates without allocating.

type policyDoc struct {
	Version       string               `yaml:"version"`
	DefaultTenant string               `yaml:"default_tenant"`
	Rules         []ruleDoc            `yaml:"rules"`
	Tenants       map[string]tenantDoc `yaml:"tenants"`
	// Troupe's additions, read by the node (not by the rules): rate limit
	// buckets and concurrency key limits, in the pools file's format.
	RateLimits      yaml.Node `yaml:"rate_limits"`
	ConcurrencyKeys yaml.Node `yaml:"concurrency_keys"`
}

type ruleDoc struct {
	ID           string           `yaml:"id"`
	Match        matchDoc         `yaml:"match"`
	Decision     string           `yaml:"decision"`
	Reason       string           `yaml:"reason"`
	Constraints  constraintsDoc   `yaml:"constraints"`
	Remediations []remediationDoc `yaml:"remediations"`
}

type matchDoc struct {
	Tenants        []string          `yaml:"tenants"`
	Topics         []string          `yaml:"topics"`
	Capabilities   []string          `yaml:"capabilities"`
	RiskTags       []string          `yaml:"risk_tags"`
	Requires       []string          `yaml:"requires"`
	PackIDs        []string          `yaml:"pack_ids"`
	ActorIDs       []string          `yaml:"actor_ids"`
	ActorTypes     []string          `yaml:"actor_types"`
	Labels         map[string]string `yaml:"labels"`
	SecretsPresent *bool             `yaml:"secrets_present"`
	MCP            mcpDoc            `yaml:"mcp"`
}

type mcpDoc struct {
	AllowServers   []string `yaml:"allow_servers"`
	DenyServers    []string `yaml:"deny_servers"`
	AllowTools     []string `yaml:"allow_tools"`
	DenyTools      []string `yaml:"deny_tools"`
	AllowResources []string `yaml:"allow_resources"`
	DenyResources  []string `yaml:"deny_resources"`
	AllowActions   []string `yaml:"allow_actions"`
	DenyActions    []string `yaml:"deny_actions"`
}

type constraintsDoc struct {
	Budgets struct {
		MaxRuntimeMs      int64 `yaml:"max_runtime_ms"`
		MaxRetries        int32 `yaml:"max_retries"`
		MaxArtifactBytes  int64 `yaml:"max_artifact_bytes"`
		MaxConcurrentJobs int32 `yaml:"max_concurrent_jobs"`
	} `yaml:"budgets"`
	Sandbox struct {
		Isolated         bool     `yaml:"isolated"`
		NetworkAllowlist []string `yaml:"network_allowlist"`
		FsReadOnly       []string `yaml:"fs_read_only"`
		FsReadWrite      []string `yaml:"fs_read_write"`
	} `yaml:"sandbox"`
	Toolchain struct {
		AllowedTools    []string `yaml:"allowed_tools"`
		AllowedCommands []string `yaml:"allowed_commands"`
	} `yaml:"toolchain"`
	Diff struct {
		MaxFiles      int32    `yaml:"max_files"`
		MaxLines      int32    `yaml:"max_lines"`
		DenyPathGlobs []string `yaml:"deny_path_globs"`
	} `yaml:"diff"`
	RedactionLevel string `yaml:"redaction_level"`
}

type remediationDoc struct {
	ID                    string            `yaml:"id"`
	Title                 string            `yaml:"title"`
	Summary               string            `yaml:"summary"`
	ReplacementTopic      string            `yaml:"replacement_topic"`
	ReplacementCapability string            `yaml:"replacement_capability"`
	AddLabels             map[string]string `yaml:"add_labels"`
	RemoveLabels          []string          `yaml:"remove_labels"`
}

type tenantDoc struct {
	AllowTopics       []string `yaml:"allow_topics"`
	DenyTopics        []string `yaml:"deny_topics"`
	AllowedRepoHosts  []string `yaml:"allowed_repo_hosts"`
	DeniedRepoHosts   []string `yaml:"denied_repo_hosts"`
	MaxConcurrentJobs int32    `yaml:"max_concurrent_jobs"`
	MCP               mcpDoc   `yaml:"mcp"`
}

// defaultTenantName is the tenant of a request that names none, when the policy
// sets no default_tenant (CAP's rule).
const defaultTenantName = "default"

// Policy is one compiled version of a policy file. It is immutable: the
// Engine swaps whole Policies on reload, so a check in flight always sees
// one consistent version.
type Policy struct {
	// Version is the file's version: field ("" when absent).
	Version string
	// Hash is the hex sha256 of the file's bytes.
	Hash string
	// Snapshot names this version on the wire: "<version>:<hash>", or the
	// hash alone when the file has no version.
	Snapshot string
	// DefaultTenant is the tenant of a request that names none.
	DefaultTenant string
	// Legacy: the file has no rules, so its rules were generated from the
	// per-tenant allow/deny topics.
	Legacy bool

	rules []*rule
	// limits: the file's content when it declares rate_limits or
	// concurrency_keys (nil: neither).
	limits []byte
}

// Limits returns the file's content when it declares Troupe's
// rate_limits or concurrency_keys sections (nil when it declares neither),
// for the node to parse as it parses a pools file's (README, "Rate limits"
// and "Concurrency keys"). The engine does not read them; a node bound to
// the engine (Engine.Bind) refuses a file whose sections are invalid.
func (p *Policy) Limits() []byte { return p.limits }

// Rules returns how many rules the policy evaluates (generated legacy rules
// included).
func (p *Policy) Rules() int { return len(p.rules) }

// TenantLimits returns the legacy per-tenant max_concurrent_jobs values
// (tenants with 0 omitted). Rule-based policies express the same limit as
// a budgets.max_concurrent_jobs constraint.
func (p *Policy) TenantLimits() map[string]int32 {
	out := map[string]int32{}
	for _, r := range p.rules {
		if r.legacyTenant != "" && r.constraints != nil {
			if n := r.constraints.GetBudgets().GetMaxConcurrentJobs(); n > 0 {
				out[r.legacyTenant] = n
			}
		}
	}
	return out
}

// ParsePolicy parses, validates and compiles a safety policy file. Every
// error wraps ErrInvalidPolicy and, where it can, names the line. Empty
// content is a valid policy with no rules (every job.* topic is allowed).
func ParsePolicy(data []byte) (*Policy, error) {
	var doc policyDoc
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return nil, yamlError(err)
	}
	var root yaml.Node
	_ = yaml.Unmarshal(data, &root) // already decoded once: only for lines
	sum := sha256.Sum256(data)
	p := &Policy{Version: strings.TrimSpace(doc.Version), Hash: hex.EncodeToString(sum[:]),
		DefaultTenant: strings.TrimSpace(doc.DefaultTenant)}
	p.Snapshot = p.Hash
	if p.Version != "" {
		p.Snapshot = p.Version + ":" + p.Hash
	}
	if p.DefaultTenant == "" {
		p.DefaultTenant = defaultTenantName
	}
	if doc.RateLimits.Kind != 0 || doc.ConcurrencyKeys.Kind != 0 {
		p.limits = data
	}
	seen := map[string]int{}
	for i := range doc.Rules {
		r, err := compileRule(&doc.Rules[i], i, &root)
		if err != nil {
			return nil, err
		}
		if first, dup := seen[r.id]; dup {
			return nil, &PolicyError{Line: lineOf(&root, "rules", i, "id"),
				Msg: fmt.Sprintf("rules[%d]: id %q already used by rules[%d]", i, r.id, first)}
		}
		seen[r.id] = i
		p.rules = append(p.rules, r)
	}
	// Tenants are validated even when rules make them unused, so that a
	// typo there is not discovered the day the rules are removed.
	legacy, err := compileLegacy(doc.Tenants, &root)
	if err != nil {
		return nil, err
	}
	if len(doc.Rules) == 0 {
		p.rules, p.Legacy = legacy, len(legacy) > 0
	}
	return p, nil
}

func compileRule(d *ruleDoc, i int, root *yaml.Node) (*rule, error) {
	at := func(keys ...any) int { return lineOf(root, append([]any{"rules", i}, keys...)...) }
	r := &rule{id: strings.TrimSpace(d.ID), reason: d.Reason}
	if r.id == "" {
		// CAP allows rules without ids; responses still need one.
		r.id = "rule:" + strconv.Itoa(i+1)
	}
	dec, ok := parseDecision(d.Decision)
	if !ok {
		if strings.TrimSpace(d.Decision) == "" {
			return nil, &PolicyError{Line: at(), Msg: fmt.Sprintf("rules[%d] (%s): decision is required", i, r.id)}
		}
		return nil, &PolicyError{Line: at("decision"), Msg: fmt.Sprintf(
			"rules[%d] (%s): unknown decision %q (want allow, deny, require_approval, allow_with_constraints or throttle)",
			i, r.id, d.Decision)}
	}
	if err := compileMatch(r, &d.Match, func(keys ...any) int { return at(append([]any{"match"}, keys...)...) }, i); err != nil {
		return nil, err
	}
	c, err := compileConstraints(&d.Constraints, func(keys ...any) int {
		return at(append([]any{"constraints"}, keys...)...)
	}, fmt.Sprintf("rules[%d] (%s)", i, r.id))
	if err != nil {
		return nil, err
	}
	r.constraints = c
	// CAP: an allow carrying constraints is ALLOW_WITH_CONSTRAINTS.
	if dec == capv1.DecisionType_DECISION_TYPE_ALLOW && c != nil {
		dec = capv1.DecisionType_DECISION_TYPE_ALLOW_WITH_CONSTRAINTS
	}
	r.decision = dec
	if r.reason == "" {
		r.reason, r.defaultReason = "matched rule "+r.id, true
	}
	for _, rd := range d.Remediations {
		r.remediations = append(r.remediations, &capv1.PolicyRemediation{Id: rd.ID, Title: rd.Title,
			Summary: rd.Summary, ReplacementTopic: rd.ReplacementTopic, ReplacementCapability: rd.ReplacementCapability,
			AddLabels: rd.AddLabels, RemoveLabels: rd.RemoveLabels})
	}
	return r, nil
}

func compileMatch(r *rule, m *matchDoc, at func(keys ...any) int, i int) error {
	for j, pat := range m.Topics {
		pat = strings.TrimSpace(pat)
		if pat == "" {
			return &PolicyError{Line: at("topics", j), Msg: fmt.Sprintf("rules[%d] (%s): empty topic pattern", i, r.id)}
		}
		if _, err := path.Match(pat, ""); err != nil {
			return &PolicyError{Line: at("topics", j), Msg: fmt.Sprintf("rules[%d] (%s): topic pattern %q: %v", i, r.id, pat, err)}
		}
		r.topics = append(r.topics, compileTopic(pat))
	}
	r.tenants = cleanList(m.Tenants)
	r.capabilities = cleanList(m.Capabilities)
	r.riskTags = cleanList(m.RiskTags)
	r.requires = cleanList(m.Requires)
	r.packIDs = cleanList(m.PackIDs)
	r.actorIDs = cleanList(m.ActorIDs)
	for j, t := range cleanList(m.ActorTypes) {
		n, ok := actorTypeName(t)
		if !ok {
			return &PolicyError{Line: at("actor_types", j), Msg: fmt.Sprintf(
				"rules[%d] (%s): unknown actor type %q (want human or service)", i, r.id, t)}
		}
		r.actorTypes = append(r.actorTypes, n)
	}
	keys := make([]string, 0, len(m.Labels))
	for k := range m.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys) // a stable order makes Explain's text stable
	for _, k := range keys {
		r.labels = append(r.labels, [2]string{k, m.Labels[k]})
	}
	r.secretsPresent = m.SecretsPresent
	r.mcp = compileMCP(&m.MCP)
	return nil
}

func compileConstraints(d *constraintsDoc, at func(keys ...any) int, who string) (*capv1.PolicyConstraints, error) {
	neg := func(v int64, keys ...any) error {
		if v < 0 {
			return &PolicyError{Line: at(keys...), Msg: fmt.Sprintf("%s: constraints.%s must not be negative", who, joinKeys(keys))}
		}
		return nil
	}
	for _, e := range []error{
		neg(d.Budgets.MaxRuntimeMs, "budgets", "max_runtime_ms"), neg(int64(d.Budgets.MaxRetries), "budgets", "max_retries"),
		neg(d.Budgets.MaxArtifactBytes, "budgets", "max_artifact_bytes"),
		neg(int64(d.Budgets.MaxConcurrentJobs), "budgets", "max_concurrent_jobs"),
		neg(int64(d.Diff.MaxFiles), "diff", "max_files"), neg(int64(d.Diff.MaxLines), "diff", "max_lines"),
	} {
		if e != nil {
			return nil, e
		}
	}
	c := &capv1.PolicyConstraints{RedactionLevel: strings.TrimSpace(d.RedactionLevel)}
	if b := d.Budgets; b.MaxRuntimeMs != 0 || b.MaxRetries != 0 || b.MaxArtifactBytes != 0 || b.MaxConcurrentJobs != 0 {
		c.Budgets = &capv1.BudgetConstraints{MaxRuntimeMs: b.MaxRuntimeMs, MaxRetries: b.MaxRetries,
			MaxArtifactBytes: b.MaxArtifactBytes, MaxConcurrentJobs: b.MaxConcurrentJobs}
	}
	if s := d.Sandbox; s.Isolated || len(s.NetworkAllowlist)+len(s.FsReadOnly)+len(s.FsReadWrite) > 0 {
		c.Sandbox = &capv1.SandboxProfile{Isolated: s.Isolated, NetworkAllowlist: s.NetworkAllowlist,
			FsReadOnly: s.FsReadOnly, FsReadWrite: s.FsReadWrite}
	}
	if t := d.Toolchain; len(t.AllowedTools)+len(t.AllowedCommands) > 0 {
		c.Toolchain = &capv1.ToolchainConstraints{AllowedTools: t.AllowedTools, AllowedCommands: t.AllowedCommands}
	}
	if df := d.Diff; df.MaxFiles != 0 || df.MaxLines != 0 || len(df.DenyPathGlobs) > 0 {
		for j, g := range df.DenyPathGlobs {
			if _, err := path.Match(g, ""); err != nil {
				return nil, &PolicyError{Line: at("diff", "deny_path_globs", j), Msg: fmt.Sprintf("%s: glob %q: %v", who, g, err)}
			}
		}
		c.Diff = &capv1.DiffConstraints{MaxFiles: df.MaxFiles, MaxLines: df.MaxLines, DenyPathGlobs: df.DenyPathGlobs}
	}
	if proto.Size(c) == 0 {
		return nil, nil
	}
	return c, nil
}

// compileLegacy turns the per-tenant allow/deny topics into rules, as CAP
// kernels do: for each tenant its deny_topics first, then its allow_topics.
// Two Troupe choices, both fail-safe: tenants are taken in name order (CAP
// uses Go map order, which only matters when two tenant names differ in
// case), and a tenant with MCP lists gets a deny rule for MCP calls its
// lists forbid, placed before its allow rules (in CAP the lists only narrow
// the allow rules, and a forbidden call then falls through to the default
// allow). A tenant's max_concurrent_jobs becomes a budgets constraint on its
// allow rules, so the tenant limit reaches the scheduler with the decision.
func compileLegacy(tenants map[string]tenantDoc, root *yaml.Node) ([]*rule, error) {
	names := make([]string, 0, len(tenants))
	for name := range tenants {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []*rule
	for _, name := range names {
		t := tenants[name]
		if strings.TrimSpace(name) == "" {
			return nil, &PolicyError{Line: lineOf(root, "tenants"), Msg: "tenants: empty tenant name"}
		}
		if t.MaxConcurrentJobs < 0 {
			return nil, &PolicyError{Line: lineOf(root, "tenants", name, "max_concurrent_jobs"),
				Msg: fmt.Sprintf("tenants.%s: max_concurrent_jobs must not be negative", name)}
		}
		check := func(list []string, key string) error {
			for j, pat := range list {
				if _, err := path.Match(strings.TrimSpace(pat), ""); err != nil || strings.TrimSpace(pat) == "" {
					return &PolicyError{Line: lineOf(root, "tenants", name, key, j),
						Msg: fmt.Sprintf("tenants.%s.%s: bad topic pattern %q", name, key, pat)}
				}
			}
			return nil
		}
		if err := check(t.DenyTopics, "deny_topics"); err != nil {
			return nil, err
		}
		if err := check(t.AllowTopics, "allow_topics"); err != nil {
			return nil, err
		}
		for j, pat := range t.DenyTopics {
			out = append(out, &rule{id: fmt.Sprintf("legacy:%s:deny:%d", name, j+1), decision: capv1.DecisionType_DECISION_TYPE_DENY,
				reason: fmt.Sprintf("topic %q denied by tenant policy", pat), tenants: []string{name},
				topics: []topicPattern{compileTopic(strings.TrimSpace(pat))}, legacyTenant: name})
		}
		if mcp := compileMCP(&t.MCP); mcp != nil {
			out = append(out, &rule{id: fmt.Sprintf("legacy:%s:mcp", name), decision: capv1.DecisionType_DECISION_TYPE_DENY,
				reason: "MCP call not permitted by tenant policy", tenants: []string{name}, mcp: mcp, mcpGuard: true,
				legacyTenant: name})
		}
		var c *capv1.PolicyConstraints
		dec := capv1.DecisionType_DECISION_TYPE_ALLOW
		if t.MaxConcurrentJobs > 0 {
			c = &capv1.PolicyConstraints{Budgets: &capv1.BudgetConstraints{MaxConcurrentJobs: t.MaxConcurrentJobs}}
			dec = capv1.DecisionType_DECISION_TYPE_ALLOW_WITH_CONSTRAINTS
		}
		for j, pat := range t.AllowTopics {
			out = append(out, &rule{id: fmt.Sprintf("legacy:%s:allow:%d", name, j+1), decision: dec,
				reason: "topic allowed by tenant policy", tenants: []string{name}, topics: []topicPattern{compileTopic(strings.TrimSpace(pat))},
				constraints: c, legacyTenant: name})
		}
	}
	return out, nil
}

// parseDecision maps the decision spellings CAP policies use.
func parseDecision(s string) (capv1.DecisionType, bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "allow", "permit":
		return capv1.DecisionType_DECISION_TYPE_ALLOW, true
	case "deny", "block":
		return capv1.DecisionType_DECISION_TYPE_DENY, true
	case "require_approval", "require-approval", "require_human", "require-human":
		return capv1.DecisionType_DECISION_TYPE_REQUIRE_HUMAN, true
	case "allow_with_constraints", "allow-with-constraints":
		return capv1.DecisionType_DECISION_TYPE_ALLOW_WITH_CONSTRAINTS, true
	case "throttle":
		return capv1.DecisionType_DECISION_TYPE_THROTTLE, true
	}
	return 0, false
}

// actorTypeName normalises "human", "HUMAN" and "ACTOR_TYPE_HUMAN" to the
// short lower-case name the matcher compares with.
func actorTypeName(s string) (string, bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	s = strings.TrimPrefix(s, "actor_type_")
	switch s {
	case "human", "service":
		return s, true
	}
	return "", false
}

func cleanList(in []string) []string {
	var out []string
	for _, s := range in {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func joinKeys(keys []any) string {
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprint(k)
	}
	return strings.Join(parts, ".")
}

// lineOf finds the line of the node at a path of mapping keys (string) and
// sequence indexes (int) under the document root: the key's line for a
// mapping entry, the element's line for a sequence item. A path that runs
// out returns the line of the deepest node found, so an error still points
// near its cause.
func lineOf(root *yaml.Node, keys ...any) int {
	n := root
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := n.Line
	for _, k := range keys {
		for n.Kind == yaml.AliasNode && n.Alias != nil {
			n = n.Alias
		}
		var next *yaml.Node
		switch k := k.(type) {
		case string:
			if n.Kind == yaml.MappingNode {
				for i := 0; i+1 < len(n.Content); i += 2 {
					if n.Content[i].Value == k {
						line, next = n.Content[i].Line, n.Content[i+1]
						break
					}
				}
			}
		case int:
			if n.Kind == yaml.SequenceNode && k < len(n.Content) {
				next = n.Content[k]
				line = next.Line
			}
		}
		if next == nil {
			return line
		}
		n = next
	}
	return line
}

var yamlUnknownField = regexp.MustCompile(`line (\d+): field (\S+) not found in type \S+`)

// yamlError turns a yaml.v3 decode error into a PolicyError with its line,
// saying "unknown key" for the strict decoder's unknown-field errors.
func yamlError(err error) error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if m := yamlUnknownField.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return &PolicyError{Line: line, Msg: fmt.Sprintf("unknown key %q", m[2])}
	}
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg = te.Errors[0]
	}
	msg = strings.TrimPrefix(msg, "unmarshal errors:\n  ")
	line := 0
	if strings.HasPrefix(msg, "line ") {
		rest := msg[len("line "):]
		j := 0
		for j < len(rest) && rest[j] >= '0' && rest[j] <= '9' {
			j++
		}
		line, _ = strconv.Atoi(rest[:j])
		msg = strings.TrimPrefix(rest[j:], ": ")
	}
	return &PolicyError{Line: line, Msg: msg}
}
