package main

import (
	"strings"
	"testing"

	"github.com/troupe-run/troupe/signing"
)

func TestKeySetEntryNamesRoleAndScope(t *testing.T) {
	_, pub, err := signing.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	line, err := keySetEntry("w-1", "worker", "default, gpu", "", pub)
	if err != nil {
		t.Fatal(err)
	}
	ks, err := signing.ParseKeySet([]byte(line))
	if err != nil {
		t.Fatalf("%v\n%s", err, line)
	}
	p, ok := ks.Principal("w-1")
	if !ok || p.Role != signing.RoleWorker || !p.InPool("gpu") || p.InPool("secure") {
		t.Fatalf("entry %q: %+v", line, p)
	}
	if line, err = keySetEntry("old", "", "", "", pub); err != nil || !strings.HasPrefix(line, `"old": [`) {
		t.Fatalf("legacy entry %q: %v", line, err)
	}
	for _, bad := range [][2]string{{"client", ""}, {"admin", ""}, {"node", "tenantA"}} {
		if _, err := keySetEntry("x", bad[0], "", bad[1], pub); err == nil {
			t.Errorf("role %q tenants %q: no error", bad[0], bad[1])
		}
	}
}
