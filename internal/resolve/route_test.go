package resolve

import (
	"context"
	"testing"
	"time"
)

// The policy a miss was given rides with it: StartFunc gets it, and a
// FetchFunc finds it with PolicyOf, so the fetch side never looks the name
// up again.
func TestPolicyRidesWithTheMiss(t *testing.T) {
	route := new(int)
	pol := testPolicy
	pol.Route = route
	var started, fetched *Policy
	e := newEnv(t, func(c *Config) {
		c.Policy = func([]byte) *Policy { return &pol }
		c.Start = func(p *Policy, _ []byte, _ []byte, _ time.Duration, _ FetchDone) bool {
			started = p
			return false // the blocking path: FetchFunc
		}
		up := c.Fetch
		c.Fetch = func(ctx context.Context, qname string, query []byte) ([]byte, error) {
			fetched = PolicyOf(ctx)
			return up(ctx, qname, query)
		}
	})
	q := question(t, "r.example.")
	w := newWaiter()
	if _, how, _ := e.r.Start(q, w); how != Later {
		t.Fatalf("Start: %v", how)
	}
	w.wait(t)
	if started != &pol || fetched != &pol || started.Route != route {
		t.Fatalf("Start got %p, Fetch got %p, want %p", started, fetched, &pol)
	}
	if PolicyOf(context.Background()) != nil {
		t.Fatal("a policy outside a fetch")
	}
}
