package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// MinKeyLength is the shortest API key accepted: 16 random bytes' worth of
// hex is 32 characters, and anything under 16 is guessable online.
const MinKeyLength = 16

// Role is what an API key's principal may do beyond reading and
// submitting within its tenant.
type Role string

const (
	// RoleClient submits, reads and cancels its tenant's jobs.
	RoleClient Role = "client"
	// RoleOperator may also approve and reject jobs waiting for approval
	// (of its tenant, or of every tenant for a "*" key).
	RoleOperator Role = "operator"
)

// Key is one API key's entry: who presents it and what it may do.
type Key struct {
	// Tenant is the tenant the key acts for (AllTenants: every tenant).
	Tenant string
	// Role defaults to DefaultRole(Tenant).
	Role Role
	// Name identifies the principal in records (approved_by, cancelled_by)
	// and in the self-approval check; default "api:<tenant>/<8 hex of the
	// key's SHA-256>", distinct per key without revealing it.
	Name string
}

// DefaultRole is the role of a key whose entry names none: an all-tenant
// key was the administrator's key before roles existed and stays an
// operator; a tenant key is a client, so it no longer approves.
func DefaultRole(tenant string) Role {
	if tenant == AllTenants {
		return RoleOperator
	}
	return RoleClient
}

// maxNameLen bounds a principal's name: it is stored in job records.
const maxNameLen = 128

// keyring holds the API keys as SHA-256 digests. Comparing digests rather
// than the keys keeps the comparison constant-time regardless of the
// presented key's length, and keeps the keys themselves out of memory
// dumps of the server's state.
type keyring struct {
	entries []keyEntry
}

type keyEntry struct {
	digest [sha256.Size]byte
	p      principal
}

func newKeyring(short map[string]string, full map[string]Key) (*keyring, error) {
	k := &keyring{}
	all := make(map[string]Key, len(short)+len(full))
	for key, tenant := range short {
		all[key] = Key{Tenant: tenant}
	}
	for key, e := range full {
		if _, dup := all[key]; dup {
			return nil, fmt.Errorf("admin: API key %s is in both APIKeys and Keys", redact(key))
		}
		all[key] = e
	}
	names := map[string]bool{}
	for key, e := range all {
		if len(key) < MinKeyLength {
			return nil, fmt.Errorf("admin: an API key (tenant %q) is shorter than %d characters", e.Tenant, MinKeyLength)
		}
		if e.Tenant == "" {
			return nil, errors.New("admin: an API key has an empty tenant (use \"*\" for all tenants)")
		}
		if e.Role == "" {
			e.Role = DefaultRole(e.Tenant)
		}
		if e.Role != RoleClient && e.Role != RoleOperator {
			return nil, fmt.Errorf("admin: API key %s: role %q (want %s or %s)", redact(key), e.Role, RoleClient, RoleOperator)
		}
		d := sha256.Sum256([]byte(key))
		if e.Name == "" {
			e.Name = "api:" + e.Tenant + "/" + hex.EncodeToString(d[:4])
		}
		if err := validName(e.Name); err != nil {
			return nil, fmt.Errorf("admin: API key %s: %w", redact(key), err)
		}
		if names[e.Name] {
			// Two keys under one name would be one principal to the
			// self-approval check: a mistake, not a way to share.
			return nil, fmt.Errorf("admin: API key name %q given twice", e.Name)
		}
		names[e.Name] = true
		k.entries = append(k.entries, keyEntry{digest: d, p: principal{tenant: e.Tenant, role: e.Role, name: e.Name}})
	}
	return k, nil
}

func validName(n string) error {
	if n == "" || len(n) > maxNameLen {
		return fmt.Errorf("name must be 1 to %d bytes", maxNameLen)
	}
	for _, r := range n {
		if r <= ' ' || r == 0x7f || r > '~' {
			return fmt.Errorf("name %q: printable ASCII without spaces only", n)
		}
	}
	return nil
}

func (k *keyring) empty() bool { return len(k.entries) == 0 }

// lookup returns the principal of key. It compares against every entry,
// with no early exit, so the time taken says nothing about which key
// matched.
func (k *keyring) lookup(key string) (principal, bool) {
	d := sha256.Sum256([]byte(key))
	var p principal
	found := 0
	for i := range k.entries {
		if subtle.ConstantTimeCompare(d[:], k.entries[i].digest[:]) == 1 {
			p, found = k.entries[i].p, 1
		}
	}
	return p, found == 1
}

// principal is who a request acts as.
type principal struct {
	tenant string // AllTenants for every tenant
	role   Role
	name   string // who, for records and the self-approval check
}

// loopbackPrincipal is every request's principal when no key is
// configured: the server trusts whoever reaches its loopback address, and
// such requests have no identity to tell apart.
var loopbackPrincipal = principal{tenant: AllTenants, role: RoleOperator, name: "api"}

func (p principal) all() bool { return p.tenant == AllTenants }

// sees reports whether p may see and act on a job of tenant.
func (p principal) sees(tenant string) bool { return p.all() || p.tenant == tenant }

// by names p in records of who did what.
func (p principal) by() string { return p.name }

// scope is what an endpoint needs of a key.
type scope int

const (
	anyTenant  scope = iota // any valid key; results are filtered to its tenant
	allTenants              // an all-tenant key (cluster-wide data or settings)
	operators               // a key with RoleOperator (approvals), of the job's tenant or "*"
)

type principalKey struct{}

func principalOf(ctx context.Context) principal {
	p, _ := ctx.Value(principalKey{}).(principal)
	return p
}

// presentedKey returns the key a request carries: "Authorization: Bearer
// <key>", or "X-API-Key: <key>" for clients that cannot set Authorization.
func presentedKey(r *http.Request) string {
	if h := r.Header.Get("Authorization"); h != "" {
		if scheme, tok, ok := strings.Cut(h, " "); ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(tok)
		}
		return ""
	}
	return r.Header.Get("X-API-Key")
}

// authenticated resolves the request's principal and enforces sc. Without
// keys configured every request is an all-tenant principal, but only from
// a loopback Host (see hostChecked) and, for writes, only from a page of
// the same origin.
func (s *Server) authenticated(sc scope, next http.Handler) http.Handler {
	return s.hostChecked(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p principal
		if s.keys.empty() {
			if !safeMethod(r.Method) && !sameOrigin(r) {
				writeError(w, r, errForbidden("cross-origin write refused"))
				return
			}
			p = loopbackPrincipal
		} else {
			key := presentedKey(r)
			if key == "" {
				w.Header().Set("WWW-Authenticate", `Bearer realm="troupe"`)
				writeError(w, r, &apiError{Status: http.StatusUnauthorized, Code: "unauthorized", Msg: "API key required"})
				return
			}
			kp, ok := s.keys.lookup(key)
			if !ok {
				w.Header().Set("WWW-Authenticate", `Bearer realm="troupe", error="invalid_token"`)
				writeError(w, r, &apiError{Status: http.StatusUnauthorized, Code: "unauthorized", Msg: "invalid API key"})
				return
			}
			p = kp
		}
		if sc == allTenants && !p.all() {
			writeError(w, r, errForbidden("this action needs an all-tenant key"))
			return
		}
		if sc == operators && p.role != RoleOperator {
			s.refused.WithLabelValues(RefusedNotOperator).Inc()
			writeError(w, r, errForbidden("this action needs a key with role "+string(RoleOperator)))
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), principalKey{}, p)))
	}))
}

// hostChecked refuses, when no API key is configured, a request whose Host
// is not a loopback name: a web page the operator visits could otherwise
// point a DNS name of its own at 127.0.0.1 and read the API (DNS rebinding).
func (s *Server) hostChecked(next http.Handler) http.Handler {
	if !s.keys.empty() {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !loopbackHost(r.Host) {
			writeError(w, r, errForbidden("host "+r.Host+" is not loopback"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// sameOrigin reports whether a browser request comes from a page served by
// this host. Non-browser clients send no Origin, and pass.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// ParseKeyEntries reads API key entries: "key=tenant", optionally followed
// by space-separated attributes "role=client|operator" and "name=<who>"
// (for example "k3y...=acme role=operator name=alice"), entries separated
// by commas or newlines, blank lines and lines starting with # skipped:
// the format of TROUPE_API_KEYS and --api-keys-file. An entry without a
// role has DefaultRole's, so files written before roles keep working. A
// key given twice is an error, so a paste mistake cannot silently change a
// key's tenant.
func ParseKeyEntries(s string) (map[string]Key, error) {
	out := map[string]Key{}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for _, item := range strings.Split(line, ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				continue
			}
			key, rest, ok := strings.Cut(item, "=")
			key = strings.TrimSpace(key)
			fields := strings.Fields(rest)
			if !ok || key == "" || len(fields) == 0 {
				return nil, fmt.Errorf("admin: API key entry %q: want key=tenant", redact(item))
			}
			e := Key{Tenant: fields[0]}
			for _, f := range fields[1:] {
				name, val, _ := strings.Cut(f, "=")
				switch {
				case name == "role" && val != "":
					e.Role = Role(val)
				case name == "name" && val != "":
					e.Name = val
				default:
					return nil, fmt.Errorf("admin: API key %s: attribute %q (want role=... or name=...)", redact(key), f)
				}
			}
			if _, dup := out[key]; dup {
				return nil, fmt.Errorf("admin: API key %s given twice", redact(key))
			}
			out[key] = e
		}
	}
	return out, nil
}

// redact keeps the first characters of a secret, enough to find it in a
// file, not enough to use it.
func redact(s string) string {
	const keep = 4
	if len(s) <= keep {
		return "…"
	}
	return s[:keep] + "…"
}
