package directive

import (
	"context"
	"slices"
	"testing"

	"github.com/miekg/dns"
)

type passOn struct{}

func (passOn) Serve(ctx context.Context, r *dns.Msg, next Next) (*dns.Msg, error) {
	return next(ctx, r)
}

func TestRegisterOnceAndLookUp(t *testing.T) {
	Register("test-pass", func(Env, any) (Handler, error) { return passOn{}, nil })
	t.Cleanup(func() { registered.Remove("test-pass") })
	setup, ok := Registered("test-pass")
	if !ok || !slices.Contains(Names(), "test-pass") {
		t.Fatal("not registered")
	}
	if _, ok := Registered("forward"); ok {
		t.Fatal("forward has no fetch-side handler")
	}
	h, err := setup(Env{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := new(dns.Msg)
	got, err := h.Serve(context.Background(), new(dns.Msg), func(context.Context, *dns.Msg) (*dns.Msg, error) { return want, nil })
	if err != nil || got != want {
		t.Fatalf("Serve: %v %v", got, err)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a second registration of one name did not panic")
		}
	}()
	Register("test-pass", func(Env, any) (Handler, error) { return passOn{}, nil })
}
