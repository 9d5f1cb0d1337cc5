package ratelimit

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/troupe-run/troupe/internal/jobstate"
	"github.com/troupe-run/troupe/proto/capv1"
)

// The meta.labels a job names its bucket and units with. Labels, not a new
// CAP field: any CAP client sets them today, and JobRequest.labels stay
// placement constraints (internal/router/strategy.go).
const (
	LabelBucket = "troupe.rate_limit"
	LabelUnits  = "troupe.rate_units"
)

// Bounds of a declaration.
const (
	// MaxBuckets bounds the buckets one config declares (each has a
	// goroutine and a Redis key).
	MaxBuckets = 1000
	// MaxNameBytes bounds a bucket's name (it is part of a Redis key).
	MaxNameBytes = 128
	// MaxKeysDefault bounds the buckets one template (a name with a
	// {tenant} or {label:NAME} placeholder) makes live on one node, unless
	// it sets max_keys; MaxKeysLimit is the most max_keys may say.
	MaxKeysDefault = 1000
	MaxKeysLimit   = 100_000
	// OverflowKey is the placeholder's value of the bucket a template's
	// jobs share once the template has MaxKeys buckets live on the node.
	OverflowKey = "~overflow"
)

// Bucket is one declared token bucket: Rate tokens every Per, holding at
// most Burst. A job of one of Topics that names no bucket takes Units
// from it.
type Bucket struct {
	Name   string
	Rate   int
	Per    time.Duration
	Burst  int
	Topics []string
	Units  int
	// MaxKeys is a template's bound on its live buckets on one node (0
	// for a plain bucket).
	MaxKeys int
	// Of is, for a bucket made from a template (one key's bucket), the
	// template's name; "" for a declared bucket.
	Of string

	// tmpl: a template's placeholder (nil: a plain bucket).
	tmpl *placeholder
}

// placeholder is a template's one {tenant} or {label:NAME}: the bucket's
// name is prefix + the job's value + suffix.
type placeholder struct {
	prefix, suffix string
	label          string // "": the tenant
}

// Template reports whether b is a template (a name with a placeholder):
// each distinct value gets its own bucket with b's limits.
func (b *Bucket) Template() bool { return b.tmpl != nil }

// same reports whether a and b declare the same bucket.
func (a *Bucket) same(b *Bucket) bool {
	return a.Name == b.Name && a.Rate == b.Rate && a.Per == b.Per && a.Burst == b.Burst && a.Units == b.Units &&
		a.MaxKeys == b.MaxKeys && slices.Equal(sortedCopy(a.Topics), sortedCopy(b.Topics))
}

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

// Spec is the node's declared buckets, immutable once built.
type Spec struct {
	// Buckets are the plain buckets by name; Templates the templates by
	// their declared name (e.g. "openai:{tenant}").
	Buckets   map[string]*Bucket
	Templates map[string]*Bucket
	byTopic   map[string]*Bucket
}

// Empty reports whether no bucket is declared.
func (s *Spec) Empty() bool { return s == nil || len(s.Buckets)+len(s.Templates) == 0 }

// Names are the buckets' names, sorted.
func (s *Spec) Names() []string {
	if s == nil {
		return nil
	}
	names := make([]string, 0, len(s.Buckets))
	for n := range s.Buckets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// ForJob returns the bucket and units a job takes: its meta.labels
// (troupe.rate_limit, troupe.rate_units: default 1), else its topic's
// bucket. bucket "" with problem "": none. A problem (an undeclared bucket,
// units that are not a positive number or exceed the bucket's burst, so
// could never be granted) is the job's error, to be dead-lettered. A
// template's job takes from its own key's bucket (Expand); a label naming
// one key's bucket ("openai:acme" of "openai:{tenant}") takes from it.
func (s *Spec) ForJob(req *capv1.JobRequest) (bucket string, units int, problem string) {
	if s.Empty() {
		if n := req.GetMeta().GetLabels()[LabelBucket]; n != "" {
			return "", 0, fmt.Sprintf("rate limit bucket %q is not declared (no rate_limits configured)", n)
		}
		return "", 0, ""
	}
	labels := req.GetMeta().GetLabels()
	var b *Bucket
	if n := labels[LabelBucket]; n != "" {
		if b = s.Buckets[n]; b == nil {
			if b = s.Templates[n]; b == nil {
				if b = s.Resolve(n); b == nil {
					return "", 0, fmt.Sprintf("rate limit bucket %q is not declared", n)
				}
			}
		}
		units = 1
	} else if b = s.byTopic[req.GetTopic()]; b != nil {
		units = b.Units
	} else {
		return "", 0, ""
	}
	if v, ok := labels[LabelUnits]; ok {
		u, err := strconv.Atoi(v)
		if err != nil || u < 1 {
			return "", 0, fmt.Sprintf("%s %q is not a positive whole number", LabelUnits, v)
		}
		units = u
	}
	name := b.Name
	if b.tmpl != nil {
		var p string
		if name, p = s.Expand(b, req); p != "" {
			return "", 0, p
		}
		if pb := s.Buckets[name]; pb != nil {
			b = pb // a key declared as a plain bucket of its own
		}
	}
	if units > b.Burst {
		return "", 0, fmt.Sprintf("%d units exceed bucket %q's burst of %d: never grantable", units, name, b.Burst)
	}
	return name, units, ""
}

// Expand is the name of template t's bucket for req: the placeholder
// replaced by the job's tenant or label value ("" when it has none: the
// jobs without one share that bucket). A value that cannot be part of a
// bucket's name is the job's problem.
func (s *Spec) Expand(t *Bucket, req *capv1.JobRequest) (name, problem string) {
	var v string
	if t.tmpl.label == "" {
		v = jobstate.TenantOf(req)
	} else {
		v = req.GetMeta().GetLabels()[t.tmpl.label]
	}
	name = t.tmpl.prefix + v + t.tmpl.suffix
	if len(name) > MaxNameBytes || strings.ContainsAny(v, "{}\x00 \t\r\n") {
		return "", fmt.Sprintf("rate limit bucket template %q: value %q makes no valid bucket name (1 to %d bytes, no spaces or braces)",
			t.Name, v, MaxNameBytes)
	}
	return name, ""
}

// Resolve is the bucket named name: a plain one, or one key's bucket of a
// template (a fresh *Bucket with the template's limits, Of set); nil when
// neither declares it.
func (s *Spec) Resolve(name string) *Bucket {
	if s == nil {
		return nil
	}
	if b := s.Buckets[name]; b != nil {
		return b
	}
	for _, t := range s.Templates {
		p := t.tmpl
		if len(name) >= len(p.prefix)+len(p.suffix) && strings.HasPrefix(name, p.prefix) && strings.HasSuffix(name, p.suffix) &&
			!strings.ContainsAny(name, "{}") {
			return &Bucket{Name: name, Rate: t.Rate, Per: t.Per, Burst: t.Burst, Units: t.Units, Of: t.Name, MaxKeys: t.MaxKeys}
		}
	}
	return nil
}

// OverflowOf is the name of the bucket template t's jobs share past its
// MaxKeys.
func OverflowOf(t *Bucket) string { return t.tmpl.prefix + OverflowKey + t.tmpl.suffix }

// Merge is the union of the pools file's buckets and the policy file's
// (either may be nil). A bucket or template both declare must be declared
// alike, and a topic may be bound to one bucket only: anything else is a
// conflict, an error naming the bucket or topic.
func Merge(pools, policy *Spec) (*Spec, error) {
	if policy.Empty() {
		return pools, nil
	}
	if pools.Empty() {
		return policy, nil
	}
	out := &Spec{Buckets: map[string]*Bucket{}, Templates: map[string]*Bucket{}, byTopic: map[string]*Bucket{}}
	for _, s := range []*Spec{pools, policy} {
		for _, m := range []map[string]*Bucket{s.Buckets, s.Templates} {
			for name, b := range m {
				dst := out.Buckets
				if b.tmpl != nil {
					dst = out.Templates
				}
				if o := dst[name]; o != nil {
					if !o.same(b) {
						return nil, fmt.Errorf("rate_limits: bucket %q is declared in both the pools file and the policy file, differently", name)
					}
					continue
				}
				dst[name] = b
				for _, t := range b.Topics {
					if o := out.byTopic[t]; o != nil && o.Name != b.Name {
						return nil, fmt.Errorf("rate_limits: topic %q is bound to bucket %q in one file and %q in the other", t, o.Name, b.Name)
					}
					out.byTopic[t] = b
				}
			}
		}
	}
	if len(out.Buckets)+len(out.Templates) > MaxBuckets {
		return nil, fmt.Errorf("rate_limits: the pools and policy files declare more than %d buckets", MaxBuckets)
	}
	if err := out.checkTemplates(); err != nil {
		return nil, err
	}
	return out, nil
}

// checkTemplates refuses two templates whose buckets' names could be
// alike (a name must tell its template).
func (s *Spec) checkTemplates() error {
	names := make([]string, 0, len(s.Templates))
	for n := range s.Templates {
		names = append(names, n)
	}
	slices.Sort(names)
	for i, a := range names {
		for _, b := range names[i+1:] {
			p, q := s.Templates[a].tmpl, s.Templates[b].tmpl
			if (strings.HasPrefix(p.prefix, q.prefix) || strings.HasPrefix(q.prefix, p.prefix)) &&
				(strings.HasSuffix(p.suffix, q.suffix) || strings.HasSuffix(q.suffix, p.suffix)) {
				return fmt.Errorf("rate_limits: templates %q and %q could name the same bucket", a, b)
			}
		}
	}
	return nil
}

// Parse reads the rate_limits section of a pools.yaml (nil: the file
// declares none):
//
//	rate_limits:
//	  openai:org-1:            # the bucket's name
//	    limit: 500             # tokens a period
//	    per: 1m                # the period (a Go duration; default 1s)
//	    burst: 500             # tokens it holds at most (default limit)
//	    topics: [job.summarize] # jobs of these topics take from it
//	    units: 1               # units such a job takes (default 1)
//
// Its errors name their line.
func Parse(data []byte) (*Spec, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("rate_limits: %w", err)
	}
	if len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, nil
	}
	root := doc.Content[0]
	var sec *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "rate_limits" {
			sec = root.Content[i+1]
		}
	}
	if sec == nil || sec.Kind == yaml.ScalarNode && sec.Tag == "!!null" {
		return nil, nil
	}
	if sec.Kind != yaml.MappingNode {
		return nil, lineErr(sec, "rate_limits must map bucket names to their limits")
	}
	if len(sec.Content)/2 > MaxBuckets {
		return nil, lineErr(sec, "rate_limits: more than %d buckets", MaxBuckets)
	}
	s := &Spec{Buckets: map[string]*Bucket{}, Templates: map[string]*Bucket{}, byTopic: map[string]*Bucket{}}
	for i := 0; i+1 < len(sec.Content); i += 2 {
		k, v := sec.Content[i], sec.Content[i+1]
		b, err := parseBucket(k, v)
		if err != nil {
			return nil, err
		}
		if s.Buckets[b.Name] != nil || s.Templates[b.Name] != nil {
			return nil, lineErr(k, "rate_limits: bucket %q declared twice", b.Name)
		}
		if b.tmpl != nil {
			s.Templates[b.Name] = b
		} else {
			s.Buckets[b.Name] = b
		}
		for _, t := range b.Topics {
			if o := s.byTopic[t]; o != nil {
				return nil, lineErr(k, "rate_limits: topic %q bound to buckets %q and %q", t, o.Name, b.Name)
			}
			s.byTopic[t] = b
		}
	}
	if err := s.checkTemplates(); err != nil {
		return nil, lineErr(sec, "%v", err)
	}
	return s, nil
}

// parseName reads a bucket's declared name: plain, or a template with one
// {tenant} or {label:NAME} placeholder.
func parseName(name string) (*placeholder, bool) {
	i := strings.IndexByte(name, '{')
	if i < 0 {
		return nil, !strings.ContainsAny(name, "}\x00 \t\r\n")
	}
	j := strings.IndexByte(name[i:], '}')
	if j < 0 {
		return nil, false
	}
	j += i
	p := &placeholder{prefix: name[:i], suffix: name[j+1:]}
	if strings.ContainsAny(p.prefix+p.suffix, "{}\x00 \t\r\n") {
		return nil, false
	}
	switch inner := name[i+1 : j]; {
	case inner == "tenant":
	case strings.HasPrefix(inner, "label:") && len(inner) > len("label:"):
		p.label = inner[len("label:"):]
	default:
		return nil, false
	}
	return p, true
}

func parseBucket(k, v *yaml.Node) (*Bucket, error) {
	name := k.Value
	tmpl, ok := parseName(name)
	if name == "" || len(name) > MaxNameBytes || !ok {
		return nil, lineErr(k, "rate_limits: bucket name %q: 1 to %d bytes, no spaces, braces only around one {tenant} or {label:NAME}",
			name, MaxNameBytes)
	}
	if v.Kind != yaml.MappingNode {
		return nil, lineErr(v, "rate_limits.%s must be a mapping (limit, per, burst, topics, units, max_keys)", name)
	}
	b := &Bucket{Name: name, Per: time.Second, Units: 1, tmpl: tmpl}
	for i := 0; i+1 < len(v.Content); i += 2 {
		fk, fv := v.Content[i], v.Content[i+1]
		var err error
		switch fk.Value {
		case "limit":
			b.Rate, err = positive(fv)
		case "burst":
			b.Burst, err = positive(fv)
		case "units":
			b.Units, err = positive(fv)
		case "per":
			b.Per, err = time.ParseDuration(fv.Value)
			if err == nil && (b.Per < time.Millisecond || b.Per > 24*time.Hour) {
				err = fmt.Errorf("%s is outside 1ms to 24h", fv.Value)
			}
		case "topics":
			err = fv.Decode(&b.Topics)
		case "max_keys":
			if tmpl == nil {
				return nil, lineErr(fk, "rate_limits.%s: max_keys is for a template (a name with {tenant} or {label:NAME})", name)
			}
			if b.MaxKeys, err = positive(fv); err == nil && b.MaxKeys > MaxKeysLimit {
				err = fmt.Errorf("%d is more than %d", b.MaxKeys, MaxKeysLimit)
			}
		default:
			return nil, lineErr(fk, "rate_limits.%s: unknown key %q (allowed: limit, per, burst, topics, units, max_keys)", name, fk.Value)
		}
		if err != nil {
			return nil, lineErr(fv, "rate_limits.%s.%s: %v", name, fk.Value, err)
		}
	}
	if b.Rate == 0 {
		return nil, lineErr(v, "rate_limits.%s: limit is required", name)
	}
	if b.Burst == 0 {
		b.Burst = b.Rate
	}
	if b.Units > b.Burst {
		return nil, lineErr(v, "rate_limits.%s: units %d exceed burst %d", name, b.Units, b.Burst)
	}
	if tmpl != nil && b.MaxKeys == 0 {
		b.MaxKeys = MaxKeysDefault
	}
	return b, nil
}

func positive(n *yaml.Node) (int, error) {
	v, err := strconv.Atoi(n.Value)
	if err != nil || v < 1 || v > 1e9 {
		return 0, fmt.Errorf("%q is not a whole number from 1 to 1e9", n.Value)
	}
	return v, nil
}

func lineErr(n *yaml.Node, format string, args ...any) error {
	return fmt.Errorf("line %d: "+format, append([]any{n.Line}, args...)...)
}

// Load reads path's rate_limits section (see Parse).
func Load(path string) (*Spec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("rate_limits: %w", err)
	}
	s, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}
