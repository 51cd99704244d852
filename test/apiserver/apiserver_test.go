package apiserver

import (
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"
)

// A port taken while the server was down (another socket took it as its
// local port) delays Restart, not fails it: it starts again once the port
// is free (TestWatchFollowsTheAPIServer failed on a fresh clone with "bind:
// address already in use").
func TestRestartWaitsForItsPort(t *testing.T) {
	s := Start(t)
	s.Stop()
	u, err := url.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", u.Host) // the port, taken
	if err != nil {
		t.Fatal(err)
	}
	go func() { // nothing answers on it; it is let go after a while
		time.Sleep(time.Second)
		ln.Close()
	}()
	s.Restart()
	if code, _, err := s.do(http.MethodGet, "/readyz", s.AdminToken, nil); err != nil || code != http.StatusOK {
		t.Fatalf("after Restart: %d %v", code, err)
	}
}
