// Package cache holds DNS answers as packed wire bytes and answers cache
// hits without unpacking them.
//
// An Entry is built once from an upstream response (Build): the question
// name is lower-cased, the OPT record removed (it is hop-by-hop), and the
// offset of every TTL field recorded. A hit (Entry.Write) copies the bytes,
// writes the client's ID, RD bit and qname case, the remaining TTLs and the
// client's OPT, and truncates to the client's payload size with TC set.
//
// Lifetimes follow docs/design.md ("Cache decisions"): a positive answer lives for the smallest TTL
// of its answer and authority records, a denial (NXDOMAIN or NODATA) for
// min(SOA TTL, SOA MINIMUM) (RFC 2308 §5), each clamped by a Policy; a
// SERVFAIL for a few seconds at most; REFUSED, FORMERR, NOTIMP, truncated
// answers, denials without an SOA and answers to another question are never
// stored.
//
// The Cache is sharded and bounded by entry capacities per kind and by a
// byte budget, with exact entry and byte gauges. To make room it evicts an
// expired entry near the least recently used end, else the least hit of a
// few entries sampled at random. Flight coalesces concurrent misses. The
// package parses no flags, logs nothing and knows no upstreams.
package cache
