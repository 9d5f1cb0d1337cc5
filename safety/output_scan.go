package safety

import (
	"bytes"
	"context"
	"regexp"
	"sort"
)

// Built-in detectors. Each finds one kind of sensitive text; the secrets
// and pii scanners of the output policy are sets of them.
const (
	detectPrivateKey   = "private_key"    // PEM private key blocks (RSA, EC, OpenSSH, PKCS#8, encrypted)
	detectAWSAccessKey = "aws_access_key" // AKIA…/ASIA… access key ids
	detectAWSSecretKey = "aws_secret_key" // aws_secret_access_key = <40 chars>
	detectGCPAPIKey    = "gcp_api_key"    // AIza… API keys
	detectGitHubToken  = "github_token"   // ghp_/gho_/ghu_/ghs_/ghr_ tokens
	detectSlackToken   = "slack_token"    // xoxb-/xoxp-/… tokens
	detectBearerToken  = "bearer_token"   // "Bearer <token>"
	detectURLPassword  = "url_password"   // scheme://user:password@host
	detectEmail        = "email"
	detectPhone        = "phone"       // E.164 (+4915123456789) and NANP-style (555-123-4567)
	detectCreditCard   = "credit_card" // 13–19 digits passing the Luhn check
)

// secretDetectors and pIIDetectors are the scanners' default sets.
var (
	secretDetectors = []string{detectPrivateKey, detectAWSAccessKey, detectAWSSecretKey, detectGCPAPIKey,
		detectGitHubToken, detectSlackToken, detectBearerToken, detectURLPassword}
	pIIDetectors = []string{detectEmail, detectPhone, detectCreditCard}
)

// detector finds one kind of sensitive text. The hot path is the cheap
// prefilter: a literal that every match contains, checked with
// bytes.Contains before the regexp runs, so that clean text costs a few
// memchr-speed scans.
type detector struct {
	name string
	// any: the text must contain one of these for the regexp to run (nil:
	// always run).
	any [][]byte
	re  *regexp.Regexp
	// group: the submatch to redact (0: the whole match). A bearer
	// token's "Bearer " and a URL's user name stay readable.
	group int
	// valid, if set, confirms a match (the Luhn check).
	valid func([]byte) bool
	// validAt, if set, confirms a match in its context: text[s:e] is the
	// match.
	validAt func(text []byte, s, e int) bool
	// minDigits > 0: the regexp runs only over runs of number-ish bytes
	// (digits, spaces, + ( ) - .) holding at least this many digits, with
	// one byte of context each side for \b. A regexp with no literal to
	// look for crawls through megabytes; the byte loop that finds runs
	// does not.
	minDigits int
	// window: a match never spans whitespace and always contains an
	// anchor (any), so the regexp runs only over the whitespace-bounded
	// token around each anchor (at most tokenReach bytes each side)
	// instead of over the whole text: content full of URLs or @handles
	// would otherwise be scanned at regexp speed end to end.
	window bool
	// need: a window must also contain this to be worth the regexp (a
	// URL has a password only if it has an @).
	need []byte
}

// tokenReach bounds a window on each side of its anchor: an address's
// local part or domain, a URL's scheme, user and password are shorter.
const tokenReach = 256

var detectors = map[string]*detector{
	detectPrivateKey: {name: detectPrivateKey, any: lits("PRIVATE KEY-----"),
		// A block cut off before its END line is still a key.
		re: regexp.MustCompile(`-----BEGIN[ A-Z0-9]*PRIVATE KEY-----(?:[\s\S]*?-----END[ A-Z0-9]*PRIVATE KEY-----|[\s\S]*)`)},
	detectAWSAccessKey: {name: detectAWSAccessKey, any: lits("AKIA", "ASIA", "ABIA", "ACCA"),
		re: regexp.MustCompile(`\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b`)},
	detectAWSSecretKey: {name: detectAWSSecretKey, any: lits("ecret", "ECRET"),
		re:    regexp.MustCompile(`(?i)aws_?secret_?(?:access_?)?key["']?\s*[:=]\s*["']?([A-Za-z0-9/+=]{40})`),
		group: 1},
	detectGCPAPIKey: {name: detectGCPAPIKey, any: lits("AIza"),
		re: regexp.MustCompile(`\bAIza[0-9A-Za-z_\-]{35}`)},
	detectGitHubToken: {name: detectGitHubToken, any: lits("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
		re: regexp.MustCompile(`\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{40,})\b`)},
	detectSlackToken: {name: detectSlackToken, any: lits("xox"),
		re: regexp.MustCompile(`\bxox[abposr]-[A-Za-z0-9-]{10,}`)},
	detectBearerToken: {name: detectBearerToken, any: lits("earer", "EARER"),
		re: regexp.MustCompile(`(?i)\bbearer\s+([A-Za-z0-9\-._~+/]{16,}=*)`), group: 1},
	detectURLPassword: {name: detectURLPassword, any: lits("://"), window: true, need: []byte("@"),
		re: regexp.MustCompile(`\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s:/@]+:([^\s/@]+)@`), group: 1},
	detectEmail: {name: detectEmail, any: lits("@"), window: true,
		re:      regexp.MustCompile(`[A-Za-z0-9._%+\-]+@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)*\.[A-Za-z]{2,}`),
		validAt: notInURLAuthority},
	detectPhone: {name: detectPhone, minDigits: 10,
		re: regexp.MustCompile(`(?:\+\d{10,15}\b|(?:\+\d{1,3}[\s.\-]?)?(?:\(\d{3}\)\s?|\b\d{3}[\s.\-])\d{3}[\s.\-]\d{4}\b)`)},
	detectCreditCard: {name: detectCreditCard, minDigits: 13,
		re: regexp.MustCompile(`\b(?:\d[ \-]?){12,18}\d\b`), valid: luhn},
}

func lits(s ...string) [][]byte {
	out := make([][]byte, len(s))
	for i, v := range s {
		out[i] = []byte(v)
	}
	return out
}

// Finding is one piece of sensitive text found. It never holds the text
// itself, so that findings can be logged and stored on the job.
type Finding struct {
	// Detector is the detector's name (detectEmail, ...).
	Detector string
	// Where is the field: "content", "result_ptr", "error_message",
	// "artifact_ptrs[i]".
	Where string
	// Offset and Len locate the redactable part in that field, in bytes.
	Offset, Len int
}

// scan appends d's findings in text to out.
func (d *detector) scan(text []byte, where string, out []Finding) []Finding {
	if d.any != nil {
		hit := false
		for _, l := range d.any {
			if bytes.Contains(text, l) {
				hit = true
				break
			}
		}
		if !hit {
			return out
		}
	}
	if d.window {
		return d.scanTokens(text, where, out)
	}
	if d.minDigits == 0 {
		return d.find(text, 0, len(text), where, out)
	}
	for i := 0; i < len(text); {
		if !numberish(text[i]) {
			i++
			continue
		}
		j, digits := i, 0
		for ; j < len(text) && numberish(text[j]); j++ {
			if text[j] >= '0' && text[j] <= '9' {
				digits++
			}
		}
		if digits >= d.minDigits {
			out = d.find(text, max(i-1, 0), min(j+1, len(text)), where, out)
		}
		i = j
	}
	return out
}

// scanTokens runs the regexp over the token around each anchor.
func (d *detector) scanTokens(text []byte, where string, out []Finding) []Finding {
	for i := 0; i < len(text); {
		at := -1
		for _, l := range d.any {
			if k := bytes.Index(text[i:], l); k >= 0 && (at < 0 || i+k < at) {
				at = i + k
			}
		}
		if at < 0 {
			break
		}
		from, to := at, at
		for from > i && at-from < tokenReach && !isSpace(text[from-1]) {
			from--
		}
		for to < len(text) && to-at < tokenReach && !isSpace(text[to]) {
			to++
		}
		if d.need == nil || bytes.Contains(text[from:to], d.need) {
			out = d.find(text, from, to, where, out)
		}
		i = max(to, at+1)
	}
	return out
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

func numberish(c byte) bool {
	return c >= '0' && c <= '9' || c == ' ' || c == '\t' || c == '+' || c == '(' || c == ')' || c == '-' || c == '.'
}

// find runs the regexp over text[from:to] and appends findings with
// offsets into text.
func (d *detector) find(text []byte, from, to int, where string, out []Finding) []Finding {
	for _, m := range d.re.FindAllSubmatchIndex(text[from:to], -1) {
		s, e := m[2*d.group], m[2*d.group+1]
		if s < 0 {
			continue
		}
		s, e = s+from, e+from
		if d.valid != nil && !d.valid(text[s:e]) {
			continue
		}
		if d.validAt != nil && !d.validAt(text, s, e) {
			continue
		}
		out = append(out, Finding{Detector: d.name, Where: where, Offset: s, Len: e - s})
	}
	return out
}

// scanAll runs every detector over text, checking ctx between detectors
// (a large content scan must respect its budget).
func scanAll(ctx context.Context, ds []*detector, text []byte, where string, out []Finding) ([]Finding, error) {
	for _, d := range ds {
		if err := ctx.Err(); err != nil {
			return out, err
		}
		out = d.scan(text, where, out)
	}
	return out, nil
}

// redact returns a copy of text with every finding replaced by
// "[REDACTED:<detector>]". Overlapping findings are merged (the first
// detector's name is kept).
func redact(text []byte, fs []Finding) []byte {
	if len(fs) == 0 {
		return append([]byte(nil), text...)
	}
	spans := append([]Finding(nil), fs...)
	sort.Slice(spans, func(i, j int) bool { return spans[i].Offset < spans[j].Offset })
	var out bytes.Buffer
	out.Grow(len(text))
	pos := 0
	for i := 0; i < len(spans); {
		s, e, name := spans[i].Offset, spans[i].Offset+spans[i].Len, spans[i].Detector
		j := i + 1
		for ; j < len(spans) && spans[j].Offset < e; j++ {
			e = max(e, spans[j].Offset+spans[j].Len)
		}
		if s < pos {
			s = pos
		}
		out.Write(text[pos:s])
		out.WriteString("[REDACTED:" + name + "]")
		pos = e
		i = j
	}
	out.Write(text[pos:])
	return out.Bytes()
}

// notInURLAuthority rejects an "address" that is the password@host part
// of scheme://user:password@host: that is a credential (url_password's
// business), not an e-mail address. It looks back along the token, at
// most urlLookBack bytes (a scheme and user name are short; an unbounded
// look-back would make a long token full of @ quadratic).
func notInURLAuthority(text []byte, s, _ int) bool {
	const urlLookBack = 256
	start := s
	for start > 0 && s-start < urlLookBack {
		c := text[start-1]
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '"' || c == '\'' || c == '<' || c == '(' {
			break
		}
		start--
	}
	return !bytes.Contains(text[start:s], []byte("://"))
}

// luhn checks a card number's digits (separators ignored) and length.
func luhn(b []byte) bool {
	sum, n, double := 0, 0, false
	for i := len(b) - 1; i >= 0; i-- {
		c := b[i]
		if c < '0' || c > '9' {
			continue
		}
		d := int(c - '0')
		if double {
			if d *= 2; d > 9 {
				d -= 9
			}
		}
		sum += d
		n++
		double = !double
	}
	return n >= 13 && n <= 19 && sum%10 == 0
}
