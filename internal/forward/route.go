package forward

// Route sends the names at and below Zone to Group: one entry of the shared
// route table (kube-dns, the stub domains, the Corefile's forward blocks,
// "." to the node's resolvers). Which route serves a name is decided where
// every other per-name decision is, in internal/blocks' table, which
// internal/running compiles the routes into; Zone is a lower-case FQDN there.
type Route struct {
	Zone  string
	Group *Group
}
