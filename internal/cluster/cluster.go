// Package cluster asks the API server two one-shot questions about the
// cluster around this instance: whether this pod's DaemonSet is going away
// (an uninstall, after which the fallback's rules must go too, as opposed to
// a rollout or a deleted pod, after which they serve until the next pod
// adopts them), and which of our listen addresses are a Service's ClusterIP
// (kube-proxy translates those itself, so the fallback adds no DNAT for
// them). It never watches, never writes, and answers "unknown" rather than
// guess when the API server cannot be asked or forbids the question.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// DaemonSet says whether the DaemonSet controlling pod namespace/name is
// staying or leaving; with Unknown, the error says why.
func (c *Client) DaemonSet(ctx context.Context, namespace, name string) (Owner, error) {
	if namespace == "" || name == "" {
		return Unknown, errors.New("this pod's name or namespace is unknown ($POD_NAME, $POD_NAMESPACE: the manifest's downward API)")
	}
	var pod corev1.Pod
	if err := c.core.Get().Namespace(namespace).Resource("pods").Name(name).Do(ctx).Into(&pod); err != nil {
		return Unknown, fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	var ref *metav1.OwnerReference
	for i, r := range pod.OwnerReferences {
		if r.Controller != nil && *r.Controller && r.Kind == "DaemonSet" {
			ref = &pod.OwnerReferences[i]
		}
	}
	if ref == nil {
		return Unknown, fmt.Errorf("pod %s/%s is not a DaemonSet's", namespace, name)
	}
	var ds appsv1.DaemonSet
	err := c.apps.Get().Namespace(namespace).Resource("daemonsets").Name(ref.Name).Do(ctx).Into(&ds)
	switch {
	case apierrors.IsNotFound(err):
		return Leaving, nil
	case err != nil:
		return Unknown, fmt.Errorf("get daemonset %s/%s: %w", namespace, ref.Name, err)
	case ds.DeletionTimestamp != nil || ds.UID != ref.UID:
		return Leaving, nil
	}
	return Staying, nil
}

// ServiceIPs returns those of addrs that are the ClusterIP of a Service in
// namespace (kube-dns' namespace: the ClusterIP a node cache serves in
// iptables mode is kube-dns' own).
func (c *Client) ServiceIPs(ctx context.Context, namespace string, addrs []netip.Addr) ([]netip.Addr, error) {
	var list corev1.ServiceList
	if err := c.core.Get().Namespace(namespace).Resource("services").Do(ctx).Into(&list); err != nil {
		return nil, fmt.Errorf("list services in %s: %w", namespace, err)
	}
	var out []netip.Addr
	for _, s := range list.Items {
		ips := append([]string{s.Spec.ClusterIP}, s.Spec.ClusterIPs...)
		for _, ip := range ips {
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
