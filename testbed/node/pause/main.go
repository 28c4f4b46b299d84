// The pod sandbox's process for gs-testbed/pause: holds the pod's namespaces open until the
// runtime stops it. Does what Kubernetes' pause.c does, in Go so the testbed's one toolchain
// builds it static (CGO_ENABLED=0): sleeps, exits 0 on SIGINT/SIGTERM, reaps orphans it inherits
// as PID 1 of a shared PID namespace.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child: signals coalesce, so one SIGCHLD may stand for several.
func reap() {
	var status syscall.WaitStatus
	for {
		if pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 || err != nil {
			return
		}
	}
}
