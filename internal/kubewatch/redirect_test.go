package kubewatch

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// TestRedirectNotFollowed: an "API server" that answers with a redirect
// to another host gets an error back, and the other host sees nothing:
// not the request, not the bearer token the transport would have added
// there (issue 41).
func TestRedirectNotFollowed(t *testing.T) {
	var reached, token atomic.Int32
	elsewhere := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		if r.Header.Get("Authorization") != "" {
			token.Add(1)
		}
		w.WriteHeader(http.StatusNotFound)
	}))
	defer elsewhere.Close()
	for _, code := range []int{http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, elsewhere.URL+r.URL.RequestURI(), code)
		}))
		rc, err := RESTClient(&rest.Config{Host: api.URL, BearerToken: "secret-token"}, "/api", corev1.SchemeGroupVersion, corev1.AddToScheme, "kubewatch-test")
		if err != nil {
			t.Fatal(err)
		}
		lw := cache.NewListWatchFromClient(rc, "pods", "", fields.Everything())
		if _, err := lw.ListWithContext(context.Background(), metav1.ListOptions{}); err == nil {
			t.Errorf("%d: the list succeeded", code)
		}
		api.Close()
	}
	if reached.Load() != 0 || token.Load() != 0 {
		t.Errorf("the redirect's target got %d requests, %d with the token", reached.Load(), token.Load())
	}
}
