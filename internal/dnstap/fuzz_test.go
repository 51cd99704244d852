package dnstap

import (
	"bytes"
	"io"
	"net/netip"
	"testing"
	"time"
)

// FuzzDecode: any payload decodes or fails without panicking; a message
// we encode decodes to itself.
func FuzzDecode(f *testing.F) {
	m := &Message{Type: ForwarderResponse, TCP: true, Query: netip.MustParseAddrPort("[fd00::1]:5353"), Response: netip.MustParseAddrPort("10.0.0.1:53"),
		QueryTime: time.Unix(1, 2), ResponseTime: time.Unix(3, 4), QueryMessage: []byte{1}, ResponseMessage: []byte{2, 3}}
	f.Add(appendMessage(nil, m, []byte("id"), []byte("v"), []byte("x"), true))
	f.Add([]byte{0x72, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := Decode(b)
		if err != nil {
			return
		}
		// Re-encoded and decoded again, the fields we know stay (an
		// IPv4-mapped address comes back as IPv4: we send 4 bytes, as
		// CoreDNS does for an IPv4 client).
		again, err := Decode(appendMessage(nil, &d.Message, d.Identity, d.Version, d.Extra, true))
		if err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
		unmap := func(a netip.AddrPort) netip.AddrPort { return netip.AddrPortFrom(a.Addr().Unmap(), a.Port()) }
		if again.Type != d.Type || again.Query != unmap(d.Query) || again.Response != unmap(d.Response) || !bytes.Equal(again.QueryMessage, d.QueryMessage) || !bytes.Equal(again.ResponseMessage, d.ResponseMessage) {
			t.Fatalf("round trip: %+v != %+v", again, d)
		}
	})
}

// rw is a stream read from r, written to io.Discard.
type rw struct{ io.Reader }

func (rw) Write(b []byte) (int, error) { return len(b), nil }

// FuzzCollect: any stream ends Collect with an error or at STOP, never a
// panic, and no frame past MaxFrame is delivered.
func FuzzCollect(f *testing.F) {
	var s []byte
	s = appendControl(s, ctrlReady, ContentType)
	s = appendControl(s, ctrlStart, ContentType)
	s = append(s, 0, 0, 0, 3, 1, 2, 3)
	s = appendControl(s, ctrlStop, "")
	f.Add(s)
	f.Add([]byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = Collect(rw{bytes.NewReader(b)}, func(p []byte) {
			if len(p) > MaxFrame {
				t.Fatalf("frame of %d bytes", len(p))
			}
		})
	})
}
