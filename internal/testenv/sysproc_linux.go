package testenv

import "syscall"

// sysProcAttr makes the child die with the test binary and, when as is set,
// run as that user. Go sets Pdeathsig after changing credentials, because a
// credential change clears it.
func sysProcAttr(as *runAs) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if as != nil {
		attr.Credential = &syscall.Credential{Uid: uint32(as.uid), Gid: uint32(as.gid)}
	}
	return attr
}
