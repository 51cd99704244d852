package endpoints

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/nodelocaldns/nodelocaldns/test/apiserver"

	"github.com/nodelocaldns/nodelocaldns/internal/kubewatch"
)

// ep is one endpoint of a test slice.
type ep struct {
	ip                 string
	ready, terminating bool
	readyUnknown       bool // conditions.ready left out
}

// slice is an EndpointSlice of service as the EndpointSlice controller writes it: ports dns
// (UDP), dns-tcp (TCP) and metrics (TCP).
func slice(name, service, family string, tcpPort int, eps ...ep) map[string]any {
	var list []any
	for _, e := range eps {
		cond := map[string]any{"terminating": e.terminating, "serving": e.ready || e.terminating}
		if !e.readyUnknown {
			cond["ready"] = e.ready
		}
		list = append(list, map[string]any{"addresses": []string{e.ip}, "conditions": cond,
			"nodeName": "node1", "targetRef": map[string]any{"kind": "Pod", "name": "coredns-" + e.ip, "namespace": "kube-system"}})
	}
	return map[string]any{
		"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
		"metadata": map[string]any{"name": name, "namespace": "kube-system",
			"labels": map[string]any{discoveryv1.LabelServiceName: service}},
		"addressType": family,
		"ports": []any{
			map[string]any{"name": "dns", "port": 53, "protocol": "UDP"},
			map[string]any{"name": "dns-tcp", "port": tcpPort, "protocol": "TCP"},
			map[string]any{"name": "metrics", "port": 9153, "protocol": "TCP"},
		},
		"endpoints": list,
	}
}

const slicesPath = "/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices"

func putSlice(t *testing.T, s *apiserver.Server, body map[string]any) {
	t.Helper()
	name := body["metadata"].(map[string]any)["name"].(string)
	var cur struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := s.Do(http.MethodGet, slicesPath+"/"+name, nil, &cur); err == nil {
		body["metadata"].(map[string]any)["resourceVersion"] = cur.Metadata.ResourceVersion
		s.MustDo(http.MethodPut, slicesPath+"/"+name, body, nil)
		return
	}
	s.MustDo(http.MethodPost, slicesPath, body, nil)
}

// changes records what OnChange was given.
type changes struct {
	mu  sync.Mutex
	all [][]netip.AddrPort
}

func (c *changes) add(eps []netip.AddrPort) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.all = append(c.all, eps)
}

func (c *changes) last() []netip.AddrPort {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.all) == 0 {
		return nil
	}
	return c.all[len(c.all)-1]
}

func (c *changes) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.all)
}

func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func aps(s ...string) []netip.AddrPort {
	var out []netip.AddrPort
	for _, x := range s {
		out = append(out, netip.MustParseAddrPort(x))
	}
	return out
}

// lockedBuffer is a log sink tests read while the watch writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// followWithin: how fast the endpoints in use follow a slice change.
const followWithin = 2 * time.Second

// TestWatchFollowsTheSlices: with the manifest's RBAC, the watch follows kube-dns-upstream's
// slices through a real kube-apiserver: ready endpoints in use on the dns-tcp port, a
// not-ready or terminating one out at once, one added in, a deleted slice's gone; other
// Services' slices and the other family ignored; an API server outage keeps the last known
// endpoints, and the watch catches up when it is back.
func TestWatchFollowsTheSlices(t *testing.T) {
	s := apiserver.Start(t)
	s.ApplyManifest(t, "../../deploy/daemonset.yaml", "ServiceAccount", "Role", "RoleBinding")
	token := s.ServiceAccountToken("kube-system", "nodelocaldns")

	putSlice(t, s, slice("up-a", "kube-dns-upstream", "IPv4", 5353,
		ep{ip: "10.244.0.2", ready: true}, ep{ip: "10.244.0.3", readyUnknown: true}, ep{ip: "10.244.0.4"}))
	putSlice(t, s, slice("other", "kube-dns", "IPv4", 53, ep{ip: "10.244.9.9", ready: true}))
	putSlice(t, s, slice("up-v6", "kube-dns-upstream", "IPv6", 53, ep{ip: "fd00::2", ready: true}))

	var ch changes
	logs := &lockedBuffer{}
	w, err := New(Config{Rest: s.Config(token), Namespace: "kube-system", Service: "kube-dns-upstream",
		ServicePort: 53, Node: "node1", OnChange: ch.add, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	want := aps("10.244.0.2:5353", "10.244.0.3:5353")
	eventually(t, 30*time.Second, "the first list", func() bool { return slices.Equal(ch.last(), want) })
	if w.State() != kubewatch.Synced {
		t.Fatalf("state %v after the first list", w.State())
	}
	if v := w.View(); v.NotReady != 1 {
		t.Errorf("view %+v: want 1 not ready", v)
	}

	step := func(what string, body map[string]any, want ...string) {
		t.Helper()
		start := time.Now()
		if body != nil {
			putSlice(t, s, body)
		}
		eventually(t, followWithin, what, func() bool { return slices.Equal(ch.last(), aps(want...)) })
		t.Logf("%s: followed in %v", what, time.Since(start).Round(time.Millisecond))
	}
	step("one terminating", slice("up-a", "kube-dns-upstream", "IPv4", 5353,
		ep{ip: "10.244.0.2", ready: true}, ep{ip: "10.244.0.3", terminating: true}, ep{ip: "10.244.0.4"}),
		"10.244.0.2:5353")
	step("scale-up in a second slice", slice("up-b", "kube-dns-upstream", "IPv4", 5353,
		ep{ip: "10.244.1.5", ready: true}), "10.244.0.2:5353", "10.244.1.5:5353")
	step("one turns ready", slice("up-a", "kube-dns-upstream", "IPv4", 5353,
		ep{ip: "10.244.0.2", ready: true}, ep{ip: "10.244.0.4", ready: true}),
		"10.244.0.2:5353", "10.244.0.4:5353", "10.244.1.5:5353")
	start := time.Now()
	s.MustDo(http.MethodDelete, slicesPath+"/up-b", nil, nil)
	eventually(t, followWithin, "a slice deleted", func() bool {
		return slices.Equal(ch.last(), aps("10.244.0.2:5353", "10.244.0.4:5353"))
	})
	t.Logf("a slice deleted: followed in %v", time.Since(start).Round(time.Millisecond))

	// The API server goes away: the endpoints stay; back, the watch catches up.
	n := ch.count()
	s.Stop()
	eventually(t, 30*time.Second, "the watch lost", func() bool { return w.State() == kubewatch.Lost })
	if got := ch.count(); got != n {
		t.Errorf("the endpoints changed %d times while the API server was down", got-n)
	}
	if v := w.View(); len(v.InUse) != 2 {
		t.Errorf("view while lost: %+v", v)
	}
	s.Restart()
	putSlice(t, s, slice("up-a", "kube-dns-upstream", "IPv4", 5353, ep{ip: "10.244.0.2", ready: true}))
	eventually(t, 60*time.Second, "caught up after the outage", func() bool {
		return w.State() == kubewatch.Synced && slices.Equal(ch.last(), aps("10.244.0.2:5353"))
	})
	if strings.Contains(logs.String(), "forbids") {
		t.Errorf("the manifest's RBAC was refused:\n%s", logs.String())
	}
}

// TestWatchForbidden: a token without the Role (a cluster whose RBAC predates it) stops the
// watch at once with one log line; nothing is handed to OnChange.
func TestWatchForbidden(t *testing.T) {
	s := apiserver.Start(t)
	s.CreateNamespace("plain")
	token := s.ServiceAccountToken("plain", "default")
	var ch changes
	logs := &lockedBuffer{}
	w, err := New(Config{Rest: s.Config(token), Namespace: "kube-system", Service: "kube-dns-upstream",
		ServicePort: 53, OnChange: ch.add, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); w.Run(context.Background()) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the watch did not stop when forbidden")
	}
	if w.State() != kubewatch.Forbidden {
		t.Errorf("state %v, want forbidden", w.State())
	}
	if got := strings.Count(logs.String(), "forbids"); got != 1 {
		t.Errorf("%d log lines about it, want 1:\n%s", got, logs.String())
	}
	if ch.count() != 0 {
		t.Errorf("OnChange called: %v", ch.last())
	}
}

// TestComputeChoosesPerNode: beyond Max, each node keeps a stable subset of its own and the
// nodes together use every endpoint about evenly; an endpoint added moves at most one place.
func TestComputeChoosesPerNode(t *testing.T) {
	var eps []ep
	for i := range 40 {
		eps = append(eps, ep{ip: fmt.Sprintf("10.0.%d.%d", i/200, 2+i%200), ready: true})
	}
	ss := func(eps []ep) map[string]*discoveryv1.EndpointSlice {
		tcp, name := "TCP", "dns-tcp"
		port := int32(53)
		s := &discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{{Name: &name, Protocol: &[]corev1.Protocol{corev1.Protocol(tcp)}[0], Port: &port}}}
		for _, e := range eps {
			r := e.ready
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.ip},
				Conditions: discoveryv1.EndpointConditions{Ready: &r}})
		}
		return map[string]*discoveryv1.EndpointSlice{"a": s}
	}
	use := map[netip.AddrPort]int{}
	const nodes = 1000
	for n := range nodes {
		cfg := Config{Node: fmt.Sprintf("node-%d", n), Max: 8, ServicePort: 53}
		v := compute(ss(eps), &cfg)
		if len(v.InUse) != 8 || v.OverMax != 32 {
			t.Fatalf("view %+v", v)
		}
		for _, a := range v.InUse {
			use[a]++
		}
		again := compute(ss(append(slices.Clone(eps), ep{ip: "10.0.9.9", ready: true})), &cfg)
		kept := 0
		for _, a := range again.InUse {
			if slices.Contains(v.InUse, a) {
				kept++
			}
		}
		if kept < 7 {
			t.Fatalf("one endpoint added moved %d of node %d's endpoints", 8-kept, n)
		}
	}
	want := nodes * 8 / 40
	for a, c := range use {
		if c < want/2 || c > want*3/2 {
			t.Errorf("%s used by %d nodes, want about %d", a, c, want)
		}
	}
	if len(use) != 40 {
		t.Errorf("%d of 40 endpoints used by some node", len(use))
	}
}

// TestSlicePort: the dns-tcp port, else the only TCP port, else the Service's port; none.
func TestSlicePort(t *testing.T) {
	p := func(name, proto string, n int32) discoveryv1.EndpointPort {
		out := discoveryv1.EndpointPort{Port: &n}
		if name != "" {
			out.Name = &name
		}
		if proto != "" {
			pr := corev1.Protocol(proto)
			out.Protocol = &pr
		}
		return out
	}
	for _, tt := range []struct {
		ports []discoveryv1.EndpointPort
		want  uint16
		ok    bool
	}{
		{[]discoveryv1.EndpointPort{p("dns", "UDP", 53), p("dns-tcp", "TCP", 5353), p("metrics", "TCP", 9153)}, 5353, true},
		{[]discoveryv1.EndpointPort{p("dns", "UDP", 53), p("tcp", "", 1053)}, 1053, true},
		{[]discoveryv1.EndpointPort{p("a", "TCP", 53), p("metrics", "TCP", 9153)}, 53, true},
		{[]discoveryv1.EndpointPort{p("a", "TCP", 54), p("metrics", "TCP", 9153)}, 0, false},
		{[]discoveryv1.EndpointPort{p("dns", "UDP", 53)}, 0, false},
		{[]discoveryv1.EndpointPort{p("dns-tcp", "SCTP", 53)}, 0, false},
	} {
		got, ok := slicePort(tt.ports, 53)
		if got != tt.want || ok != tt.ok {
			t.Errorf("slicePort(%v) = %d %v, want %d %v", tt.ports, got, ok, tt.want, tt.ok)
		}
	}
}

// TestSliceUDPPort: the dns port, else the only UDP port, else the Service's port; none; and
// the view's UDP endpoints are the TCP ones' pods on it.
func TestSliceUDPPort(t *testing.T) {
	p := func(name, proto string, n int32) discoveryv1.EndpointPort {
		pr := corev1.Protocol(proto)
		return discoveryv1.EndpointPort{Name: &name, Protocol: &pr, Port: &n}
	}
	for _, tt := range []struct {
		ports []discoveryv1.EndpointPort
		want  uint16
		ok    bool
	}{
		{[]discoveryv1.EndpointPort{p("dns", "UDP", 5353), p("dns-tcp", "TCP", 53), p("x", "UDP", 54)}, 5353, true},
		{[]discoveryv1.EndpointPort{p("a", "UDP", 1053), p("dns-tcp", "TCP", 53)}, 1053, true},
		{[]discoveryv1.EndpointPort{p("a", "UDP", 53), p("b", "UDP", 54)}, 53, true},
		{[]discoveryv1.EndpointPort{p("a", "UDP", 55), p("b", "UDP", 54)}, 0, false},
		{[]discoveryv1.EndpointPort{p("dns-tcp", "TCP", 53)}, 0, false},
	} {
		got, ok := sliceUDPPort(tt.ports, 53)
		if got != tt.want || ok != tt.ok {
			t.Errorf("sliceUDPPort(%v) = %d %v, want %d %v", tt.ports, got, ok, tt.want, tt.ok)
		}
	}
	r := true
	s := &discoveryv1.EndpointSlice{AddressType: discoveryv1.AddressTypeIPv4,
		Ports:     []discoveryv1.EndpointPort{p("dns", "UDP", 5353), p("dns-tcp", "TCP", 53)},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"10.0.0.2"}, Conditions: discoveryv1.EndpointConditions{Ready: &r}}}}
	v := compute(map[string]*discoveryv1.EndpointSlice{"a": s}, &Config{Max: 16, ServicePort: 53})
	if want := []netip.AddrPort{netip.MustParseAddrPort("10.0.0.2:5353")}; !slices.Equal(v.UDP, want) {
		t.Errorf("UDP = %v, want %v", v.UDP, want)
	}
}
