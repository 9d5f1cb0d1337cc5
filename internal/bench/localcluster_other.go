//go:build !linux

package bench

import "os/exec"

// dieWithParent: only Linux has a parent-death signal; elsewhere the
// servers are stopped by LocalCluster.Stop alone.
func dieWithParent(*exec.Cmd) {}
