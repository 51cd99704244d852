package dropin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
	_ "github.com/nodelocaldns/nodelocaldns/internal/plugins" // the directives read by their own packages
	"github.com/nodelocaldns/nodelocaldns/test/testhost"
)

// coreDNSAccepts starts CoreDNS on the Corefile and reports whether it
// serves (true) or exits refusing it (false), with its output.
func coreDNSAccepts(t *testing.T, bin, conf string, port int) (bool, string) {
	t.Helper()
	var out testhost.SyncBuffer
	cmd := exec.Command(bin, "-conf", conf, "-quiet")
	cmd.Dir = filepath.Dir(conf)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() { _ = cmd.Process.Kill(); <-done }()
	m := new(dns.Msg)
	m.SetQuestion("probe.example.org.", dns.TypeA)
	c := &dns.Client{Timeout: 200 * time.Millisecond}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			done <- nil
			return false, out.String()
		default:
		}
		if _, _, err := c.Exchange(m, fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			return true, out.String()
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("CoreDNS neither served nor exited:\n%s", out.String())
	return false, ""
}

// Corefile syntax as CoreDNS 1.15 reads it: each text is accepted or
// refused by both. PORT and UP are filled in; every directive used is one
// we support, so a difference is the syntax's. No key may fall back to
// port 53: whether CoreDNS can bind it here depends on the machine. (Left
// out on purpose: a stray '}' after the last block, which CoreDNS takes as
// a server block for the zone "}." on port 53 and we refuse.)
func TestSyntaxParityWithCoreDNS(t *testing.T) {
	if testing.Short() {
		t.Skip("runs CoreDNS")
	}
	coredns := buildCoreDNS(t)
	up := upstream(t, "192.0.2.1")
	for _, tc := range []struct{ name, text string }{
		{"plain", ".:PORT {\n  forward . UP\n}\n"},
		{"keys with commas over lines", "a.example.:PORT,\n  .:PORT {\n  forward . UP\n}\n"},
		{"several keys", "a.example:PORT example.org.:PORT .:PORT {\n  forward . UP\n}\n"},
		{"dns scheme", "dns://.:PORT {\n  forward . dns://UP\n}\n"},
		{"cidr keys", "10.0.0.0/15:PORT 172.16.5.0/26:PORT fd00::/30:PORT .:PORT {\n  forward . UP\n}\n"},
		{"cidr key bad prefix", "10.0.0.0/33:PORT {\n  forward . UP\n}\n"},
		{"cidr key dns scheme", "dns://10.0.0.0/8:PORT {\n  forward . UP\n}\n"},
		{"comments and tabs", "# head\n.:PORT {\t# open\n\tforward . UP # trailing\n\tcache 30\t \n}\n"},
		{"crlf", ".:PORT {\r\n  forward . UP\r\n}\r\n"},
		{"snippet", "(opts) {\n  cache 30\n  errors\n}\n.:PORT {\n  import opts\n  forward . UP\n}\n"},
		{"env", ".:{$NLD_TEST_PORT} {\n  forward . {$NLD_TEST_UP}\n}\n"},
		{"quoted args", ".:PORT {\n  forward \".\" \"UP\"\n}\n"},
		{"empty option block", ".:PORT {\n  cache {\n  }\n  forward . UP\n}\n"},
		{"block on one line", ".:PORT { forward . UP }\n"},
		{"option block on one line", ".:PORT {\n  forward . UP { force_tcp }\n}\n"},
		{"unknown directive", ".:PORT {\n  forward . UP\n  frobnicate\n}\n"},
		{"missing close", ".:PORT {\n  forward . UP\n"},
		{"brace on next line", ".:PORT\n{\n  forward . UP\n}\n"},
		{"no braces", ".:PORT\nforward . UP\n"},
		{"cache twice", ".:PORT {\n  cache 30\n  cache 10\n  forward . UP\n}\n"},
		{"bad cache ttl", ".:PORT {\n  cache 0\n  forward . UP\n}\n"},
		{"forward without to", ".:PORT {\n  forward .\n}\n"},
		{"trailing comma then brace", "a.example, {\n  forward . UP\n}\n"},
		{"duplicate zone", ".:PORT {\n  forward . UP\n}\n.:PORT {\n  forward . UP\n}\n"},
		{"health ipv6 without brackets", ".:PORT {\n  health ::1:0\n  forward . UP\n}\n"},
		{"import glob matching nothing", ".:PORT {\n  import nothing-*.conf\n  forward . UP\n}\n"},
		{"serve_stale bare", ".:PORT {\n  cache {\n    serve_stale\n  }\n  forward . UP\n}\n"},
		{"serve_stale duration", ".:PORT {\n  cache {\n    serve_stale 10m\n  }\n  forward . UP\n}\n"},
		{"serve_stale immediate ttl", ".:PORT {\n  cache {\n    serve_stale 1h immediate 30s\n  }\n  forward . UP\n}\n"},
		{"serve_stale immediate ttl recheck", ".:PORT {\n  cache {\n    serve_stale 1h immediate 30s 30s\n  }\n  forward . UP\n}\n"},
		{"serve_stale immediate zero ttl", ".:PORT {\n  cache {\n    serve_stale 1h immediate 0s 0s\n  }\n  forward . UP\n}\n"},
		{"serve_stale verify", ".:PORT {\n  cache {\n    serve_stale 1h verify\n  }\n  forward . UP\n}\n"},
		{"serve_stale verify timeout", ".:PORT {\n  cache {\n    serve_stale 1h verify 100ms\n  }\n  forward . UP\n}\n"},
		{"serve_stale verify timeout ttl recheck", ".:PORT {\n  cache {\n    serve_stale 1h verify 100ms 30s 30s\n  }\n  forward . UP\n}\n"},
		{"serve_stale verify zero timeout ttl", ".:PORT {\n  cache {\n    serve_stale 1h verify 0 30s\n  }\n  forward . UP\n}\n"},
		{"serve_stale mode case", ".:PORT {\n  cache {\n    serve_stale 1h VERIFY 1s\n  }\n  forward . UP\n}\n"},
		{"serve_stale too many", ".:PORT {\n  cache {\n    serve_stale 1h immediate 30s 30s 30s\n  }\n  forward . UP\n}\n"},
		{"serve_stale verify too many", ".:PORT {\n  cache {\n    serve_stale 1h verify 1s 30s 30s 30s\n  }\n  forward . UP\n}\n"},
		{"serve_stale bad mode", ".:PORT {\n  cache {\n    serve_stale 1h sometimes\n  }\n  forward . UP\n}\n"},
		{"serve_stale negative", ".:PORT {\n  cache {\n    serve_stale -1s\n  }\n  forward . UP\n}\n"},
		{"serve_stale fractional ttl", ".:PORT {\n  cache {\n    serve_stale 1h immediate 1500ms\n  }\n  forward . UP\n}\n"},
		{"serve_stale ttl without unit", ".:PORT {\n  cache {\n    serve_stale 1h immediate 30\n  }\n  forward . UP\n}\n"},
		{"serve_stale recheck over 5m", ".:PORT {\n  cache {\n    serve_stale 1h immediate 30s 6m\n  }\n  forward . UP\n}\n"},
		{"serve_stale recheck 5m", ".:PORT {\n  cache {\n    serve_stale 1h immediate 30s 5m\n  }\n  forward . UP\n}\n"},
		{"serve_stale negative verify timeout", ".:PORT {\n  cache {\n    serve_stale 1h verify -1s\n  }\n  forward . UP\n}\n"},
		{"serve_stale ttl out of range", ".:PORT {\n  cache {\n    serve_stale 1h immediate 4294967296s\n  }\n  forward . UP\n}\n"},
		{"serve_stale_policy", ".:PORT {\n  cache {\n    serve_stale\n    serve_stale_policy prefer_positive\n  }\n  forward . UP\n}\n"},
		{"serve_stale_policy first", ".:PORT {\n  cache {\n    serve_stale_policy PREFER_POSITIVE\n    serve_stale 1h\n  }\n  forward . UP\n}\n"},
		{"serve_stale_policy alone", ".:PORT {\n  cache {\n    serve_stale_policy prefer_positive\n  }\n  forward . UP\n}\n"},
		{"serve_stale_policy twice", ".:PORT {\n  cache {\n    serve_stale\n    serve_stale_policy prefer_positive\n    serve_stale_policy prefer_positive\n  }\n  forward . UP\n}\n"},
		{"serve_stale_policy other", ".:PORT {\n  cache {\n    serve_stale\n    serve_stale_policy prefer_negative\n  }\n  forward . UP\n}\n"},
		{"health_check domain", ".:PORT {\n  forward . UP {\n    health_check 1s domain example.org\n  }\n}\n"},
		{"health_check no_rec domain", ".:PORT {\n  forward . UP {\n    health_check 1s no_rec domain example.org\n  }\n}\n"},
		{"health_check domain no_rec", ".:PORT {\n  forward . UP {\n    health_check 1s domain example.org no_rec\n  }\n}\n"},
		{"health_check domain without name", ".:PORT {\n  forward . UP {\n    health_check 1s domain\n  }\n}\n"},
		{"health_check bad domain", ".:PORT {\n  forward . UP {\n    health_check 1s domain a..b\n  }\n}\n"},
		{"health_check unknown option", ".:PORT {\n  forward . UP {\n    health_check 1s recurse\n  }\n}\n"},
		{"loadbalance prefer", ".:PORT {\n  loadbalance {\n    prefer 10.0.0.0/8 fd00::/8\n    prefer 192.168.0.0/16\n  }\n  forward . UP\n}\n"},
		{"loadbalance round_robin prefer", ".:PORT {\n  loadbalance round_robin {\n    prefer 10.0.0.1/8\n  }\n  forward . UP\n}\n"},
		{"loadbalance prefer nothing", ".:PORT {\n  loadbalance {\n    prefer\n  }\n  forward . UP\n}\n"},
		{"loadbalance prefer bad cidr", ".:PORT {\n  loadbalance {\n    prefer 10.0.0.0\n  }\n  forward . UP\n}\n"},
		{"loadbalance unknown property", ".:PORT {\n  loadbalance {\n    frob\n  }\n  forward . UP\n}\n"},
		{"loadbalance weighted missing file", ".:PORT {\n  loadbalance weighted /nonexistent/weights\n  forward . UP\n}\n"},
		{"loadbalance weighted missing file reload 0", ".:PORT {\n  loadbalance weighted /nonexistent/weights {\n    reload 0s\n  }\n  forward . UP\n}\n"},
		{"loadbalance weighted prefer", ".:PORT {\n  loadbalance weighted /nonexistent/weights {\n    prefer 10.0.0.0/8\n  }\n  forward . UP\n}\n"},
		{"loadbalance weighted bad reload", ".:PORT {\n  loadbalance weighted /nonexistent/weights {\n    reload -1s\n  }\n  forward . UP\n}\n"},
		{"loadbalance weighted no file", ".:PORT {\n  loadbalance weighted\n  forward . UP\n}\n"},
		{"cache disable zones", ".:PORT {\n  cache {\n    disable success example.org Example.NET.\n    disable denial .\n  }\n  forward . UP\n}\n"},
		{"cache disable nothing", ".:PORT {\n  cache {\n    disable\n  }\n  forward . UP\n}\n"},
		{"cache disable other", ".:PORT {\n  cache {\n    disable positive example.org\n  }\n  forward . UP\n}\n"},
		{"tls target server name", ".:PORT {\n  forward . tls://127.0.0.1%dns.example:853 tls://127.0.0.2:853%other.example\n}\n"},
		{"tls target server name and tls_servername", ".:PORT {\n  forward . tls://127.0.0.1%dns.example {\n    tls_servername dns.example\n  }\n}\n"},
		{"tls target mixed server names", ".:PORT {\n  forward . tls://127.0.0.1%dns.example tls://127.0.0.2\n}\n"},
		{"maxtcpqueries", ".:PORT {\n  timeouts {\n    maxtcpqueries 128\n  }\n  forward . UP\n}\n"},
		{"maxtcpqueries unlimited", ".:PORT {\n  timeouts {\n    maxtcpqueries -1\n  }\n  forward . UP\n}\n"},
		{"maxtcpqueries zero", ".:PORT {\n  timeouts {\n    maxtcpqueries 0\n  }\n  forward . UP\n}\n"},
		{"maxtcpqueries below -1", ".:PORT {\n  timeouts {\n    maxtcpqueries -2\n  }\n  forward . UP\n}\n"},
		{"maxtcpqueries word", ".:PORT {\n  timeouts {\n    maxtcpqueries lots\n  }\n  forward . UP\n}\n"},
		{"failover", ".:PORT {\n  forward . UP {\n    failover SERVFAIL refused\n    failover NXDOMAIN\n  }\n}\n"},
		{"failover noerror", ".:PORT {\n  forward . UP {\n    failover NOERROR\n  }\n}\n"},
		{"failover bogus", ".:PORT {\n  forward . UP {\n    failover SOMETIMES\n  }\n}\n"},
		{"failover nothing", ".:PORT {\n  forward . UP {\n    failover\n  }\n}\n"},
		{"max_connect_attempts", ".:PORT {\n  forward . UP {\n    max_connect_attempts 3\n  }\n}\n"},
		{"max_connect_attempts zero", ".:PORT {\n  forward . UP {\n    max_connect_attempts 0\n  }\n}\n"},
		{"max_connect_attempts negative", ".:PORT {\n  forward . UP {\n    max_connect_attempts -1\n  }\n}\n"},
		{"pprof block", ".:PORT {\n  pprof 127.0.0.1:0 {\n    block\n  }\n  forward . UP\n}\n"},
		{"pprof block rate", ".:PORT {\n  pprof 127.0.0.1:0 {\n    block 100\n  }\n  forward . UP\n}\n"},
		{"pprof block word", ".:PORT {\n  pprof 127.0.0.1:0 {\n    block often\n  }\n  forward . UP\n}\n"},
		{"pprof unknown", ".:PORT {\n  pprof 127.0.0.1:0 {\n    mutex\n  }\n  forward . UP\n}\n"},
		{"several forwards", ".:PORT {\n  forward example.org UP {\n    next NXDOMAIN servfail\n    next_on_nodata\n  }\n  forward . UP {\n    except skip.example\n    next REFUSED\n  }\n  forward . UP\n}\n"},
		{"several forwards, the second bad", ".:PORT {\n  forward . UP {\n    next NXDOMAIN\n  }\n  forward . UP {\n    next SOMETIMES\n  }\n}\n"},
		{"several forwards, the second without to", ".:PORT {\n  forward . UP\n  forward example.org\n}\n"},
		{"several forwards apart", ".:PORT {\n  forward . UP {\n    next NXDOMAIN\n  }\n  cache 30\n  forward . UP\n}\n"},
		{"tls and plain targets", ".:PORT {\n  forward . tls://127.0.0.1 UP dns://127.0.0.2 {\n    tls_servername dns.example\n  }\n}\n"},
		{"serve_stale_policy no argument", ".:PORT {\n  cache {\n    serve_stale\n    serve_stale_policy\n  }\n  forward . UP\n}\n"},
		{"hosts entries without an address or a name (skipped)", ".:PORT {\n  hosts {\n    10.0.0.1 a.example\n    not-an-ip b.example\n    10.0.0.2\n    fallthrough\n  }\n  forward . UP\n}\n"},
		{"zones that are no domain name (skipped)", ".:PORT {\n  cache 30 a..b example.org {\n    disable denial x..y\n  }\n  forward . UP {\n    except a..b\n  }\n}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var (
				text, out string
				theirs    bool
				ourErr    error
			)
			// A free port can be taken by another process before CoreDNS
			// binds it (the machine runs other tests): then CoreDNS exits
			// "address already in use", which says nothing of the syntax,
			// and the case runs again on another port.
			for try := 0; ; try++ {
				port := testhost.FreePort(t, "127.0.0.1")
				text = strings.NewReplacer("PORT", fmt.Sprint(port), "UP", up).Replace(tc.text)
				t.Setenv("NLD_TEST_PORT", fmt.Sprint(port))
				t.Setenv("NLD_TEST_UP", up)
				conf := filepath.Join(t.TempDir(), "Corefile")
				if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
				_, ourErr = corefile.Load(conf, os.Getenv, corefile.Options{})
				theirs, out = coreDNSAccepts(t, coredns, conf, port)
				if theirs || !strings.Contains(out, "address already in use") || try == 2 {
					break
				}
				t.Logf("port %d taken before CoreDNS bound it; again on another", port)
			}
			if (ourErr == nil) != theirs {
				t.Errorf("CoreDNS accepts: %v; ours: %v\n%s\nCoreDNS said:\n%s", theirs, ourErr, text, out)
			}
		})
	}
}
