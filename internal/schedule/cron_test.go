package schedule_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/troupe-run/troupe/internal/schedule"
)

func TestScheduleCronParsing(t *testing.T) {
	from := time.Date(2026, 11, 26, 15, 37, 20, 0, time.UTC) // a Thursday
	at := func(s string) time.Time {
		v, err := time.Parse("2006-01-02 15:04", s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		expr string
		next []string // the first ticks after from
	}{
		{"* * * * *", []string{"2026-11-26 15:38", "2026-11-26 15:39"}},
		{"*/15 * * * *", []string{"2026-11-26 15:45", "2026-11-26 16:00", "2026-11-26 16:15"}},
		{"5,10 * * * *", []string{"2026-11-26 16:05", "2026-11-26 16:10", "2026-11-26 17:05"}},
		{"0 9-11 * * *", []string{"2026-11-27 09:00", "2026-11-27 10:00", "2026-11-27 11:00", "2026-11-28 09:00"}},
		{"0 8-18/4 * * *", []string{"2026-11-26 16:00", "2026-11-27 08:00", "2026-11-27 12:00"}},
		{"30 2 1 * *", []string{"2026-12-01 02:30", "2027-01-01 02:30"}},
		{"0 0 * * MON-FRI", []string{"2026-11-27 00:00", "2026-11-30 00:00"}},
		{"0 0 * * 7", []string{"2026-11-29 00:00", "2026-12-06 00:00"}},            // 7 is Sunday
		{"0 0 13 * FRI", []string{"2026-11-27 00:00", "2026-12-04 00:00"}},         // both day fields: either matches
		{"0 12 29 FEB *", []string{"2028-02-29 12:00"}},                            // leap day
		{"40/10 15 * jan,nov *", []string{"2026-11-26 15:40", "2026-11-26 15:50"}}, // a/s and month names
		{"@hourly", []string{"2026-11-26 16:00"}},
		{"@daily", []string{"2026-11-27 00:00"}},
		{"@weekly", []string{"2026-11-29 00:00"}},
		{"@monthly", []string{"2026-12-01 00:00"}},
		{"@yearly", []string{"2027-01-01 00:00"}},
	} {
		cr, err := schedule.ParseCron(c.expr, nil)
		if err != nil {
			t.Errorf("%q: %v", c.expr, err)
			continue
		}
		cur := from
		for i, want := range c.next {
			cur = cr.Next(cur)
			if !cur.Equal(at(want)) {
				t.Errorf("%q: tick %d = %s, want %s", c.expr, i+1, cur.Format("2006-01-02 15:04"), want)
				break
			}
		}
	}
	if cr, _ := schedule.ParseCron("0 0 30 2 *", nil); !cr.Next(from).IsZero() {
		t.Error("30 February: want no tick")
	}
	for _, c := range []struct{ expr, wantErr string }{
		{"", "0 fields, want 5"},
		{"* * * *", "4 fields, want 5"},
		{"* * * * * *", "6 fields, want 5"},
		{"60 * * * *", "minute: 60 out of range 0-59"},
		{"* 24 * * *", "hour: 24 out of range 0-23"},
		{"* * 0 * *", "day-of-month: 0 out of range 1-31"},
		{"* * * 13 *", "month: 13 out of range 1-12"},
		{"* * * * 8", "day-of-week: 8 out of range 0-7"},
		{"*/0 * * * *", `minute: step "0": want a positive number`},
		{"*/x * * * *", `minute: step "x": want a positive number`},
		{"*/61 * * * *", "minute: step 61 larger than the field's range"},
		{"10-5 * * * *", `minute: range "10-5": start after end`},
		{"1,,2 * * * *", "minute: empty item"},
		{"a * * * *", `minute: "a" is not a number`},
		{"* * * FOO *", `month: "FOO" is not a number`},
		{"@often", "unknown macro"},
	} {
		_, err := schedule.ParseCron(c.expr, nil)
		if err == nil || !errors.Is(err, schedule.ErrSpec) || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("%q: err %v, want one containing %q", c.expr, err, c.wantErr)
		}
	}
}

func TestScheduleCronTimezone(t *testing.T) {
	loc, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skip("no tzdata:", err)
	}
	cr, err := schedule.ParseCron("0 9 * * *", loc)
	if err != nil {
		t.Fatal(err)
	}
	got := cr.Next(time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC))
	if want := time.Date(2026, 11, 27, 8, 0, 0, 0, time.UTC); !got.Equal(want) {
		t.Fatalf("09:00 Paris = %s, want %s", got.UTC(), want)
	}
}

func TestScheduleIntervalParsing(t *testing.T) {
	anchor := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	iv, err := schedule.ParseInterval("90s", anchor)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ after, want time.Duration }{
		{-time.Hour, 0}, {0, 90 * time.Second}, {89 * time.Second, 90 * time.Second},
		{90 * time.Second, 180 * time.Second}, {10 * time.Hour, 10*time.Hour + 90*time.Second},
	} {
		if got := iv.Next(anchor.Add(c.after)); !got.Equal(anchor.Add(c.want)) {
			t.Errorf("Next(anchor%+v) = anchor%+v, want anchor%+v", c.after, got.Sub(anchor), c.want)
		}
	}
	for _, bad := range []string{"", "1", "500ms", "-5s", "soon"} {
		if _, err := schedule.ParseInterval(bad, anchor); !errors.Is(err, schedule.ErrSpec) {
			t.Errorf("%q: err %v, want ErrSpec", bad, err)
		}
	}
}

func TestScheduleValidation(t *testing.T) {
	ok := func() schedule.Schedule { return schedule.Schedule{ID: "s-1", Every: "1m", Topic: "job.x"} }
	for _, c := range []struct {
		name    string
		mutate  func(*schedule.Schedule)
		wantErr string
	}{
		{"bad id", func(s *schedule.Schedule) { s.ID = "a b" }, "id"},
		{"reserved id", func(s *schedule.Schedule) { s.ID = "delayed" }, "id"},
		{"both", func(s *schedule.Schedule) { s.Cron = "* * * * *" }, "exactly one of cron and every"},
		{"neither", func(s *schedule.Schedule) { s.Every = "" }, "exactly one of cron and every"},
		{"no topic", func(s *schedule.Schedule) { s.Topic = "" }, "topic is required"},
		{"policy", func(s *schedule.Schedule) { s.Missed = "all" }, "missed"},
		{"catch-up", func(s *schedule.Schedule) { s.Missed, s.CatchUp = schedule.MissedCatchUp, 5000 }, "catch_up"},
		{"grace", func(s *schedule.Schedule) { s.Grace = "0s" }, "grace"},
		{"priority", func(s *schedule.Schedule) { s.Priority = "urgent" }, "priority"},
		{"timezone", func(s *schedule.Schedule) { s.Every, s.Cron, s.Timezone = "", "@daily", "Mars/Olympus" }, "timezone"},
	} {
		s := ok()
		c.mutate(&s)
		if err := s.Validate(); !errors.Is(err, schedule.ErrSpec) || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("%s: %v, want an error naming %q", c.name, err, c.wantErr)
		}
	}
	s := ok()
	s.Missed, s.Priority = schedule.MissedCatchUp, "batch"
	if err := s.Validate(); err != nil || s.CatchUp != 1 {
		t.Fatalf("catch_up with no N: %v, N %d, want 1", err, s.CatchUp)
	}
}
