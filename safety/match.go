package safety

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/troupe-run/troupe/proto/capv1"
)

// rule is one compiled policy rule. Immutable after ParsePolicy.
type rule struct {
	id       string
	decision capv1.DecisionType
	// reason is the rule's reason, or "matched rule <id>" when it has
	// none (defaultReason), built once rather than per check.
	reason        string
	defaultReason bool
	constraints   *capv1.PolicyConstraints // nil when the rule has none
	remediations  []*capv1.PolicyRemediation

	// Match conditions; an empty one is not checked. List values are
	// trimmed and compared case-insensitively.
	tenants        []string
	topics         []topicPattern
	capabilities   []string
	riskTags       []string // any of the job's risk tags
	requires       []string // all of these among the job's requires
	packIDs        []string
	actorIDs       []string
	actorTypes     []string // "human" | "service"
	labels         [][2]string
	secretsPresent *bool
	mcp            *mcpLists
	// mcpGuard inverts the MCP condition: the rule matches MCP calls the
	// lists forbid (the generated legacy MCP rule).
	mcpGuard bool

	// legacyTenant is the tenant a generated legacy rule belongs to.
	legacyTenant string
}

type mcpLists struct {
	allowServers, denyServers     []string
	allowTools, denyTools         []string
	allowResources, denyResources []string
	allowActions, denyActions     []string
}

func compileMCP(d *mcpDoc) *mcpLists {
	m := &mcpLists{
		allowServers: cleanList(d.AllowServers), denyServers: cleanList(d.DenyServers),
		allowTools: cleanList(d.AllowTools), denyTools: cleanList(d.DenyTools),
		allowResources: cleanList(d.AllowResources), denyResources: cleanList(d.DenyResources),
		allowActions: cleanList(d.AllowActions), denyActions: cleanList(d.DenyActions),
	}
	if len(m.allowServers)+len(m.denyServers)+len(m.allowTools)+len(m.denyTools)+len(m.allowResources)+
		len(m.denyResources)+len(m.allowActions)+len(m.denyActions) == 0 {
		return nil
	}
	return m
}

// Label names the matcher reads from a request's labels.
const (
	labelSecretsPresent = "secrets_present"
	labelMCPServer      = "mcp.server"
	labelMCPTool        = "mcp.tool"
	labelMCPResource    = "mcp.resource"
	labelMCPAction      = "mcp.action"
)

// input is the part of a PolicyCheckRequest the rules look at, read once
// per check.
type input struct {
	tenant, topic                       string
	capability, packID, actorID, actorT string
	riskTags, requires                  []string
	labels                              map[string]string
	secrets                             bool
	mcpServer, mcpTool, mcpRes, mcpAct  string
}

func readInput(req *capv1.PolicyCheckRequest, defaultTenant string) input {
	in := input{topic: req.GetTopic(), tenant: strings.TrimSpace(req.GetTenant()), labels: req.GetLabels()}
	meta := req.GetMeta()
	if in.tenant == "" {
		in.tenant = strings.TrimSpace(meta.GetTenantId())
	}
	if in.tenant == "" {
		in.tenant = defaultTenant
	}
	in.capability = strings.TrimSpace(meta.GetCapability())
	in.packID = strings.TrimSpace(meta.GetPackId())
	in.actorID = strings.TrimSpace(meta.GetActorId())
	switch meta.GetActorType() {
	case capv1.ActorType_ACTOR_TYPE_HUMAN:
		in.actorT = "human"
	case capv1.ActorType_ACTOR_TYPE_SERVICE:
		in.actorT = "service"
	}
	in.riskTags, in.requires = meta.GetRiskTags(), meta.GetRequires()
	if v, ok := in.labels[labelSecretsPresent]; ok {
		in.secrets, _ = strconv.ParseBool(strings.TrimSpace(v))
	}
	in.mcpServer = strings.TrimSpace(in.labels[labelMCPServer])
	in.mcpTool = strings.TrimSpace(in.labels[labelMCPTool])
	in.mcpRes = strings.TrimSpace(in.labels[labelMCPResource])
	in.mcpAct = strings.TrimSpace(in.labels[labelMCPAction])
	return in
}

func (in *input) usesMCP() bool {
	return in.mcpServer != "" || in.mcpTool != "" || in.mcpRes != "" || in.mcpAct != ""
}

// matches reports whether every condition of r holds for in. It is the hot
// path: plain loops, no allocation.
func (r *rule) matches(in *input) bool {
	if len(r.tenants) > 0 && !hasFold(r.tenants, in.tenant) {
		return false
	}
	if len(r.topics) > 0 && matchTopic(r.topics, in.topic) == "" {
		return false
	}
	if len(r.capabilities) > 0 && !hasFold(r.capabilities, in.capability) {
		return false
	}
	if len(r.riskTags) > 0 && !anyFold(r.riskTags, in.riskTags) {
		return false
	}
	if len(r.requires) > 0 && !allFold(in.requires, r.requires) {
		return false
	}
	if len(r.packIDs) > 0 && !hasFold(r.packIDs, in.packID) {
		return false
	}
	if len(r.actorIDs) > 0 && !hasFold(r.actorIDs, in.actorID) {
		return false
	}
	if len(r.actorTypes) > 0 && !hasFold(r.actorTypes, in.actorT) {
		return false
	}
	for _, kv := range r.labels {
		if v, ok := in.labels[kv[0]]; !ok || v != kv[1] {
			return false
		}
	}
	if r.secretsPresent != nil && *r.secretsPresent != in.secrets {
		return false
	}
	if r.mcp != nil {
		permitted := r.mcp.permits(in) == ""
		if r.mcpGuard {
			// The guard catches MCP calls the lists forbid; jobs that
			// make no MCP call are none of its business.
			return in.usesMCP() && !permitted
		}
		// CAP: the lists narrow the rule to the MCP calls they permit (a
		// job that makes no MCP call passes).
		return permitted
	}
	return true
}

// permits returns "" when the MCP call in in passes every list, else why
// not. A job with no MCP call passes.
func (m *mcpLists) permits(in *input) string {
	if !in.usesMCP() {
		return ""
	}
	for _, f := range [...]struct {
		name, v     string
		allow, deny []string
	}{
		{"server", in.mcpServer, m.allowServers, m.denyServers},
		{"tool", in.mcpTool, m.allowTools, m.denyTools},
		{"resource", in.mcpRes, m.allowResources, m.denyResources},
		{"action", in.mcpAct, m.allowActions, m.denyActions},
	} {
		if hasFold(f.deny, f.v) {
			return fmt.Sprintf("mcp %s %q is denied", f.name, f.v)
		}
		if len(f.allow) > 0 && !hasFold(f.allow, f.v) {
			return fmt.Sprintf("mcp %s %q is not in the allow list", f.name, f.v)
		}
	}
	return ""
}

// topicPattern is a compiled path.Match pattern. Nearly every policy
// pattern is a literal ("job.echo") or a prefix with one trailing star
// ("job.db.*"); those match with a comparison instead of path.Match's
// general loop, which is most of a 50-rule check's cost otherwise.
type topicPattern struct {
	pat string
	// kind: topicLiteral, topicPrefix (pat[:len-1] is the prefix) or
	// topicGlob.
	kind uint8
}

const (
	topicGlob uint8 = iota
	topicLiteral
	topicPrefix
)

// compileTopic compiles a pattern already checked by path.Match.
func compileTopic(p string) topicPattern {
	i := strings.IndexAny(p, `*?[\`)
	switch {
	case i < 0:
		return topicPattern{pat: p, kind: topicLiteral}
	case i == len(p)-1 && p[i] == '*':
		return topicPattern{pat: p, kind: topicPrefix}
	}
	return topicPattern{pat: p, kind: topicGlob}
}

func (t *topicPattern) match(topic string) bool {
	switch t.kind {
	case topicLiteral:
		return t.pat == topic
	case topicPrefix:
		// path.Match's * is any run of characters other than '/'.
		pre := t.pat[:len(t.pat)-1]
		return strings.HasPrefix(topic, pre) && strings.IndexByte(topic[len(pre):], '/') < 0
	}
	ok, _ := path.Match(t.pat, topic)
	return ok
}

// matchTopic returns the first pattern matching topic, or "".
func matchTopic(patterns []topicPattern, topic string) string {
	for i := range patterns {
		if patterns[i].match(topic) {
			return patterns[i].pat
		}
	}
	return ""
}

// hasFold: v (trimmed) equals an entry, ignoring case. An empty v never
// matches: a rule that names capabilities does not match a job with none.
func hasFold(list []string, v string) bool {
	// TrimSpace only when an end byte could be space (ASCII control or
	// space, or the start of a multi-byte rune): the common case is free.
	if v != "" && (v[0] <= ' ' || v[len(v)-1] <= ' ' || v[0] >= 0x80 || v[len(v)-1] >= 0x80) {
		v = strings.TrimSpace(v)
	}
	if v == "" {
		return false
	}
	for _, s := range list {
		if strings.EqualFold(s, v) {
			return true
		}
	}
	return false
}

func anyFold(list, values []string) bool {
	for _, v := range values {
		if hasFold(list, v) {
			return true
		}
	}
	return false
}

// allFold: every entry of need is among have.
func allFold(have, need []string) bool {
	for _, n := range need {
		if !hasFold(have, n) {
			return false
		}
	}
	return true
}

// explain says which conditions of a matched rule held, e.g. "rule r3
// matched: topic job.x ~ job.*, tenant acme".
func (r *rule) explain(in *input) string {
	var why []string
	if len(r.tenants) > 0 {
		why = append(why, "tenant "+in.tenant)
	}
	if len(r.topics) > 0 {
		why = append(why, fmt.Sprintf("topic %s ~ %s", in.topic, matchTopic(r.topics, in.topic)))
	}
	if len(r.capabilities) > 0 {
		why = append(why, "capability "+in.capability)
	}
	if len(r.riskTags) > 0 {
		var hit []string
		for _, t := range in.riskTags {
			if hasFold(r.riskTags, t) {
				hit = append(hit, t)
			}
		}
		why = append(why, "risk tags "+strings.Join(hit, ","))
	}
	if len(r.requires) > 0 {
		why = append(why, "requires ⊇ "+strings.Join(r.requires, ","))
	}
	if len(r.packIDs) > 0 {
		why = append(why, "pack "+in.packID)
	}
	if len(r.actorIDs) > 0 {
		why = append(why, "actor "+in.actorID)
	}
	if len(r.actorTypes) > 0 {
		why = append(why, "actor type "+in.actorT)
	}
	for _, kv := range r.labels {
		why = append(why, fmt.Sprintf("label %s=%s", kv[0], kv[1]))
	}
	if r.secretsPresent != nil {
		why = append(why, fmt.Sprintf("secrets_present=%t", in.secrets))
	}
	if r.mcp != nil {
		switch {
		case r.mcpGuard:
			why = append(why, r.mcp.permits(in))
		case in.usesMCP():
			why = append(why, fmt.Sprintf("mcp call %s/%s permitted", in.mcpServer, in.mcpTool))
		default:
			why = append(why, "no mcp call")
		}
	}
	if len(why) == 0 {
		why = append(why, "the rule has no conditions")
	}
	return fmt.Sprintf("rule %s matched: %s", r.id, strings.Join(why, ", "))
}
