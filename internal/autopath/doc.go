// Package autopath answers a pod's search-path query in one round trip:
// for a query X.<first search domain of that pod>, made because X has fewer
// dots than the pod's ndots, it resolves the pod's remaining candidates
// (X.<second domain>, …, X itself) in parallel through an injected resolve
// function and answers with a CNAME from the name asked to the first
// candidate that exists, followed by its records, when that is exactly what
// every stub resolver (glibc, musl, Go) would have ended with by itself.
// Otherwise it declines and the query is answered as usual.
//
// The decision for (pod address, name) is made once and kept for a few
// seconds, so the A and AAAA queries of one lookup always agree. It takes
// the pods from internal/podwatch; it opens no sockets and caches no DNS
// answers of its own (the resolve function goes through the cache).
//
// Hook (hook.go) is its wiring for internal/server (server.Autopath): it
// resolves the candidates through the query's view's internal/resolve
// Resolver, so they are cached, coalesced and admitted as any miss.
package autopath
