package logx_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/troupe-run/troupe/internal/logx"
)

func TestRedactURLHidesPasswords(t *testing.T) {
	for _, u := range []string{"redis://user:s3cret@127.0.0.1:6379/0", "nats://tok:s3cret@host:4222", "rediss://:s3cret@h:1"} {
		if got := logx.RedactURL(u); strings.Contains(got, "s3cret") {
			t.Errorf("%s → %s", u, got)
		}
	}
	if got := logx.RedactURL("redis://127.0.0.1:6379"); got != "redis://127.0.0.1:6379" {
		t.Errorf("a URL without a password changed: %s", got)
	}
}

func TestClip(t *testing.T) {
	if got := logx.Clip("short"); got != "short" {
		t.Fatalf("a short string changed: %q", got)
	}
	long := strings.Repeat("é", 300) // 600 bytes, two per rune
	got := logx.Clip(long)
	if len(got) > logx.MaxUntrusted+32 || !strings.HasSuffix(got, "…(600 bytes)") {
		t.Fatalf("clipped to %d bytes: %q", len(got), got)
	}
	if !utf8.ValidString(got) {
		t.Fatal("clipped inside a rune")
	}
}
