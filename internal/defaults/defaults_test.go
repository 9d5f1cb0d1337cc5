package defaults

import (
	"testing"
	"time"
)

func TestFillSetsOnlyZeroFields(t *testing.T) {
	type inner struct{ A, B int }
	type knobs struct {
		Every time.Duration
		Off   time.Duration
		Max   int
		Names []string
		In    inner
	}
	v := knobs{Off: -1, In: inner{B: 2}}
	Fill(&v, knobs{Every: time.Second, Off: time.Minute, Max: 7, Names: []string{"x"}, In: inner{A: 1}})
	if v.Every != time.Second || v.Off != -1 || v.Max != 7 || len(v.Names) != 1 || v.In != (inner{B: 2}) {
		t.Fatalf("filled %+v", v)
	}
}
