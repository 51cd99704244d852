// Command pause is the e2e cluster's pod sandbox: it holds the pod's
// namespaces and exits on SIGTERM or SIGINT. Built static, it is the whole
// of the localhost/pause image (test/e2e/images.sh), so the cluster needs no
// registry.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
}
