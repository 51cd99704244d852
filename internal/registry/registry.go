// Package registry is the one kind of process-wide state the daemon keeps:
// a table filled once, from init functions, of what a package offers by
// name (a directive's reading, its handlers), then only read. It holds
// nothing else and imports nothing of the module.
package registry

import (
	"fmt"
	"slices"
	"sync"
)

// Of maps names to the values registered under them. Safe for concurrent
// use.
type Of[T any] struct {
	what string // for the panic of a name registered twice
	mu   sync.RWMutex
	m    map[string]T
}

// New returns an empty registry; what names it in panics.
func New[T any](what string) *Of[T] { return &Of[T]{what: what, m: map[string]T{}} }

// Register makes v the value of name. It panics when name is registered
// twice (a programming error, found at start).
func (r *Of[T]) Register(name string, v T) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.m[name]; dup {
		panic(fmt.Sprintf("%s: %q registered twice", r.what, name))
	}
	r.m[name] = v
}

// Get returns the value of name; false: none is registered.
func (r *Of[T]) Get(name string) (T, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	v, ok := r.m[name]
	return v, ok
}

// Names lists the names registered, sorted.
func (r *Of[T]) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.m))
	for n := range r.m {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Remove forgets name (a test's registration, undone).
func (r *Of[T]) Remove(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, name)
}
