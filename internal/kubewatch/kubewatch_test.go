package kubewatch

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/nodelocaldns/nodelocaldns/test/apiserver"
)

// Against a real kube-apiserver: the client lists core/v1 over protobuf,
// Noting reports each call's outcome (nil, then the refusal of a token
// without rights, then nil again), and Run delivers the first list before
// it says synced.
func TestWatchNamespacesThroughRealAPIServer(t *testing.T) {
	s := apiserver.Start(t)
	s.CreateNamespace("one")

	var mu sync.Mutex
	var notes []error
	note := func(err error) { mu.Lock(); notes = append(notes, err); mu.Unlock() }
	last := func() (int, error) {
		mu.Lock()
		defer mu.Unlock()
		if len(notes) == 0 {
			return 0, nil
		}
		return len(notes), notes[len(notes)-1]
	}

	rc, err := RESTClient(s.Config(s.AdminToken), "/api", corev1.SchemeGroupVersion, corev1.AddToScheme, "kubewatch-test")
	if err != nil {
		t.Fatal(err)
	}
	lw := &Noting{LW: cache.NewListWatchFromClient(rc, "namespaces", "", fields.Everything()), Note: note}
	obj, err := lw.List(metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l, ok := obj.(*corev1.NamespaceList); !ok || len(l.Items) == 0 {
		t.Fatalf("listed %T %v", obj, obj)
	}
	if n, err := last(); n != 1 || err != nil {
		t.Fatalf("after a list: %d notes, last %v", n, err)
	}

	// A token the server does not know: the call fails and Note hears it.
	bad, err := RESTClient(s.Config("not-a-token"), "/api", corev1.SchemeGroupVersion, corev1.AddToScheme, "kubewatch-test")
	if err != nil {
		t.Fatal(err)
	}
	badLW := &Noting{LW: cache.NewListWatchFromClient(bad, "namespaces", "", fields.Everything()), Note: note}
	if _, err := badLW.List(metav1.ListOptions{}); err == nil {
		t.Fatal("a list with an unknown token succeeded")
	}
	if n, err := last(); n != 2 || !apierrors.IsUnauthorized(err) || NoLoss(err) {
		t.Fatalf("after a refused list: %d notes, last %v (NoLoss %v)", n, err, NoLoss(err))
	}

	ctx, cancel := context.WithCancel(context.Background())
	seen := make(chan string, 16)
	synced := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, Informer{LW: lw, Type: &corev1.Namespace{},
			Update: func(o any) { seen <- o.(*corev1.Namespace).Name }, Synced: func() { close(synced) }})
	}()
	select {
	case <-synced:
	case <-time.After(30 * time.Second):
		t.Fatal("not synced within 30 s")
	}
	found := false
	for len(seen) > 0 {
		if <-seen == "one" {
			found = true
		}
	}
	if !found {
		t.Error("synced before namespace one was delivered")
	}
	if _, err := last(); err != nil {
		t.Errorf("the informer's list noted %v", err)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return when its context ended")
	}
}

func TestNoLoss(t *testing.T) {
	gr := schema.GroupResource{Resource: "pods"}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{context.Canceled, true},
		{apierrors.NewResourceExpired("too old"), true},
		{&apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 410, Reason: metav1.StatusReasonGone}}, true},
		{apierrors.NewForbidden(gr, "", nil), false},
		{apierrors.NewServiceUnavailable("down"), false},
	} {
		if got := NoLoss(c.err); got != c.want {
			t.Errorf("NoLoss(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
