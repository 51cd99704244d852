// Package kubewatch is what the daemon's two API watches share (the pods
// of its node, internal/podwatch; kube-dns' EndpointSlices,
// internal/endpoints): a REST client for one API group with a scheme that
// knows only that group, speaking protobuf; a list-watch that reports the
// outcome of every list and watch call, so a watch can say whether it is
// synced or lost; the standing kept from those outcomes (starting, synced,
// lost, forbidden) with its three metrics; and an informer run until its
// context ends. What each watch keeps, and what it does when lost, stay
// with the watch.
package kubewatch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// RESTClient is a REST client for the group gv at apiPath ("/api" for
// core, "/apis" for the others), with a scheme holding only what add
// registers (a typed clientset would register every API group) and
// protobuf (a quarter of JSON's decoding cost for pod lists). userAgent is
// used when c sets none.
func RESTClient(c *rest.Config, apiPath string, gv schema.GroupVersion, add func(*runtime.Scheme) error, userAgent string) (*rest.RESTClient, error) {
	scheme := runtime.NewScheme()
	if err := add(scheme); err != nil {
		return nil, err
	}
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Group: gv.Group, Version: gv.Version})
	cfg := rest.CopyConfig(c)
	cfg.APIPath = apiPath
	cfg.GroupVersion = &gv
	cfg.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	if cfg.UserAgent == "" {
		cfg.UserAgent = userAgent
	}
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	// Never follow a redirect: the bearer token is added by the transport,
	// to whatever host a 3xx names (issue 41). The 3xx is the answer: an
	// error, as any unexpected status.
	noRedirect := *hc // a copy: it may be http.DefaultClient
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	rc, err := rest.RESTClientForConfigAndClient(cfg, &noRedirect)
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	return rc, nil
}

// Noting is a list-watch that tells Note the outcome of every list and
// watch call (nil: it succeeded). The reflector resumes from its last
// resource version (or relists when that expired), so a successful call
// after a failure means the view is catching up with the server.
type Noting struct {
	LW   cache.ListerWatcherWithContext
	Note func(err error)
}

// List and Watch make it a cache.ListerWatcher; the reflector calls the
// context variants.
func (n *Noting) List(opts metav1.ListOptions) (runtime.Object, error) {
	return n.ListWithContext(context.Background(), opts)
}

// Watch is WatchWithContext without a context.
func (n *Noting) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return n.WatchWithContext(context.Background(), opts)
}

// ListWithContext lists and notes the outcome.
func (n *Noting) ListWithContext(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
	obj, err := n.LW.ListWithContext(ctx, opts)
	n.Note(err)
	return obj, err
}

// WatchWithContext watches and notes the outcome.
func (n *Noting) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	wi, err := n.LW.WatchWithContext(ctx, opts)
	n.Note(err)
	return wi, err
}

var _ cache.ListerWatcherWithContext = (*Noting)(nil)

// NoLoss reports whether err is no loss of the API server: the watch
// ending (context canceled), or an expired resource version (the
// reflector's cue to relist at once).
func NoLoss(err error) bool {
	return errors.Is(err, context.Canceled) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
}

// Informer is what Run runs: a list-watch of objects of Type, each
// changed by Transform (nil: kept as delivered) before it is stored,
// re-delivered every Resync (0: never).
type Informer struct {
	LW        cache.ListerWatcher
	Type      runtime.Object
	Resync    time.Duration
	Transform cache.TransformFunc
	// Update gets each object added or changed, Remove each deleted (or
	// its cache.DeletedFinalStateUnknown).
	Update, Remove func(obj any)
	// Synced is called once, when the first list has been delivered.
	Synced func()
}

// Run runs the informer in until ctx ends. client-go's own lines (each
// failed list or watch, with its backoff) are not logged: the watches log
// their state changes, one line each.
func Run(ctx context.Context, in Informer) {
	opts := cache.InformerOptions{
		ListerWatcher: in.LW,
		ObjectType:    in.Type,
		ResyncPeriod:  in.Resync,
		Transform:     in.Transform,
		Handler: cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { in.Update(obj) },
			UpdateFunc: func(_, obj any) { in.Update(obj) },
			DeleteFunc: func(obj any) {
				if in.Remove != nil {
					in.Remove(obj)
				}
			},
		},
	}
	quiet := logr.Discard()
	opts.Logger = &quiet
	_, ctrl := cache.NewInformerWithOptions(opts)
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctrl.RunWithContext(ctx)
	}()
	if cache.WaitForCacheSync(ctx.Done(), ctrl.HasSynced) {
		in.Synced()
	}
	<-done
}
