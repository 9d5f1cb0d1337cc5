package admin_test

import (
	"strings"
	"testing"

	"github.com/troupe-run/troupe/internal/admin"
)

func TestParseKeys(t *testing.T) {
	t.Parallel()
	keys, err := admin.ParseKeys("# operators\nkey-one-0123456789=*\n\n key-two-0123456789 = acme , key-three-012345678=beta\n")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"key-one-0123456789": "*", "key-two-0123456789": "acme", "key-three-012345678": "beta"}
	if len(keys) != len(want) {
		t.Fatalf("keys %v", keys)
	}
	for k, v := range want {
		if keys[k] != v {
			t.Fatalf("key %s: tenant %q, want %q", k, keys[k], v)
		}
	}
	for _, bad := range []string{"secretkeywithoutatenant", "=acme", "k0123456789abcdef=", "dup-0123456789=a,dup-0123456789=b"} {
		_, err := admin.ParseKeys(bad)
		if err == nil {
			t.Errorf("%q parsed", bad)
			continue
		}
		if strings.Contains(err.Error(), "0123456789") || strings.Contains(err.Error(), "withoutatenant") {
			t.Errorf("error repeats the secret: %v", err)
		}
	}
}
