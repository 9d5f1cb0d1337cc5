package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
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

// keyring holds the API keys as SHA-256 digests. Comparing digests rather
// than the keys keeps the comparison constant-time regardless of the
// presented key's length, and keeps the keys themselves out of memory
// dumps of the server's state.
type keyring struct {
	entries []keyEntry
}

type keyEntry struct {
	digest [sha256.Size]byte
	tenant string
}

func newKeyring(keys map[string]string) (*keyring, error) {
	k := &keyring{}
	for key, tenant := range keys {
		if len(key) < MinKeyLength {
			return nil, fmt.Errorf("admin: an API key (tenant %q) is shorter than %d characters", tenant, MinKeyLength)
		}
		if tenant == "" {
			return nil, errors.New("admin: an API key has an empty tenant (use \"*\" for all tenants)")
		}
		k.entries = append(k.entries, keyEntry{digest: sha256.Sum256([]byte(key)), tenant: tenant})
	}
	return k, nil
}

func (k *keyring) empty() bool { return len(k.entries) == 0 }

// lookup returns the tenant of key. It compares against every entry, with
// no early exit, so the time taken says nothing about which key matched.
func (k *keyring) lookup(key string) (string, bool) {
	d := sha256.Sum256([]byte(key))
	tenant, found := "", 0
	for i := range k.entries {
		if subtle.ConstantTimeCompare(d[:], k.entries[i].digest[:]) == 1 {
			tenant, found = k.entries[i].tenant, 1
		}
	}
	return tenant, found == 1
}

// principal is who a request acts as.
type principal struct {
	tenant string // AllTenants for every tenant
}

func (p principal) all() bool { return p.tenant == AllTenants }

// sees reports whether p may see and act on a job of tenant.
func (p principal) sees(tenant string) bool { return p.all() || p.tenant == tenant }

// by names p in records of who did what, when the request names nobody.
func (p principal) by() string {
	if p.all() {
		return "api"
	}
	return "api:" + p.tenant
}

// scope is what an endpoint needs of a key.
type scope int

const (
	anyTenant  scope = iota // any valid key; results are filtered to its tenant
	allTenants              // an all-tenant key (cluster-wide data or settings)
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
			p = principal{tenant: AllTenants}
		} else {
			key := presentedKey(r)
			if key == "" {
				w.Header().Set("WWW-Authenticate", `Bearer realm="troupe"`)
				writeError(w, r, &apiError{Status: http.StatusUnauthorized, Code: "unauthorized", Msg: "API key required"})
				return
			}
			tenant, ok := s.keys.lookup(key)
			if !ok {
				w.Header().Set("WWW-Authenticate", `Bearer realm="troupe", error="invalid_token"`)
				writeError(w, r, &apiError{Status: http.StatusUnauthorized, Code: "unauthorized", Msg: "invalid API key"})
				return
			}
			p = principal{tenant: tenant}
		}
		if sc == allTenants && !p.all() {
			writeError(w, r, errForbidden("this action needs an all-tenant key"))
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

// ParseKeys reads API keys written as "key=tenant" pairs, separated by
// commas or newlines ("*" as the tenant for all tenants; blank lines and
// lines starting with # are skipped): the format of an environment
// variable or a keys file. A key given twice is an error, so a paste
// mistake cannot silently change a key's tenant.
func ParseKeys(s string) (map[string]string, error) {
	out := map[string]string{}
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
			key, tenant, ok := strings.Cut(item, "=")
			key, tenant = strings.TrimSpace(key), strings.TrimSpace(tenant)
			if !ok || key == "" || tenant == "" {
				return nil, fmt.Errorf("admin: API key entry %q: want key=tenant", redact(item))
			}
			if _, dup := out[key]; dup {
				return nil, fmt.Errorf("admin: API key %s given twice", redact(key))
			}
			out[key] = tenant
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
