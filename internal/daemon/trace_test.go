package daemon

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// A Corefile edit of trace under load: the queries go on being answered
// (and traced) while the block tables are swapped, the new service is
// sent once the edit applies, and nothing races (run with -race).
func TestTraceReloadUnderLoad(t *testing.T) {
	corp := startUpstream(t, answerA("10.0.0.1"))
	var mu sync.Mutex
	services := map[string]int{}
	col := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var spans []struct {
			ParentID      string `json:"parentId"`
			LocalEndpoint struct {
				ServiceName string `json:"serviceName"`
			} `json:"localEndpoint"`
		}
		if err := json.NewDecoder(r.Body).Decode(&spans); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, s := range spans {
			if s.ParentID == "" {
				services[s.LocalEndpoint.ServiceName]++
			}
		}
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	defer col.Close()
	corefile := func(service string) string {
		return fmt.Sprintf("corp.example:53 {\n  bind 127.0.0.1\n  cache 30\n  trace %s/api/v2/spans {\n    service %s\n    every 2\n    zipkin_max_batch_interval 20ms\n  }\n  forward . %s\n}\n.:53 {\n  bind 127.0.0.1\n  cache 30\n  forward . /etc/resolv.conf\n}\n", col.URL, service, corp.addr)
	}
	conf := filepath.Join(t.TempDir(), "Corefile")
	e := startCorefile(t, conf, corefile("one"))
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; !stop.Load(); i++ {
				m := e.ask(t, fmt.Sprintf("n%d-%d.corp.example.", w, i%50), dns.TypeA, false, "udp")
				if m.Rcode != dns.RcodeSuccess {
					t.Errorf("rcode %d", m.Rcode)
					return
				}
			}
		}()
	}
	count := func(s string) int {
		mu.Lock()
		defer mu.Unlock()
		return services[s]
	}
	// The first configuration's spans reach the collector before any edit
	// (waiting for them: the exporter posts every 20 ms, and a reload
	// right after the start could come before its first batch).
	deadline := time.Now().Add(5 * time.Second)
	for count("one") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("nothing traced 5 s after the start, before the edits")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, svc := range []string{"two", "three"} {
		writeAtomic(t, conf, corefile(svc))
		deadline := time.Now().Add(5 * time.Second)
		for count(svc) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("service %s not traced 5 s after the edit", svc)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	stop.Store(true)
	wg.Wait()
}
