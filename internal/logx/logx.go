// Package logx holds the small slog helpers the node and the bench share.
package logx

import (
	"context"
	"log/slog"
	"net/url"
	"strings"
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
