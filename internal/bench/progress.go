package bench

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// progress draws one updating line: a bar of terminal jobs and the counts
// behind it. Nothing is drawn when w is nil.
type progress struct {
	w     io.Writer
	n     int
	start time.Time
	last  time.Time
	drawn bool
}

// progressEvery limits redraws: a terminal does not need more, and each
// redraw costs the harness CPU it shares with the node.
const progressEvery = 200 * time.Millisecond

// progressWidth is the bar's width in characters.
const progressWidth = 30

func (p *progress) update(label string, submitted, received, terminal int64, force bool) {
	if p.w == nil {
		return
	}
	now := time.Now()
	if !force && now.Sub(p.last) < progressEvery {
		return
	}
	p.last = now
	if p.start.IsZero() {
		p.start = now
	}
	frac := float64(terminal) / float64(max(p.n, 1))
	fill := int(frac * progressWidth)
	fill = max(0, min(fill, progressWidth))
	el := now.Sub(p.start).Seconds()
	rate := 0.0
	if el > 0 {
		rate = float64(terminal) / el
	}
	fmt.Fprintf(p.w, "\r%-6s [%s%s] %3.0f%%  terminal %d/%d  submitted %d  dispatched %d  %.0f jobs/s  %.1fs ",
		label, strings.Repeat("#", fill), strings.Repeat(".", progressWidth-fill), frac*100,
		terminal, p.n, submitted, received, rate, el)
	p.drawn = true
}

// finish ends the line so the report starts on a fresh one.
func (p *progress) finish() {
	if p.w != nil && p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}

// IsTerminal reports whether f is a character device (a terminal), where a
// \r-updated line makes sense.
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
