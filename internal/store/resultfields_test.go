package store_test

import (
	"testing"

	"github.com/troupe-run/troupe/internal/store"
)

// A finish that left out "execution_ms" (none reported) and "worker" (the
// dispatch's, already in the record) reads as the finish that wrote them:
// "0", and the dispatch's worker; a record without a result gets neither.
func TestRecordWithoutResultTimeReadsZero(t *testing.T) {
	f := map[string]string{"s": "SUCCEEDED", "worker": "w1", "result_ptr": "p"}
	store.ExpandRecord(f)
	if f["execution_ms"] != "0" || f["worker"] != "w1" {
		t.Errorf("expanded %v, want execution_ms 0 and worker w1", f)
	}
	f = map[string]string{"s": "SUCCEEDED", "result_ptr": "p", "execution_ms": "12"}
	store.ExpandRecord(f)
	if w, ok := f["worker"]; f["execution_ms"] != "12" || !ok || w != "" {
		t.Errorf("expanded %v, want execution_ms 12 and worker empty", f)
	}
	f = map[string]string{"s": "CANCELLED"}
	store.ExpandRecord(f)
	if _, ok := f["execution_ms"]; ok {
		t.Errorf("a record without a result got execution_ms: %v", f)
	}
}
