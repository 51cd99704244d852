// Package cache holds DNS answers as packed wire bytes and answers cache
// hits without unpacking them.
//
// An Entry is built once from an upstream response (Build): the question
// name is lower-cased, the OPT record removed (it is hop-by-hop), and the
// offset of every TTL field and the end of every record recorded. A hit
// (Entry.Write) copies the bytes, writes the client's ID, RD bit and qname
// case, the remaining TTLs and the client's OPT; an answer larger than the
// client's payload size keeps the whole records that fit (as miekg/dns's
// Msg.Truncate) and sets TC.
//
// Lifetimes follow docs/design.md ("Cache decisions"): a positive answer lives for the smallest TTL
// of its answer and authority records, a denial (NXDOMAIN or NODATA) for
// min(SOA TTL, SOA MINIMUM) (RFC 2308 §5), each clamped by a Policy; a
// SERVFAIL for a few seconds at most; REFUSED, FORMERR, NOTIMP, truncated
// answers, denials without an SOA and answers to another question are never
// stored.
//
// The Cache is sharded and bounded by entry capacities per kind and by a
// byte budget, with exact entry and byte gauges. To make room it evicts
// every expired entry of the shard when a sweep is due, else the first
// expired entry or the least hit of a few entries sampled at random (the
// least recently used of them on a tie): strict LRU evicts exactly the
// name a cyclic workload asks for next. Coalescing and the serve-stale policy live
// in package resolve. The package parses no flags, logs nothing and knows
// no upstreams.
package cache
