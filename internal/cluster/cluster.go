// Package cluster asks the API server two one-shot questions about the
// cluster around this instance: whether this pod's DaemonSet is going away
// (an uninstall, after which the fallback's rules must go too, as opposed to
// a rollout or a deleted pod, after which they serve until the next pod
// adopts them), and which of our listen addresses are kube-dns' ClusterIP
// (kube-proxy translates it itself, so the fallback adds no DNAT for it).
// Each is one get of one named object (the least the manifest's Role can
// grant). It never watches, never writes, and answers "unknown" rather than
// guess when the API server cannot be asked or forbids the question.
package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"

	"github.com/nodelocaldns/nodelocaldns/internal/kubewatch"
)

// Client asks the questions.
type Client struct {
	core, apps *rest.RESTClient
}

// New makes a client for the API server at rc.
func New(rc *rest.Config) (*Client, error) {
	core, err := kubewatch.RESTClient(rc, "/api", corev1.SchemeGroupVersion, corev1.AddToScheme, "nodelocaldns-cluster")
	if err != nil {
		return nil, err
	}
	apps, err := kubewatch.RESTClient(rc, "/apis", appsv1.SchemeGroupVersion, appsv1.AddToScheme, "nodelocaldns-cluster")
	if err != nil {
		return nil, err
	}
	return &Client{core: core, apps: apps}, nil
}

// Owner is what the API server says about this pod's DaemonSet.
type Owner int

const (
	// Unknown: the question could not be answered (no pod name, an error,
	// forbidden, a pod no DaemonSet controls).
	Unknown Owner = iota
	// Staying: the DaemonSet exists and is not being deleted: this pod is
	// replaced (a rollout, a deleted or evicted pod).
	Staying
	// Leaving: the DaemonSet is gone, being deleted, or is another one of
	// the same name: nothing of ours will serve this node again.
	Leaving
)

func (o Owner) String() string {
	switch o {
	case Staying:
		return "staying"
	case Leaving:
		return "leaving"
	}
	return "unknown"
}

// DaemonSet says whether the DaemonSet whose pod is namespace/pod is
// staying or leaving; with Unknown, the error says why. The DaemonSet's
// name is the pod's less the suffix the DaemonSet controller adds to it
// ("nodelocaldns-x7k2q" is "nodelocaldns"'s): reading the pod would take a
// grant of every pod of the namespace, this one takes a get of one
// DaemonSet by name.
func (c *Client) DaemonSet(ctx context.Context, namespace, pod string) (Owner, error) {
	name, ok := daemonSetOf(pod)
	if namespace == "" || !ok {
		return Unknown, fmt.Errorf("this pod's name %q or namespace %q is not a DaemonSet pod's ($POD_NAME, $POD_NAMESPACE: the manifest's downward API)", pod, namespace)
	}
	var ds appsv1.DaemonSet
	err := c.apps.Get().Namespace(namespace).Resource("daemonsets").Name(name).Do(ctx).Into(&ds)
	switch {
	case apierrors.IsNotFound(err):
		return Leaving, nil
	case err != nil:
		return Unknown, fmt.Errorf("get daemonset %s/%s: %w", namespace, name, err)
	case ds.DeletionTimestamp != nil:
		return Leaving, nil
	}
	return Staying, nil
}

// daemonSetOf is the DaemonSet a pod name is generated from: NAME-XXXXX,
// five characters of the controller's alphabet (lower-case consonants
// and digits).
func daemonSetOf(pod string) (string, bool) {
	i := strings.LastIndexByte(pod, '-')
	if i <= 0 || len(pod)-i-1 != 5 {
		return "", false
	}
	for _, r := range pod[i+1:] {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			return "", false
		}
	}
	return pod[:i], true
}

// ServiceIPs returns those of addrs that are the ClusterIP of Service
// namespace/name (kube-dns: the ClusterIP a node cache serves in iptables
// mode is kube-dns' own).
func (c *Client) ServiceIPs(ctx context.Context, namespace, name string, addrs []netip.Addr) ([]netip.Addr, error) {
	var svc corev1.Service
	if err := c.core.Get().Namespace(namespace).Resource("services").Name(name).Do(ctx).Into(&svc); err != nil {
		return nil, fmt.Errorf("get service %s/%s: %w", namespace, name, err)
	}
	var out []netip.Addr
	for _, ip := range append([]string{svc.Spec.ClusterIP}, svc.Spec.ClusterIPs...) {
		a, err := netip.ParseAddr(ip)
		if err != nil {
			continue
		}
		for _, x := range addrs {
			if x == a.Unmap() && !slices.Contains(out, x) {
				out = append(out, x)
			}
		}
	}
	return out, nil
}

// Revoked reports whether err says the API server no longer accepts this
// pod's credentials or rights (401, 403): after they worked once, the
// manifest that granted them is being deleted (kubectl delete -f deletes
// the ServiceAccount and its Role before the DaemonSet).
func Revoked(err error) bool {
	return apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err)
}
