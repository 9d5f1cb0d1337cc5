// Package logx holds the small slog helpers the node and the bench share.
package logx

import (
	"context"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"
)

// LevelFloor returns a handler that drops records below min before they
// reach h (protoactor logs every restart and dead letter at Info; the bench's
// progress bar would be interleaved with the node's Info lines).
func LevelFloor(h slog.Handler, min slog.Level) slog.Handler { return levelFloor{h: h, min: min} }

type levelFloor struct {
	h   slog.Handler
	min slog.Level
}

func (l levelFloor) Enabled(ctx context.Context, lv slog.Level) bool {
	return lv >= l.min && l.h.Enabled(ctx, lv)
}
func (l levelFloor) Handle(ctx context.Context, r slog.Record) error { return l.h.Handle(ctx, r) }
func (l levelFloor) WithAttrs(a []slog.Attr) slog.Handler {
	return levelFloor{h: l.h.WithAttrs(a), min: l.min}
}
func (l levelFloor) WithGroup(g string) slog.Handler {
	return levelFloor{h: l.h.WithGroup(g), min: l.min}
}

// RedactURL returns u with any password replaced by "xxxxx", for errors and
// logs; a string that does not parse as a URL is returned with everything
// before its last '@' hidden.
func RedactURL(u string) string {
	if p, err := url.Parse(u); err == nil {
		return p.Redacted()
	}
	if i := strings.LastIndex(u, "@"); i >= 0 {
		return "xxxxx" + u[i:]
	}
	return u
}

// MaxUntrusted is how many bytes of an untrusted string (an id, a pool
// name, a label from a packet) a log line or an error message keeps. Valid
// ids are at most 128 bytes, so a valid one is never cut; an invalid one
// of 400 KB would otherwise be a 400 KB log line.
const MaxUntrusted = 200

// Clip returns s cut to MaxUntrusted bytes (on a rune boundary), with the
// length it had, for logging strings that have not been validated.
func Clip(s string) string {
	if len(s) <= MaxUntrusted {
		return s
	}
	cut := MaxUntrusted
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…(" + strconv.Itoa(len(s)) + " bytes)"
}
