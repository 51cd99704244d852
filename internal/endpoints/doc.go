// Package endpoints follows the EndpointSlices of one Service, kube-dns' (the Service whose
// ClusterIP the cache forwards the cluster domain to), through the Kubernetes API with
// client-go's informer, and says which of its endpoints are ready: the addresses and the TCP
// port (the slice's "dns-tcp" port) the cache may ask directly instead of the ClusterIP.
//
// An endpoint is in use while its slice says ready (an unknown readiness counts as ready, as
// the API says) and not terminating; at most Config.Max are in use, chosen per node by
// rendezvous hashing (each node keeps its own stable subset, so the nodes together spread over
// every pod), and the others are counted. An endpoint that is one of our own listen sockets (a
// loop), or loopback, link-local, unspecified or multicast (no pod's), is never asked, and is
// counted and logged (View.Rejected). The view keeps the last known endpoints while the
// API server is unreachable. A watch the API server forbids (no RBAC for endpointslices) stops
// at once with one log line: the cache then keeps the ClusterIP.
//
// It answers no DNS and opens no connection to the endpoints (internal/forward does); it never
// writes to the API server.
package endpoints
