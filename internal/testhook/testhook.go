// Package testhook reaches the settings of package troupe that are for the
// module's own tests only (the root package's tests use export_test.go;
// tests in other packages, such as faults, use this).
package testhook

import "time"

// SetBackoff sets the scheduling retry delay (nil: the default) of the node
// that the *troupe.Config cfg builds. Package troupe sets it at init.
var SetBackoff func(cfg any, backoff func(attempt int) time.Duration)
