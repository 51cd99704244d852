// Package stubs tests that the cache is transparent to the stub resolvers
// pods really use: glibc, musl (built with musl-gcc -static; Debian's musl
// 1.2.3 has no TCP fallback), Go's resolver, Node.js's c-ares and kdig,
// each run in a network namespace the test creates against a real upstream
// written in the test, once straight to the upstream and twice through the
// nodelocaldns binary.
// The package holds tests only.
package stubs
