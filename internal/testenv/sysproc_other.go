//go:build !linux

package testenv

import "syscall"

// sysProcAttr: without Pdeathsig, children outlive a crashed test binary, and
// running servers as another user is only supported on Linux.
func sysProcAttr(*runAs) *syscall.SysProcAttr {
	return nil
}
