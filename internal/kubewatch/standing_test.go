package kubewatch

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestStandingTransitions(t *testing.T) {
	var changes []string
	s := NewStanding("test", "watch", StandingHelp{Losses: "l", Errors: "e", Synced: "s"})
	s.Changed = func(old, now State, _ error) { changes = append(changes, old.String()+">"+now.String()) }
	down := errors.New("connection refused")

	s.Note(down) // before the first sync: lost, but a success does not sync it
	s.Note(nil)
	if s.State() != Lost {
		t.Fatalf("a call that succeeds before the first sync: %v, want lost", s.State())
	}
	s.FirstSync()
	s.Note(context.Canceled) // the watch ending is no loss
	s.Note(down)
	s.Note(down)
	s.Note(nil)
	if s.State() != Synced {
		t.Fatalf("state %v after a success, want synced", s.State())
	}
	want := []string{"starting>lost", "lost>synced", "synced>lost", "lost>synced"}
	if len(changes) != len(want) {
		t.Fatalf("changes %v, want %v", changes, want)
	}
	for i := range want {
		if changes[i] != want[i] {
			t.Fatalf("changes %v, want %v", changes, want)
		}
	}
	if l, e := testutil.ToFloat64(s.losses), testutil.ToFloat64(s.errors); l != 2 || e != 3 {
		t.Errorf("losses %v errors %v, want 2 and 3", l, e)
	}
	if v := testutil.ToFloat64(s.synced); v != 1 {
		t.Errorf("synced gauge %v", v)
	}
}

func TestStandingForbiddenStops(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "endpointslices"}, "", errors.New("RBAC"))
	s := NewStanding("test", "watch", StandingHelp{Losses: "l", Errors: "e", Synced: "s"})
	if s.Note(forbidden) {
		t.Fatal("a watch that does not ask for it was stopped on Forbidden")
	}
	if s.State() != Lost {
		t.Fatalf("state %v, want lost", s.State())
	}

	s = NewStanding("test", "watch", StandingHelp{Losses: "l", Errors: "e", Synced: "s"})
	s.StopOnForbidden = true
	if !s.Note(forbidden) || s.State() != Forbidden {
		t.Fatalf("first list forbidden: state %v, want forbidden and stop", s.State())
	}
	s.FirstSync()
	s.Note(nil)
	if s.State() != Forbidden {
		t.Fatalf("forbidden must stay: %v", s.State())
	}

	s = NewStanding("test", "watch", StandingHelp{Losses: "l", Errors: "e", Synced: "s"})
	s.StopOnForbidden = true
	s.FirstSync()
	if s.Note(forbidden) || s.State() != Lost {
		t.Fatalf("a 403 after the first sync (an API server restarting): state %v, want lost, not stopped", s.State())
	}
}
