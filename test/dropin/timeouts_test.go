package dropin

import (
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestTimeoutsIdle: `timeouts { idle 2s }` closes a client TCP connection
// idle for 2 s after an answer, in nodelocaldns as in CoreDNS 1.15 (the
// default is 10 s in both).
func TestTimeoutsIdle(t *testing.T) {
	corefile := `.:%[1]d {
    bind 127.0.0.1
    timeouts {
        read 2s
        write 3
        idle 2s
    }
    forward . %[2]s
}
`
	aOurs, aCore, _, _ := pair(t, corefile, true)
	for _, a := range []string{aOurs, aCore} {
		c, err := net.Dial("tcp", a)
		if err != nil {
			t.Fatal(err)
		}
		dc := &dns.Conn{Conn: c}
		m := new(dns.Msg)
		m.SetQuestion("www.example.org.", dns.TypeA)
		if err := dc.WriteMsg(m); err != nil {
			t.Fatal(err)
		}
		if _, err := dc.ReadMsg(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_ = c.SetReadDeadline(time.Now().Add(8 * time.Second))
		_, err = c.Read(make([]byte, 1))
		idle := time.Since(start)
		c.Close()
		if ne, ok := err.(net.Error); (ok && ne.Timeout()) || idle < 1500*time.Millisecond || idle > 4*time.Second {
			t.Errorf("%s: closed after %v (%v), want about 2s", a, idle, err)
		}
	}
}
