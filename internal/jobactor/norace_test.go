//go:build !race

package jobactor

const raceEnabled = false
