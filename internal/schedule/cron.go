package schedule

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// Spec says when a schedule ticks: Next returns the first tick strictly
// after t (the zero time when there is none within cronHorizon).
type Spec interface {
	Next(t time.Time) time.Time
}

// ErrSpec is wrapped by every parse error of a cron expression or interval.
var ErrSpec = errors.New("schedule")

// Cron is a parsed five-field cron expression: minute hour day-of-month
// month day-of-week, evaluated in Loc (UTC when nil).
//
// Each field is "*", a value, a range "a-b", a step "*/s", "a-b/s" or "a/s"
// (a to the field's maximum), or a comma list of those. Months and days of
// the week take names too (JAN..DEC, SUN..SAT); day-of-week 7 is Sunday.
// When both day fields are restricted, a day matching either runs (as in
// Vixie cron). Macros: @yearly (@annually), @monthly, @weekly, @daily
// (@midnight), @hourly.
type Cron struct {
	expr                   string
	minute, hour, dom, mon uint64
	dow                    uint64
	domStar, dowStar       bool
	Loc                    *time.Location
}

// cronHorizon bounds Next's search: an expression that matches no date
// within it (e.g. "0 0 30 2 *") never ticks.
const cronHorizon = 5 * 366 * 24 * time.Hour

type field struct {
	name     string
	min, max int
	names    []string // names[i] is the value min+i
}

var (
	fMinute = field{name: "minute", min: 0, max: 59}
	fHour   = field{name: "hour", min: 0, max: 23}
	fDom    = field{name: "day-of-month", min: 1, max: 31}
	fMonth  = field{name: "month", min: 1, max: 12,
		names: []string{"JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"}}
	fDow = field{name: "day-of-week", min: 0, max: 7,
		names: []string{"SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"}}
)

var macros = map[string]string{
	"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
	"@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *",
}

// ParseCron parses a cron expression (see Cron) evaluated in loc (UTC when
// nil).
func ParseCron(expr string, loc *time.Location) (*Cron, error) {
	if loc == nil {
		loc = time.UTC
	}
	src := strings.TrimSpace(expr)
	if strings.HasPrefix(src, "@") {
		m, ok := macros[strings.ToLower(src)]
		if !ok {
			return nil, fmt.Errorf("%w: cron %q: unknown macro (want @yearly, @monthly, @weekly, @daily, @hourly)", ErrSpec, expr)
		}
		src = m
	}
	parts := strings.Fields(src)
	if len(parts) != 5 {
		return nil, fmt.Errorf("%w: cron %q: %d fields, want 5 (minute hour day-of-month month day-of-week)", ErrSpec, expr, len(parts))
	}
	c := &Cron{expr: strings.TrimSpace(expr), Loc: loc}
	var err error
	for i, f := range []struct {
		def  field
		into *uint64
	}{{fMinute, &c.minute}, {fHour, &c.hour}, {fDom, &c.dom}, {fMonth, &c.mon}, {fDow, &c.dow}} {
		if *f.into, err = parseField(parts[i], f.def); err != nil {
			return nil, fmt.Errorf("%w: cron %q: %v", ErrSpec, expr, err)
		}
	}
	if c.dow&(1<<7) != 0 { // 7 is Sunday
		c.dow = c.dow&^(1<<7) | 1
	}
	// As in Vixie cron, a day field starting with "*" leaves the choice of
	// day to the other one.
	c.domStar, c.dowStar = strings.HasPrefix(parts[2], "*"), strings.HasPrefix(parts[4], "*")
	return c, nil
}

// String returns the expression as given.
func (c *Cron) String() string { return c.expr }

func parseField(s string, f field) (uint64, error) {
	var set uint64
	for _, item := range strings.Split(s, ",") {
		if item == "" {
			return 0, fmt.Errorf("%s: empty item in %q", f.name, s)
		}
		rng, stepStr, hasStep := strings.Cut(item, "/")
		step := 1
		if hasStep {
			n, err := strconv.Atoi(stepStr)
			if err != nil || n <= 0 {
				return 0, fmt.Errorf("%s: step %q: want a positive number", f.name, stepStr)
			}
			if n > f.max-f.min+1 {
				return 0, fmt.Errorf("%s: step %d larger than the field's range %d-%d", f.name, n, f.min, f.max)
			}
			step = n
		}
		lo, hi := f.min, f.max
		switch {
		case rng == "*":
		case strings.Contains(rng, "-"):
			a, b, _ := strings.Cut(rng, "-")
			var err error
			if lo, err = f.value(a); err != nil {
				return 0, err
			}
			if hi, err = f.value(b); err != nil {
				return 0, err
			}
			if lo > hi {
				return 0, fmt.Errorf("%s: range %q: start after end", f.name, rng)
			}
		default:
			v, err := f.value(rng)
			if err != nil {
				return 0, err
			}
			lo = v
			if !hasStep {
				hi = v
			}
		}
		for v := lo; v <= hi; v += step {
			set |= 1 << uint(v)
		}
	}
	return set, nil
}

func (f field) value(s string) (int, error) {
	for i, n := range f.names {
		if strings.EqualFold(s, n) {
			return f.min + i, nil
		}
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%s: %q is not a number", f.name, s)
	}
	if v < f.min || v > f.max {
		return 0, fmt.Errorf("%s: %d out of range %d-%d", f.name, v, f.min, f.max)
	}
	return v, nil
}

func has(set uint64, v int) bool { return set&(1<<uint(v)) != 0 }

func (c *Cron) dayMatches(t time.Time) bool {
	d, w := has(c.dom, t.Day()), has(c.dow, int(t.Weekday()))
	if c.domStar || c.dowStar {
		return d && w
	}
	return d || w
}

// Next returns the first minute strictly after t that the expression
// matches, in c.Loc; the zero time when none lies within cronHorizon.
func (c *Cron) Next(t time.Time) time.Time {
	t = t.In(c.Loc).Truncate(time.Minute).Add(time.Minute)
	end := t.Add(cronHorizon)
	for t.Before(end) {
		switch {
		case !has(c.mon, int(t.Month())):
			t = time.Date(t.Year(), t.Month()+1, 1, 0, 0, 0, 0, c.Loc)
		case !c.dayMatches(t):
			t = time.Date(t.Year(), t.Month(), t.Day()+1, 0, 0, 0, 0, c.Loc)
		case !has(c.hour, t.Hour()):
			t = time.Date(t.Year(), t.Month(), t.Day(), t.Hour()+1, 0, 0, 0, c.Loc)
		case !has(c.minute, t.Minute()):
			// Jump to the next matching minute of this hour, or the next hour.
			rest := c.minute >> uint(t.Minute()+1)
			if rest == 0 {
				t = time.Date(t.Year(), t.Month(), t.Day(), t.Hour()+1, 0, 0, 0, c.Loc)
			} else {
				t = t.Add(time.Duration(bits.TrailingZeros64(rest)+1) * time.Minute)
			}
		default:
			return t
		}
	}
	return time.Time{}
}

// Interval ticks every Every from Anchor: Anchor + k·Every.
type Interval struct {
	Every  time.Duration
	Anchor time.Time
}

// MinInterval is the shortest interval a schedule may have.
const MinInterval = time.Second

// ParseInterval parses a Go duration ("30s", "1h30m") of at least
// MinInterval.
func ParseInterval(s string, anchor time.Time) (*Interval, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("%w: interval %q: %v", ErrSpec, s, err)
	}
	if d < MinInterval {
		return nil, fmt.Errorf("%w: interval %q: at least %s", ErrSpec, s, MinInterval)
	}
	return &Interval{Every: d, Anchor: anchor}, nil
}

// Next returns the first Anchor + k·Every strictly after t.
func (iv *Interval) Next(t time.Time) time.Time {
	if t.Before(iv.Anchor) {
		return iv.Anchor
	}
	k := t.Sub(iv.Anchor)/iv.Every + 1
	return iv.Anchor.Add(k * iv.Every)
}
