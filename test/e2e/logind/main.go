// Command logind is systemd-logind's part in the kubelet's graceful node
// shutdown, on the e2e node, which runs no systemd (test/e2e/node.sh starts
// it beside a dbus-daemon of the node's own): the three things the kubelet
// asks of logind over the system bus (pkg/kubelet/nodeshutdown/systemd),
// and nothing else.
//
//   - the property InhibitDelayMaxUSec of org.freedesktop.login1.Manager:
//     the longest a delay lock may hold a shutdown (-delay), so the
//     kubelet's shutdownGracePeriod fits and it never rewrites logind.conf;
//   - the method Inhibit(what, who, why, mode): a delay lock, the write end
//     of a pipe, which the kubelet closes once its pods are down; its
//     release is logged ("inhibitor released");
//   - the signal PrepareForShutdown(bool): true on SIGUSR1 (a shutdown
//     begins: the kubelet stops the node's pods, critical ones last), false
//     on SIGUSR2 (it was cancelled: the kubelet takes a lock again and
//     admits pods).
//
// It writes its PID to -pidfile once it owns org.freedesktop.login1, and
// exits on SIGTERM.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/prop"
)

const (
	name  = "org.freedesktop.login1"
	path  = dbus.ObjectPath("/org/freedesktop/login1")
	iface = "org.freedesktop.login1.Manager"
)

// manager is org.freedesktop.login1.Manager's Inhibit.
type manager struct{ locks atomic.Int64 }

// Inhibit hands out a delay lock: the write end of a pipe, whose read end
// sees EOF once every holder closed its copy.
func (m *manager) Inhibit(what, who, why, mode string) (dbus.UnixFD, *dbus.Error) {
	r, w, err := os.Pipe()
	if err != nil {
		return 0, dbus.MakeFailedError(err)
	}
	n := m.locks.Add(1)
	log.Printf("inhibitor %d taken: what=%s who=%s mode=%s why=%q", n, what, who, mode, why)
	go func() {
		// The reply carries a duplicate of w; ours goes once it is sent.
		time.Sleep(time.Second)
		_ = w.Close()
		_, _ = io.Copy(io.Discard, r)
		_ = r.Close()
		log.Printf("inhibitor %d released by %s", n, who)
	}()
	return dbus.UnixFD(w.Fd()), nil
}

func main() {
	pidfile := flag.String("pidfile", "", "write the PID here once the name is owned")
	delay := flag.Duration("delay", 5*time.Minute, "InhibitDelayMaxUSec: the longest a delay lock holds a shutdown")
	flag.Parse()
	log.SetFlags(log.Ltime | log.Lmicroseconds)
	conn, err := dbus.ConnectSystemBus()
	if err != nil {
		log.Fatalf("system bus: %v", err)
	}
	m := &manager{}
	if err := conn.Export(m, path, iface); err != nil {
		log.Fatal(err)
	}
	if _, err := prop.Export(conn, path, prop.Map{iface: {
		"InhibitDelayMaxUSec": {Value: uint64(delay.Microseconds()), Emit: prop.EmitFalse},
	}}); err != nil {
		log.Fatal(err)
	}
	reply, err := conn.RequestName(name, dbus.NameFlagDoNotQueue)
	if err != nil || reply != dbus.RequestNameReplyPrimaryOwner {
		log.Fatalf("cannot own %s: %v (reply %d)", name, err, reply)
	}
	if *pidfile != "" {
		if err := os.WriteFile(*pidfile, []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	log.Printf("owning %s; InhibitDelayMaxUSec %v", name, *delay)
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGTERM, syscall.SIGINT)
	for s := range sigs {
		switch s {
		case syscall.SIGUSR1, syscall.SIGUSR2:
			active := s == syscall.SIGUSR1
			if err := conn.Emit(path, iface+".PrepareForShutdown", active); err != nil {
				log.Printf("PrepareForShutdown(%v): %v", active, err)
				continue
			}
			log.Printf("PrepareForShutdown(%v) sent", active)
		default:
			log.Printf("%v: exiting", s)
			return
		}
	}
}
