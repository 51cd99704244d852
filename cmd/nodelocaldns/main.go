// Command nodelocaldns is a node-local DNS cache for Kubernetes: it answers
// pods' DNS on a link-local address from a cache and forwards misses to
// kube-dns (cluster names) or the node's resolvers (everything else).
//
// Exit codes: 0 after a clean shutdown, 1 when starting or running failed,
// 2 for an invalid configuration (one line on stderr says which setting),
// 3 when a second signal forced an immediate exit.
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
	"syscall"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/config"
	"github.com/nodelocaldns/nodelocaldns/internal/daemon"
)

// shutdownGrace bounds draining and teardown after SIGTERM; the DaemonSet's
// terminationGracePeriodSeconds must be longer.
const shutdownGrace = 10 * time.Second

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	cfg, err := config.Parse(args, config.Getenv, io.Discard)
	if errors.Is(err, flag.ErrHelp) {
		_, _ = config.Parse([]string{"-h"}, config.Getenv, stderr)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "nodelocaldns: %v\n", err)
		return 2
	}
	var h slog.Handler = slog.NewTextHandler(stderr, nil)
	if cfg.LogFormat == "json" {
		h = slog.NewJSONHandler(stderr, nil)
	}
	log := slog.New(h)
	if cfg.CheckConfig {
		config.Describe(stdout, cfg)
		return 0
	}
	d, err := daemon.New(cfg, log, daemon.Options{PProf: cfg.PProf})
	if err != nil {
		log.Error("cannot start", "err", err)
		return 1
	}
	ctx, stop := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		s := <-sigs
		log.Info("signal received; shutting down (a second signal exits at once)", "signal", s.String())
		stop()
		<-sigs
		log.Warn("second signal: exiting without teardown")
		os.Exit(3)
	}()
	if err := d.Run(ctx, shutdownGrace); err != nil {
		log.Error("exiting", "err", err)
		return 1
	}
	return 0
}
