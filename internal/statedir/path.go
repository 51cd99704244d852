package statedir

import "path/filepath"

// Path is the file name in this group's directory: what twins share
// besides the registry (internal/daemon's cache snapshot).
func (r *Registry) Path(name string) string { return filepath.Join(r.dir, name) }
