package config

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

func TestParseKubeDNSConfigMap(t *testing.T) {
	c := &Config{LocalIPs: []netip.Addr{netip.MustParseAddr("169.254.20.10")}, Port: 53, ClusterDomain: "cluster.local."}
	ap := netip.MustParseAddrPort
	cases := []struct {
		name     string
		stub, up string // "-": key absent
		want     KubeDNSConfigMap
		bad      bool
	}{
		{name: "absent", stub: "-", up: "-"},
		{name: "empty and null", stub: " \n", up: "null"},
		{name: "empty object and list", stub: "{}", up: "[]"},
		{name: "stock example",
			stub: `{"acme.local": ["1.2.3.4"], "Corp.Example.": ["10.0.0.1:5353", "[2001:db8::1]:53", "2001:db8::2"]}`,
			up:   `["8.8.8.8", "8.8.4.4:53", "[2001:4860:4860::8888]"]`,
			want: KubeDNSConfigMap{
				StubDomains: map[string][]netip.AddrPort{
					"acme.local.":   {ap("1.2.3.4:53")},
					"corp.example.": {ap("10.0.0.1:5353"), ap("[2001:db8::1]:53"), ap("[2001:db8::2]:53")},
				},
				UpstreamNameservers: []netip.AddrPort{ap("8.8.8.8:53"), ap("8.8.4.4:53"), ap("[2001:4860:4860::8888]:53")},
			}},
		{name: "repeats dropped", stub: "-", up: `["1.1.1.1", "1.1.1.1:53"]`,
			want: KubeDNSConfigMap{UpstreamNameservers: []netip.AddrPort{ap("1.1.1.1:53")}}},
		{name: "reverse stub below kube-dns zone", stub: `{"10.in-addr.arpa": ["10.0.0.1"], "a.cluster.local": ["10.0.0.2"]}`, up: "-",
			want: KubeDNSConfigMap{StubDomains: map[string][]netip.AddrPort{"10.in-addr.arpa.": {ap("10.0.0.1:53")}, "a.cluster.local.": {ap("10.0.0.2:53")}}}},
		{name: "bad JSON stub", stub: `{"acme.local": ["1.2.3.4"]`, up: "-", bad: true},
		{name: "bad JSON upstream", stub: "-", up: `"8.8.8.8"`, bad: true},
		{name: "stub list not strings", stub: `{"acme.local": [1]}`, up: "-", bad: true},
		{name: "four upstreams", stub: "-", up: `["1.1.1.1", "1.1.1.2", "1.1.1.3", "1.1.1.4"]`, bad: true},
		{name: "hostname upstream", stub: "-", up: `["dns.google"]`, bad: true},
		{name: "bad IP in stub", stub: `{"acme.local": ["1.2.3.256"]}`, up: "-", bad: true},
		{name: "port 0", stub: `{"acme.local": ["1.2.3.4:0"]}`, up: "-", bad: true},
		{name: "port too big", stub: "-", up: `["1.2.3.4:65536"]`, bad: true},
		{name: "IPv6 port without brackets", stub: "-", up: `["2001:db8::1:53:x"]`, bad: true},
		{name: "zoned IPv6", stub: "-", up: `["fe80::1%eth0"]`, bad: true},
		{name: "stub without servers", stub: `{"acme.local": []}`, up: "-", bad: true},
		{name: "root as stub", stub: `{".": ["1.2.3.4"]}`, up: "-", bad: true},
		{name: "empty label", stub: `{"a..b": ["1.2.3.4"]}`, up: "-", bad: true},
		{name: "space in domain", stub: `{"acme local": ["1.2.3.4"]}`, up: "-", bad: true},
		{name: "URL as domain", stub: `{"http://acme.local": ["1.2.3.4"]}`, up: "-", bad: true},
		{name: "zone twice", stub: `{"acme.local": ["1.2.3.4"], "ACME.local.": ["1.2.3.5"]}`, up: "-", bad: true},
		{name: "cluster domain as stub", stub: `{"cluster.local": ["1.2.3.4"]}`, up: "-", bad: true},
		{name: "in-addr.arpa as stub", stub: `{"in-addr.arpa.": ["1.2.3.4"]}`, up: "-", bad: true},
		{name: "loop to our address", stub: "-", up: `["169.254.20.10"]`, bad: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var d ConfigMapData
			if tc.stub != "-" {
				d.StubDomains = []byte(tc.stub)
			}
			if tc.up != "-" {
				d.UpstreamNameservers = []byte(tc.up)
			}
			got, err := c.ParseKubeDNSConfigMap(d)
			if tc.bad {
				if !errors.Is(err, ErrConfigMap) {
					t.Fatalf("err %v, want ErrConfigMap (got %v)", err, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v\nwant %v", got, tc.want)
			}
		})
	}
	// Local mode: no kube-dns, so the cluster domain may be a stub domain.
	lc := *c
	lc.LocalMode = true
	if _, err := lc.ParseKubeDNSConfigMap(ConfigMapData{StubDomains: []byte(`{"cluster.local": ["10.0.0.1"]}`)}); err != nil {
		t.Fatal(err)
	}
}

func TestReadConfigMapDir(t *testing.T) {
	// A missing directory sets nothing.
	d, err := ReadConfigMapDir(filepath.Join(t.TempDir(), "absent"))
	if err != nil || d.StubDomains != nil || d.UpstreamNameservers != nil {
		t.Fatalf("missing dir: %v %v", d, err)
	}
	// A plain directory (hostPath, tests).
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, KeyUpstreamNameservers), []byte(`["1.1.1.1"]`), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err = ReadConfigMapDir(dir)
	if err != nil || d.StubDomains != nil || string(d.UpstreamNameservers) != `["1.1.1.1"]` {
		t.Fatalf("plain dir: %q %v", d, err)
	}
	// The kubelet's layout, before and after an update that adds a key and
	// drops another.
	dir = t.TempDir()
	kubeletWrite(t, dir, map[string]string{KeyStubDomains: `{"a.example": ["10.0.0.1"]}`, "federations": "{}"})
	d, err = ReadConfigMapDir(dir)
	if err != nil || string(d.StubDomains) != `{"a.example": ["10.0.0.1"]}` || d.UpstreamNameservers != nil {
		t.Fatalf("kubelet dir: %q %v", d, err)
	}
	kubeletWrite(t, dir, map[string]string{KeyUpstreamNameservers: `["1.1.1.1"]`})
	d2, err := ReadConfigMapDir(dir)
	if err != nil || d2.StubDomains != nil || string(d2.UpstreamNameservers) != `["1.1.1.1"]` {
		t.Fatalf("after update: %q %v", d2, err)
	}
	if d.Equal(d2) || !d2.Equal(ConfigMapData{UpstreamNameservers: []byte(`["1.1.1.1"]`)}) {
		t.Fatal("Equal")
	}
	if (ConfigMapData{StubDomains: []byte{}}).Equal(ConfigMapData{}) {
		t.Fatal("an empty key equals an absent one")
	}
}

func TestKubeDNSConfigMapFlag(t *testing.T) {
	rc := writeFile(t, "nameserver 10.0.0.2\n")
	args := []string{"-local-mode", "-resolv-conf", rc}
	old := DefaultKubeDNSConfigMap
	t.Cleanup(func() { DefaultKubeDNSConfigMap = old })

	DefaultKubeDNSConfigMap = filepath.Join(t.TempDir(), "kube-dns") // absent: off
	c, err := Parse(args, envOf(nil), os.Stderr)
	if err != nil || c.KubeDNSConfigMap != "" {
		t.Fatalf("absent default: %q %v", c.KubeDNSConfigMap, err)
	}
	DefaultKubeDNSConfigMap = t.TempDir() // present: on
	if c, err = Parse(args, envOf(nil), os.Stderr); err != nil || c.KubeDNSConfigMap != DefaultKubeDNSConfigMap {
		t.Fatalf("present default: %q %v", c.KubeDNSConfigMap, err)
	}
	if c, err = Parse(append(args, "-kubednscm="), envOf(nil), os.Stderr); err != nil || c.KubeDNSConfigMap != "" {
		t.Fatalf("turned off: %q %v", c.KubeDNSConfigMap, err)
	}
	if c, err = Parse(append(args, "-kubednscm", "/x/cm"), envOf(nil), os.Stderr); err != nil || c.KubeDNSConfigMap != "/x/cm" {
		t.Fatalf("explicit: %q %v", c.KubeDNSConfigMap, err)
	}
}
