package signing

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Key set limits: they bound what one packet can cost to verify and what a
// sender pattern can look like.
const (
	// maxKeysPerSender: a sender lists its current key and a few being
	// rotated in or out; each listed key can cost one ECDSA verification.
	maxKeysPerSender = 8
	// maxSenderLen bounds a sender id or pattern in the key set.
	maxSenderLen = 256
)

// ErrInvalidKeySet wraps every key set error.
var ErrInvalidKeySet = errors.New("invalid key set")

// KeySetError is a key set error at a line (0 when unknown), naming the
// sender it concerns when there is one.
type KeySetError struct {
	Line   int
	Sender string
	Msg    string
}

func (e *KeySetError) Error() string {
	var b strings.Builder
	b.WriteString(ErrInvalidKeySet.Error())
	if e.Line > 0 {
		b.WriteString(": line " + strconv.Itoa(e.Line))
	}
	if e.Sender != "" {
		b.WriteString(": sender " + strconv.Quote(e.Sender))
	}
	b.WriteString(": " + e.Msg)
	return b.String()
}

// Is makes errors.Is(err, ErrInvalidKeySet) hold.
func (e *KeySetError) Is(target error) bool { return target == ErrInvalidKeySet }

// KeySet maps sender ids to the public keys that may sign for them. It is
// immutable once parsed.
//
// The file is a YAML mapping from sender id to one PEM public key or a list
// of them (several during a rotation; list the current key first, it is
// tried first):
//
//	node-a: |
//	  -----BEGIN PUBLIC KEY-----
//	  MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE...
//	  -----END PUBLIC KEY-----
//	worker-1: ["-----BEGIN PUBLIC KEY-----\nMFkw...\n-----END PUBLIC KEY-----\n"]
//	"troupe-saga/*": [...]
//
// A sender ending in "*" is a prefix pattern ("*" alone matches every
// sender). The entry for the exact sender id wins; otherwise the longest
// matching pattern. Only that entry's keys are tried.
//
// An entry may instead be a mapping that names its holder's role and scope
// (see Principal and SECURITY.md, "Roles and scopes"):
//
//	node-*:   {role: node, keys: [...]}
//	w-1:      {role: worker, pools: [default], workers: [w-1b], keys: [...]}
//	ci:       {role: client, tenants: [tenantA], keys: [...]}
//	alice:    {role: operator, keys: [...]}
//
// A file uses one form or the other: once one entry names a role, an entry
// of PEM keys alone is refused (it would be a master key). A file of PEM
// keys only is a legacy key set: every sender may act as every role.
type KeySet struct {
	exact    map[string]*entry
	patterns []pattern // longest prefix first
	roled    bool
}

type pattern struct {
	prefix string
	e      *entry
}

func (ks *KeySet) lookup(sender string) *entry {
	if e, ok := ks.exact[sender]; ok {
		return e
	}
	for _, p := range ks.patterns {
		if strings.HasPrefix(sender, p.prefix) {
			return p.e
		}
	}
	return nil
}

// Keys returns the keys that may sign for sender (nil: none).
func (ks *KeySet) Keys(sender string) []*ecdsa.PublicKey {
	if e := ks.lookup(sender); e != nil {
		return e.keys
	}
	return nil
}

// Principal returns what sender may do (false: not in the key set).
func (ks *KeySet) Principal(sender string) (Principal, bool) {
	e := ks.lookup(sender)
	if e == nil {
		return Principal{}, false
	}
	p := e.p
	p.Sender = sender
	return p, true
}

// Roled reports whether the set's entries name roles (false: a legacy set,
// every sender may act as every role).
func (ks *KeySet) Roled() bool { return ks.roled }

// Senders returns how many sender entries (ids and patterns) the set has.
func (ks *KeySet) Senders() int { return len(ks.exact) + len(ks.patterns) }

func ksErr(n *yaml.Node, sender, format string, args ...any) *KeySetError {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &KeySetError{Line: line, Sender: sender, Msg: fmt.Sprintf(format, args...)}
}

// ParseKeySet parses a key set file's content. Every error names its line
// and, when it concerns one, the sender.
func ParseKeySet(data []byte) (*KeySet, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &KeySetError{Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, &KeySetError{Line: 1, Msg: "no senders (want a mapping of sender id to PEM public keys)"}
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return nil, ksErr(root, "", "the file must be a mapping of sender id to PEM public keys")
	}
	if len(root.Content) == 0 {
		return nil, ksErr(root, "", "no senders (want a mapping of sender id to PEM public keys)")
	}
	ks := &KeySet{exact: map[string]*entry{}}
	seen := map[string]int{}
	legacyAt, legacySender := 0, ""
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return nil, ksErr(k, "", "a sender id must be a string")
		}
		sender := k.Value
		if err := checkSender(sender); err != nil {
			return nil, ksErr(k, sender, "%s", err)
		}
		if first, dup := seen[sender]; dup {
			return nil, ksErr(k, sender, "listed twice (first at line %d)", first)
		}
		seen[sender] = k.Line
		e, roled, err := parseEntry(v, sender)
		if err != nil {
			return nil, err
		}
		if roled {
			ks.roled = true
		} else if legacyAt == 0 {
			legacyAt, legacySender = k.Line, sender
		}
		if prefix, ok := strings.CutSuffix(sender, "*"); ok {
			ks.patterns = append(ks.patterns, pattern{prefix: prefix, e: &e})
		} else {
			ks.exact[sender] = &e
		}
	}
	if ks.roled && legacyAt > 0 {
		return nil, &KeySetError{Line: legacyAt, Sender: legacySender,
			Msg: "no role: once one entry names a role, every entry must (an entry of keys alone may act as every role)"}
	}
	sort.SliceStable(ks.patterns, func(i, j int) bool { return len(ks.patterns[i].prefix) > len(ks.patterns[j].prefix) })
	return ks, nil
}

// LoadKeySet reads and parses a key set file.
func LoadKeySet(path string) (*KeySet, error) {
	data, err := readKeyFile(path)
	if err != nil {
		return nil, err
	}
	ks, err := ParseKeySet(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return ks, nil
}

func checkSender(s string) error {
	switch {
	case s == "":
		return errors.New("empty sender id")
	case len(s) > maxSenderLen:
		return fmt.Errorf("sender id longer than %d bytes", maxSenderLen)
	case strings.Contains(strings.TrimSuffix(s, "*"), "*"):
		return errors.New(`"*" is only allowed at the end of a sender (a prefix pattern)`)
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f {
			return errors.New("sender id contains a space or control character")
		}
	}
	return nil
}

// parseSenderKeys reads one sender's value: a string holding one or more
// PEM blocks, or a list of such strings.
func parseSenderKeys(v *yaml.Node, sender string) ([]*ecdsa.PublicKey, error) {
	var items []*yaml.Node
	switch v.Kind {
	case yaml.ScalarNode:
		items = []*yaml.Node{v}
	case yaml.SequenceNode:
		items = v.Content
	default:
		return nil, ksErr(v, sender, "want a PEM public key or a list of them")
	}
	var keys []*ecdsa.PublicKey
	for _, it := range items {
		if it.Kind != yaml.ScalarNode {
			return nil, ksErr(it, sender, "key %d: want a PEM public key string", len(keys)+1)
		}
		rest := []byte(it.Value)
		for {
			block, r := pem.Decode(rest)
			if block == nil {
				break
			}
			rest = r
			pub, err := parsePublic(block)
			if err != nil {
				return nil, ksErr(it, sender, "key %d: %s", len(keys)+1, err)
			}
			keys = append(keys, pub)
		}
		if len(bytes.TrimSpace(rest)) > 0 {
			return nil, ksErr(it, sender, "key %d: not a PEM public key (want -----BEGIN PUBLIC KEY-----)", len(keys)+1)
		}
		if len(keys) > maxKeysPerSender {
			return nil, ksErr(it, sender, "more than %d keys", maxKeysPerSender)
		}
	}
	if len(keys) == 0 {
		return nil, ksErr(v, sender, "no keys")
	}
	return keys, nil
}

func parsePublic(b *pem.Block) (*ecdsa.PublicKey, error) {
	if b.Type != "PUBLIC KEY" {
		return nil, fmt.Errorf("PEM block %q is not a PUBLIC KEY", b.Type)
	}
	k, err := x509.ParsePKIXPublicKey(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("public key does not parse: %w", err)
	}
	ec, ok := k.(*ecdsa.PublicKey)
	if !ok || ec.Curve != elliptic.P256() {
		return nil, errors.New("not an ECDSA P-256 public key")
	}
	return ec, nil
}
