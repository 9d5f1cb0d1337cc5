package bench

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel kill cmd when the bench process dies, so a
// local cluster never outlives a bench killed before its Stop.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
