// Command nodelocaldns is a node-local DNS cache for Kubernetes: it answers
// pods' DNS on a link-local address from a cache and forwards misses to
// kube-dns (cluster names) or the node's resolvers (everything else).
//
// With -probe ready|health it is instead the exec probe of the instance
// running in the same PID namespace (the same container): it asks that
// instance over its control socket (abstract, of the network namespace;
// -state-dir scopes it) and exits 0 when it is ready (healthy), 1 when not.
//
// Exit codes:
//
//	0  clean shutdown: rules and link removed, or left to a twin that serves
//	   the same addresses (or -skipteardown); a probe that succeeded
//	1  starting failed, or teardown failed (rules may be left); a probe
//	   that failed
//	2  invalid configuration (one line on stderr says which setting)
//	3  a second signal: immediate exit, nothing torn down
//	4  shutdown overran its hard deadline (-lameduck + 12 s) and was cut
//	   short: rules may be left
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/daemon"
	"github.com/nodelocaldns/nodelocaldns/internal/gcfloor"
	"github.com/nodelocaldns/nodelocaldns/internal/panics"
)

// Exit codes (see the package comment).
const (
	exitOK        = 0
	exitFailed    = 1
	exitUsage     = 2
	exitSecondSig = 3
	exitOverran   = 4
)

func main() {
	if os.Getenv("GOGC") == "" {
		gcfloor.Start(gcPercent, gcfloor.DefaultFloor)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// gcPercent is the GOGC the daemon runs with, unless the environment sets
// GOGC (which then wins), once the live heap is large; below that
// internal/gcfloor keeps the heap goal gcfloor.DefaultFloor (16 MiB) above
// the live heap, so a miss storm over a small heap does not run a
// collection every ~100 ms (docs/design.md, "Garbage collection", has the
// p99, CPU and RSS it was chosen by). GOMEMLIMIT still caps every goal.
//
// 50 rather than the default 100: the live heap is bounded
// (-cache-max-bytes) and the hit path allocates nothing; at 100 a full
// cache's garbage would double it in RSS. Measured after 100k unique
// misses, before the floor: 22.9 MiB RSS at 100, 19.9 at 50.
const gcPercent = 50

func run(args []string, stdout, stderr io.Writer) int {
	if isProbe(args) {
		return probe(args, stdout, stderr)
	}
	cfg, err := config.Parse(args, config.Getenv, io.Discard)
	if errors.Is(err, flag.ErrHelp) {
		_, _ = config.Parse([]string{"-h"}, config.Getenv, stderr)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "nodelocaldns: %v\n", err)
		return exitUsage
	}
	if cfg.DropIn.Exit != "" { // -version, -plugins
		fmt.Fprint(stdout, cfg.DropIn.Exit)
		return exitOK
	}
	var h slog.Handler = slog.NewTextHandler(stderr, nil)
	if cfg.LogFormat == "json" {
		h = slog.NewJSONHandler(stderr, nil)
	}
	log := slog.New(h)
	panics.SetLogger(log) // panics recovered while serving (internal/panics)
	if cfg.CheckConfig {
		// Valid only if it can start: every listen address exists or
		// -setupinterface creates it.
		if err := cfg.CheckListen(); err != nil {
			fmt.Fprintf(stderr, "nodelocaldns: %v\n", err)
			return exitUsage
		}
		config.Describe(stdout, cfg)
		return exitOK
	}
	if cfg.Cleanup {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := daemon.Cleanup(ctx, cfg, log); err != nil {
			log.Error("cleanup", "err", err)
			return exitFailed
		}
		return exitOK
	}
	for _, n := range cfg.DropIn.Notes {
		log.Warn("configuration: " + n)
	}
	d, err := daemon.New(cfg, log, daemon.Options{OnReady: pidFileWriter(cfg.DropIn.PidFile, log)})
	if err != nil {
		log.Error("cannot start", "err", err)
		return exitFailed
	}
	// The whole shutdown (lame duck, drain, teardown) is bounded by grace;
	// a watchdog exits past it, so no hang can outlive the pod's grace
	// period with the rules in place and nothing serving.
	grace := cfg.LameDuck + daemon.ShutdownBudget
	ctx, stop := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		s := <-sigs
		log.Info("signal received; shutting down (a second signal exits at once)", "signal", s.String(), "deadline", grace)
		stop()
		time.AfterFunc(grace+daemon.WatchdogLeeway, func() {
			log.Error("shutdown overran its deadline; exiting", "deadline", grace)
			os.Exit(exitOverran)
		})
		<-sigs
		log.Warn("second signal: exiting at once, without teardown")
		os.Exit(exitSecondSig)
	}()
	if err := d.Run(ctx, grace); err != nil {
		log.Error("exiting", "err", err)
		return exitFailed
	}
	log.Info("exited cleanly")
	return exitOK
}

// isProbe reports whether args ask for the exec probe.
func isProbe(args []string) bool {
	for _, a := range args {
		if a == "-probe" || a == "--probe" || strings.HasPrefix(a, "-probe=") || strings.HasPrefix(a, "--probe=") {
			return true
		}
	}
	return false
}

// probe is `nodelocaldns -probe ready|health [-state-dir DIR] [-probe-pid N]`.
func probe(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("nodelocaldns -probe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	what := fs.String("probe", "", "ready or health: ask the instance running in this PID namespace (container) and exit 0 if it is")
	dir := fs.String("state-dir", config.DefaultStateDir, "the instance's -state-dir")
	pid := fs.Int("probe-pid", 0, "the instance's PID, when several run in this PID namespace")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if err := daemon.Probe(*dir, *what, *pid, daemon.ExecProbeTimeout); err != nil {
		fmt.Fprintf(stderr, "nodelocaldns: %s: %v\n", *what, err)
		return exitFailed
	}
	fmt.Fprintln(stdout, "ok")
	return exitOK
}

// pidFileWriter writes -pidfile once serving, as CoreDNS does (node-cache's
// wrapper waits for it before installing its rules); nil without -pidfile.
func pidFileWriter(path string, log *slog.Logger) func() {
	if path == "" {
		return nil
	}
	return func() {
		if err := os.WriteFile(path, []byte(fmt.Sprintf("%d\n", os.Getpid())), 0o644); err != nil {
			log.Error("cannot write -pidfile", "file", path, "err", err)
		}
	}
}
