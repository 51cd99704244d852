package forward

import "testing"

func TestRouterLongestSuffix(t *testing.T) {
	kube := &Group{name: "kube-dns"}
	svc := &Group{name: "svc"}
	node := &Group{name: "node"}
	rev := &Group{name: "reverse"}
	stub := &Group{name: "stub"}
	r := NewRouter([]Route{
		{Zone: "cluster.local.", Group: kube},
		{Zone: "svc.cluster.local", Group: svc}, // no trailing dot: normalised
		{Zone: "IN-ADDR.ARPA.", Group: rev},     // upper case: normalised
		{Zone: "ip6.arpa.", Group: rev},
		{Zone: "example.com.", Group: stub},
		{Zone: ".", Group: node},
	})
	tests := []struct {
		qname string
		want  *Group
	}{
		{"cluster.local.", kube},
		{"pod.ns.pod.cluster.local.", kube},
		{"svc.cluster.local.", svc},
		{"kubernetes.default.svc.cluster.local.", svc},
		{"xsvc.cluster.local.", kube},     // label boundary: not under svc.cluster.local.
		{"xcluster.local.", node},         // label boundary: not under cluster.local.
		{"cluster.local.example.", node},  // suffix, not prefix
		{"10.0.96.10.in-addr.arpa.", rev}, // reverse zones
		{"1.0.0.0.ip6.arpa.", rev},        //
		{"in-addr.arpa.", rev},            //
		{"www.example.com.", stub},        //
		{"example.com.", stub},            //
		{"notexample.com.", node},         //
		{"a\\.cluster.local.", node},      // escaped dot: "a.cluster" is one label under local.
		{"a\\.svc.cluster.local.", kube},  // "a\.svc" is one label under cluster.local.
		{"example.org.", node},            //
		{".", node},                       //
		{"", node},                        //
		{"com.", node},                    //
		{"local.", node},                  //
		{"svc.cluster.local.x.", node},    //
		{"deep.a.b.c.d.e.f.g.example.com.", stub},
	}
	for _, tt := range tests {
		if got := r.Lookup(tt.qname); got != tt.want {
			t.Errorf("Lookup(%q) = %v, want %v", tt.qname, got.Name(), tt.want.Name())
		}
	}
}

func TestRouterNoDefault(t *testing.T) {
	kube := &Group{name: "kube-dns"}
	r := NewRouter([]Route{{Zone: "cluster.local.", Group: kube}})
	if g := r.Lookup("example.com."); g != nil {
		t.Errorf("Lookup(example.com.) = %v, want nil without a default route", g.Name())
	}
	if g := NewRouter(nil).Lookup("example.com."); g != nil {
		t.Errorf("empty router: got %v", g.Name())
	}
}

func TestRouterUpdate(t *testing.T) {
	a, b, node := &Group{name: "a"}, &Group{name: "b"}, &Group{name: "node"}
	r := NewRouter([]Route{{Zone: "example.com.", Group: a}, {Zone: ".", Group: node}})
	if got := r.Lookup("www.example.com."); got != a {
		t.Fatalf("before update: %v", got.Name())
	}
	old := r.Current()
	if r.Current() != old || old.Lookup("www.example.com.") != a {
		t.Fatal("the current table changed without an update, or looks up differently")
	}
	r.Update([]Route{{Zone: "example.com.", Group: b}, {Zone: ".", Group: node}})
	if got := r.Lookup("www.example.com."); got != b {
		t.Fatalf("after update: %v", got.Name())
	}
	// A started forward holds the table its group came from: an update
	// shows as another table, and the old one still answers as it did.
	if r.Current() == old || old.Lookup("www.example.com.") != a || r.Current().Lookup("www.example.com.") != b {
		t.Fatal("an update did not install a new table, or changed the old one")
	}
	var zero Router
	if zero.Current() != nil || zero.Current().Lookup("x.") != nil {
		t.Fatal("a zero Router has routes")
	}
	r.Update([]Route{{Zone: ".", Group: node}})
	if got := r.Lookup("www.example.com."); got != node {
		t.Fatalf("after removing the stub: %v", got.Name())
	}
}

// TestRouterConcurrentUpdate runs lookups while the table is swapped (meaningful under -race).
func TestRouterConcurrentUpdate(t *testing.T) {
	a, b := &Group{name: "a"}, &Group{name: "b"}
	r := NewRouter([]Route{{Zone: ".", Group: a}})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 1000; i++ {
			g := a
			if i%2 == 1 {
				g = b
			}
			r.Update([]Route{{Zone: ".", Group: g}})
		}
	}()
	for i := 0; i < 10000; i++ {
		if g := r.Lookup("x.example.com."); g != a && g != b {
			t.Fatalf("Lookup during update returned %v", g)
		}
	}
	<-done
}

func TestRouterLookupAllocs(t *testing.T) {
	r := NewRouter([]Route{{Zone: "cluster.local.", Group: &Group{}}, {Zone: ".", Group: &Group{}}})
	if n := testing.AllocsPerRun(100, func() { r.Lookup("a.b.c.svc.cluster.local.") }); n != 0 {
		t.Errorf("Lookup allocates %v times", n)
	}
}

func BenchmarkRouterLookup(b *testing.B) {
	r := NewRouter([]Route{{Zone: "cluster.local.", Group: &Group{}}, {Zone: "in-addr.arpa.", Group: &Group{}}, {Zone: ".", Group: &Group{}}})
	b.ReportAllocs()
	for b.Loop() {
		r.Lookup("kubernetes.default.svc.cluster.local.")
	}
}
