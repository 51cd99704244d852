package dropin

import (
	"fmt"
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

// TestTimeoutsMaxTCPQueries: `timeouts { maxtcpqueries 3 }` closes a
// client TCP connection after its third query is answered, asked one at a
// time or pipelined, in nodelocaldns as in CoreDNS 1.15 (the stock
// node-cache's CoreDNS refuses the option); -1 is unlimited.
func TestTimeoutsMaxTCPQueries(t *testing.T) {
	for _, tc := range []struct {
		max  string
		want int
	}{{"3", 3}, {"-1", 8}} {
		corefile := `.:%[1]d {
    bind 127.0.0.1
    cache 30
    timeouts {
        maxtcpqueries ` + tc.max + `
    }
    forward . %[2]s
}
`
		aOurs, aCore, _, _ := pair(t, corefile, true)
		for _, a := range []string{aOurs, aCore} {
			for _, pipelined := range []bool{false, true} {
				c, err := net.Dial("tcp", a)
				if err != nil {
					t.Fatal(err)
				}
				dc := &dns.Conn{Conn: c}
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				ask := func(i int) error {
					m := new(dns.Msg)
					m.SetQuestion(fmt.Sprintf("q%d.example.org.", i), dns.TypeA)
					m.Id = uint16(i + 1)
					return dc.WriteMsg(m)
				}
				answered := 0
				if pipelined {
					for i := range 8 {
						if ask(i) != nil {
							break
						}
					}
					for ; answered < 8; answered++ {
						if _, err := dc.ReadMsg(); err != nil {
							break
						}
					}
				} else {
					for i := range 8 {
						if ask(i) != nil {
							break
						}
						if _, err := dc.ReadMsg(); err != nil {
							break
						}
						answered++
					}
				}
				c.Close()
				if answered != tc.want {
					t.Errorf("maxtcpqueries %s, %s, pipelined %v: %d answers on one connection, want %d", tc.max, a, pipelined, answered, tc.want)
				}
			}
		}
	}
}
