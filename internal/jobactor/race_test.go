//go:build race

package jobactor

// raceEnabled: the race detector is on; sync.Pool drops what it is given at
// random under it, so allocation counts are not asserted.
const raceEnabled = true
