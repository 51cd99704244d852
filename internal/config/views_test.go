package config

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// The same zone on two binds with other settings: each address sees its
// own block (two views, each with its block's policy and forward); the
// shared tables keep the first block's.
func TestViewsPerBind(t *testing.T) {
	c, err := corefileConfig(t, `example.test:53 {
    bind 169.254.20.10
    cache 30
    forward . 10.0.0.2
}
example.test:53 {
    bind 169.254.20.11
    cache 60
    forward . 10.0.0.3:5353
}
.:53 {
    bind 169.254.20.10 169.254.20.11
    cache 300
    forward . 10.0.0.9
}
`)
	if err != nil {
		t.Fatal(err)
	}
	cc := c.DropIn.Corefile
	if len(cc.Views) != 2 {
		t.Fatalf("views %+v", cc.Views)
	}
	a, b := cc.Views[0], cc.Views[1]
	if len(a.Addrs) != 1 || a.Addrs[0] != netip.MustParseAddrPort("169.254.20.10:53") || len(b.Addrs) != 1 || b.Addrs[0] != netip.MustParseAddrPort("169.254.20.11:53") {
		t.Fatalf("addresses %v %v", a.Addrs, b.Addrs)
	}
	if a.Pick["example.test."] != 0 || b.Pick["example.test."] != 1 || a.Pick["."] != 2 || b.Pick["."] != 2 {
		t.Errorf("picks %v %v", a.Pick, b.Pick)
	}
	cap := func(v View, z string) time.Duration {
		for _, zp := range v.ZonePolicies {
			if zp.Zone == z {
				return zp.TTL.SuccessMax
			}
		}
		t.Fatalf("no policy for %s", z)
		return 0
	}
	if cap(a, "example.test.") != 30*time.Second || cap(b, "example.test.") != 60*time.Second || cap(b, ".") != 300*time.Second {
		t.Errorf("caps %v %v %v", cap(a, "example.test."), cap(b, "example.test."), cap(b, "."))
	}
	if len(a.Routes) != 0 || len(b.Routes) != 1 || b.Routes[0].Zone != "example.test." || b.Routes[0].Servers[0] != netip.MustParseAddrPort("10.0.0.3:5353") {
		t.Errorf("routes %+v %+v", a.Routes, b.Routes)
	}
	// The shared route table: the zone's first block only.
	if len(c.DropIn.Routes) != 1 || c.DropIn.Routes[0].Servers[0] != netip.MustParseAddrPort("10.0.0.2:53") {
		t.Errorf("shared routes %+v", c.DropIn.Routes)
	}
	if got := zonePolicy(t, c, "example.test."); got.TTL.SuccessMax != 30*time.Second || got.TTL.Tag != 1 {
		t.Errorf("shared policy %+v", got)
	}
	if got := strings.Join(a.Describe(cc.Servers), "\n"); !strings.Contains(got, "addresses [169.254.20.10:53] see the blocks") {
		t.Errorf("describe: %s", got)
	}
}

// Blocks on several binds with the same settings, and the stock layout
// (every block binds every address): one view, Views nil.
func TestViewsOneWhenAlike(t *testing.T) {
	for _, text := range []string{
		".:53 {\n bind 169.254.20.10\n cache 30\n forward . 10.0.0.2\n}\n.:53 {\n bind 169.254.20.11\n cache 30\n forward . 10.0.0.2\n}\n",
		"cluster.local:53 {\n bind 169.254.20.10 10.0.0.10\n cache 30\n forward . 10.0.0.20\n}\n.:53 {\n bind 169.254.20.10 10.0.0.10\n cache 30\n forward . 10.0.0.2\n}\n",
		"cluster.local:53 {\n cache 30\n forward . 10.0.0.20\n}\n.:53 {\n cache 30\n forward . 10.0.0.2\n}\n",
	} {
		c, err := corefileConfig(t, text)
		if err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		if v := c.DropIn.Corefile.Views; v != nil {
			t.Errorf("%q: views %+v", text, v)
		}
	}
}

// An address bound by some block sees only the blocks binding it (the
// kernel prefers the bound socket): a name outside its zones is REFUSED
// there, as CoreDNS answers. Elsewhere the bound block's zone goes to the
// wildcard "." block.
func TestViewsBoundHidesWildcard(t *testing.T) {
	c, err := corefileConfig(t, ".:53 {\n forward . 10.0.0.2\n}\nexample.test:53 {\n bind 169.254.20.11\n forward . 10.0.0.3\n}\n", "-localip", "169.254.20.10,169.254.20.11")
	if err != nil {
		t.Fatal(err)
	}
	v := c.DropIn.Corefile.Views
	if len(v) != 2 {
		t.Fatalf("views %+v", v)
	}
	if v[0].Addrs[0] != netip.MustParseAddrPort("169.254.20.10:53") || len(v[0].Refused) != 0 || v[0].Pick["example.test."] != 0 ||
		len(v[0].Routes) != 1 || v[0].Routes[0].Servers[0] != netip.MustParseAddrPort("10.0.0.2:53") {
		t.Errorf("wildcard view %+v", v[0])
	}
	if v[1].Addrs[0] != netip.MustParseAddrPort("169.254.20.11:53") || len(v[1].Refused) != 1 || v[1].Refused[0] != "." {
		t.Errorf("bound view %+v", v[1])
	}
}

// A zone without bind in one block and with bind in another on the same
// port: refused, as CoreDNS 1.15 refuses it ("zone overlap listener
// capacity"), with one line.
func TestViewsOverlapRefused(t *testing.T) {
	for _, text := range []string{
		"example.test:53 {\n forward . 10.0.0.2\n}\nexample.test:53 {\n bind 169.254.20.10\n forward . 10.0.0.3\n}\n",
		"example.test:53 {\n bind 169.254.20.10\n forward . 10.0.0.3\n}\nexample.test:53 {\n forward . 10.0.0.2\n}\n",
	} {
		_, err := corefileConfig(t, text)
		if err == nil || !strings.Contains(err.Error(), "overlaps") || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: err %v", text, err)
		}
	}
}

func TestViewBlocks(t *testing.T) {
	c, err := corefileConfig(t, "a.test:53 {\n bind 0.0.0.0\n forward . 10.0.0.2\n}\nb.test:53 {\n bind 169.254.20.10\n forward . 10.0.0.2\n}\nc.test:53 {\n bind ::\n forward . 10.0.0.2\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	srv := c.DropIn.Corefile.Servers
	// bind 0.0.0.0 and bind :: are both dual-stack in CoreDNS (Go's
	// wildcard listen): an IPv6 address sees both. (The stock opens two *:53
	// sockets in one SO_REUSEPORT group, which the kernel picks between per
	// query: each block's names are REFUSED at random, seen with dig; we
	// answer both blocks' zones.)
	for addr, want := range map[string]string{"169.254.20.10": "[1]", "169.254.20.11": "[0 2]", "fd00::1": "[0 2]"} {
		if got := fmtInts(viewBlocks(srv, netip.AddrPortFrom(netip.MustParseAddr(addr), 0))); got != want {
			t.Errorf("%s sees %s, want %s", addr, got, want)
		}
	}
}

func fmtInts(v []int) string {
	var b strings.Builder
	b.WriteString("[")
	for i, x := range v {
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString(string(rune('0' + x)))
	}
	b.WriteString("]")
	return b.String()
}

// Blocks on two binds that differ only in what they do to every answer
// (log, loadbalance, whoami) answer otherwise: two views, so that each
// address's block table carries its own (internal/blocks).
func TestViewsDifferInAnswers(t *testing.T) {
	for _, extra := range []string{" log\n", " loadbalance\n"} {
		text := ".:53 {\n bind 169.254.20.10\n cache 30\n forward . 10.0.0.2\n}\n.:53 {\n bind 169.254.20.11\n cache 30\n forward . 10.0.0.2\n" + extra + "}\n"
		c, err := corefileConfig(t, text)
		if err != nil {
			t.Fatalf("%q: %v", text, err)
		}
		if v := c.DropIn.Corefile.Views; len(v) != 2 {
			t.Errorf("%q: views %+v", text, v)
		}
	}
	text := "who.example:53 {\n bind 169.254.20.10\n whoami\n}\nwho.example:53 {\n bind 169.254.20.11\n}\n.:53 {\n forward . 10.0.0.2\n}\n"
	c, err := corefileConfig(t, text)
	if err != nil {
		t.Fatal(err)
	}
	if v := c.DropIn.Corefile.Views; len(v) != 2 {
		t.Errorf("whoami on one bind: views %+v", v)
	}
}

// A key on another port (kubespray's external zones): the block's keys are
// served each on its own port, as CoreDNS does. The address listens on both
// ports; the 1053 socket sees only example.io and refuses the rest, the 53
// socket answers example.com from the block and example.io from ".".
func TestViewsPerPort(t *testing.T) {
	c, err := corefileConfig(t, "example.com example.io:1053 {\n bind 169.254.25.10\n cache 5\n forward . 10.0.0.1\n}\n.:53 {\n bind 169.254.25.10\n cache 30\n forward . 10.0.0.2\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.AddrPort{netip.MustParseAddrPort("169.254.25.10:53"), netip.MustParseAddrPort("169.254.25.10:1053")}
	if got := c.Sockets(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("sockets %v, want %v", got, want)
	}
	if c.Port != 53 || len(c.ExtraPorts()) != 1 || c.ExtraPorts()[0] != 1053 {
		t.Errorf("port %d extra %v", c.Port, c.ExtraPorts())
	}
	srv := c.DropIn.Corefile.Servers
	if len(srv) != 3 || srv[0].Port != 53 || srv[0].Zones[0] != "example.com." || srv[1].Port != 1053 || srv[1].Zones[0] != "example.io." || srv[1].Keys[0] != "example.io:1053" {
		t.Fatalf("blocks %+v %+v", srv[0], srv[1])
	}
	v := c.DropIn.Corefile.Views
	if len(v) != 2 || len(v[0].Addrs) != 1 || v[0].Addrs[0] != want[0] || len(v[1].Addrs) != 1 || v[1].Addrs[0] != want[1] {
		t.Fatalf("views %+v", v)
	}
	if v[0].Pick["example.com."] != 0 || v[0].Pick["example.io."] != 2 || v[0].Pick["."] != 2 || len(v[0].Refused) != 0 {
		t.Errorf("port 53 view %+v", v[0])
	}
	if v[1].Pick["example.io."] != 1 || v[1].Pick["example.com."] != -1 || v[1].Pick["."] != -1 || !slices.Contains(v[1].Refused, ".") {
		t.Errorf("port 1053 view %+v", v[1])
	}
	// -check-config names the sockets, the rule ports, and the block once.
	var out strings.Builder
	Describe(&out, c)
	for _, want := range []string{"listen:           [169.254.25.10:53 169.254.25.10:1053]", "iptables ports:   DNS 53 and [1053]",
		"addresses [169.254.25.10:1053] see the blocks", "keys example.io:1053  zones example.io.  port 1053", "the block above, its keys on port 1053"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-check-config lacks %q:\n%s", want, out.String())
		}
	}
	// One port for all: no Listen, Sockets from -localip and the port.
	c, err = corefileConfig(t, "example.com:1053 {\n forward . 10.0.0.1\n}\n.:1053 {\n forward . 10.0.0.2\n}\n")
	if err != nil {
		t.Fatal(err)
	}
	if c.Listen != nil || c.Port != 1053 || len(c.Sockets()) != 1 || c.Sockets()[0].Port() != 1053 {
		t.Errorf("one port: listen %v port %d sockets %v", c.Listen, c.Port, c.Sockets())
	}
}
