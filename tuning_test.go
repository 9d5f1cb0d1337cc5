package troupe_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/troupe-run/troupe"
)

// DefaultTuning gives every knob its default; only the knobs whose default
// is "none" or "off" are zero.
func TestDefaultTuningSetsEveryKnob(t *testing.T) {
	zeroByDefault := map[string]bool{"TimeoutsFile": true, "DLQRetention": true, "TenantLimits": true,
		"NoRedispatchTopics": true, "NoSagas": true, "NoProcessedGuard": true, "JobTrace": true}
	v := reflect.ValueOf(troupe.DefaultTuning())
	for i := 0; i < v.NumField(); i++ {
		name := v.Type().Field(i).Name
		if zero := v.Field(i).IsZero(); zero != zeroByDefault[name] {
			t.Errorf("DefaultTuning().%s = %v: zero %v, want zero %v", name, v.Field(i).Interface(), zero, zeroByDefault[name])
		}
	}
}

// NewNode fills the zero fields of Config.Tuning from DefaultTuning and
// keeps the others, negative ("never") ones included.
func TestNewNodeFillsZeroTuningFromTheDefaults(t *testing.T) {
	node, err := troupe.NewNode(troupe.Config{NodeID: "tuned", Logger: quietLogger(),
		Tuning: troupe.Tuning{ParkAfter: -1, LockTTL: 9 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	got, want := node.TuningInUse(), troupe.DefaultTuning()
	want.ParkAfter, want.LockTTL = -1, 9*time.Second
	if !reflect.DeepEqual(got, want) {
		t.Errorf("tuning in use\n%+v\nwant\n%+v", got, want)
	}
}
