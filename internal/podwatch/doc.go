// Package podwatch knows, for each pod IP on this node, the search list and
// ndots the kubelet wrote into that pod's resolv.conf. It watches only the
// pods of its own node (field selector spec.nodeName) through the
// Kubernetes API with client-go's informer (list, watch, resync, relist
// when the watch expires, backoff), keeps only the fields it needs, and
// says whether its view is synced with the API server or lost.
//
// It answers no DNS and decides nothing about queries (internal/autopath
// does); it never writes to the API server.
package podwatch
