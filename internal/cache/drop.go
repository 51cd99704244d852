package cache

import "github.com/nodelocaldns/nodelocaldns/internal/wire"

// DropZone removes every entry whose question name is zoneWire or below it
// (zoneWire is an uncompressed wire name; case is ignored; the root zone
// matches every entry) and returns how many it removed. It is for a change
// of the upstreams of a zone (a stub domain added, removed or pointed
// elsewhere): answers from the old upstreams must not outlive the change,
// while entries of other zones stay. It walks each shard under its lock, so
// it costs time proportional to the cache size: call it on configuration
// changes, never per query. Removals are not counted as evictions.
func (c *Cache) DropZone(zoneWire []byte) int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		for _, e := range s.items {
			if wire.InZone(e.msg[wire.HeaderLen:wire.HeaderLen+int(e.nameLen)], zoneWire) {
				c.remove(s, e)
				n++
			}
		}
		s.mu.Unlock()
	}
	return n
}
