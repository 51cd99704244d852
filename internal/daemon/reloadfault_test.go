package daemon

import (
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// reloadsFailed reads coredns_reload_failed_total.
func (e *env) reloadsFailed(t *testing.T) float64 {
	t.Helper()
	mfs, err := e.d.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "coredns_reload_failed_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	return 0
}

// A Corefile edit whose rebuild fails half-way (its views, cache policies
// and directive chains built, its groups not) is not applied at all: the
// old cache policy and the old upstream keep serving new names, the
// failure is counted once, and the next good edit is applied whole.
func TestCorefileRebuildFailingHalfWayKeepsTheOldConfiguration(t *testing.T) {
	a := startUpstream(t, answerA("10.0.0.1"))
	b := startUpstream(t, answerA("10.0.0.2"))
	conf := filepath.Join(t.TempDir(), "Corefile")
	e := startCorefile(t, conf, cacheCorefile(a, "10"))
	answer := func(name string) (string, uint32) {
		m := e.ask(t, name, dns.TypeA, false, "udp")
		if len(m.Answer) == 0 {
			t.Fatalf("%s: no answer: %v", name, m)
		}
		return m.Answer[0].(*dns.A).A.String(), m.Answer[0].Header().Ttl
	}
	if ip, ttl := answer("a.corp.example."); ip != "10.0.0.1" || ttl != 10 {
		t.Fatalf("before: %s TTL %d", ip, ttl)
	}
	errs, failed := e.setupErrors(t), e.reloadsFailed(t)

	fault := func() error { return errors.New("injected: the rebuild fails half-way") }
	e.d.run.SetReloadFaultForTest(fault)
	writeAtomic(t, conf, cacheCorefile(b, "20")) // a new policy and a new upstream
	e.waitSetupErrors(t, errs+1)
	for i := range 5 {
		if ip, ttl := answer(fmt.Sprintf("f%d.corp.example.", i)); ip != "10.0.0.1" || ttl != 10 {
			t.Fatalf("after the failed edit: %s TTL %d, want the old configuration's 10.0.0.1 TTL 10", ip, ttl)
		}
		time.Sleep(100 * time.Millisecond) // a watch poll or two
	}
	if got := e.reloadsFailed(t); got != failed+1 {
		t.Fatalf("coredns_reload_failed_total %v, want %v", got, failed+1)
	}

	e.d.run.SetReloadFaultForTest(nil)
	writeAtomic(t, conf, cacheCorefile(b, "20")+"# the next edit\n")
	deadline := time.Now().Add(3 * time.Second)
	for i := 0; ; i++ {
		ip, ttl := answer(fmt.Sprintf("g%d.corp.example.", i))
		if ip == "10.0.0.2" && ttl == 20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the next good edit was not applied within 3 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := e.setupErrors(t); got != errs+1 {
		t.Fatalf("setup errors %d, want %d", got, errs+1)
	}
}
