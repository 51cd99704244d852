package cache

import "github.com/nodelocaldns/nodelocaldns/internal/wire"

// KeyFlags returns the bits of q that are part of a cache key besides the
// question (DO and CD), so a coalescer outside the package keys questions
// exactly as the cache does.
func KeyFlags(q *wire.Query) uint8 { return keyFlags(q) }
