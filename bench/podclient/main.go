// Command podclient is the autopath bench's pod: run in a network
// namespace whose resolv.conf is a pod's (ndots:5, the kubelet's search
// list), it resolves external names with Go's own resolver (build it with
// CGO_ENABLED=0 and run it with GODEBUG=netdns=go), which walks the search
// list exactly as a pod's stub resolver does: A and AAAA of each candidate,
// in order, until one has addresses. It prints the lookups done and failed.
//
//	podclient -names 200 -duration 5s -rate 500 -domain example.com
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	names := flag.Int("names", 200, "distinct external names api-N.<domain>, asked in turn")
	domain := flag.String("domain", "example.com", "the names' domain")
	duration := flag.Duration("duration", 5*time.Second, "how long to run")
	rate := flag.Int("rate", 500, "lookups started per second")
	workers := flag.Int("workers", 16, "lookups at once at most")
	flag.Parse()
	if *names < 1 || *rate < 1 || *workers < 1 {
		fmt.Fprintln(os.Stderr, "podclient: -names, -rate and -workers must be positive")
		os.Exit(2)
	}
	var done, failed atomic.Int64
	sem := make(chan struct{}, *workers)
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(*rate))
	defer tick.Stop()
	end := time.Now().Add(*duration)
	for i := 0; time.Now().Before(end); i++ {
		<-tick.C
		sem <- struct{}{}
		wg.Add(1)
		go func(name string) {
			defer func() { <-sem; wg.Done() }()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := net.DefaultResolver.LookupIP(ctx, "ip", name); err != nil {
				failed.Add(1)
			}
			done.Add(1)
		}(fmt.Sprintf("api-%d.%s", i%*names, *domain))
	}
	wg.Wait()
	fmt.Printf("lookups %d failed %d\n", done.Load(), failed.Load())
}
