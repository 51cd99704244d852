package config

// DefaultClusterDomain is the Kubernetes default cluster domain.
//
// The serving path's defaults live with their owners (resolve, server,
// cache, forward: each one's defaults.go or Default* constants), which use
// them for a zero field; the flags read them from there, so a default is
// written once and the engines import no configuration.
const DefaultClusterDomain = "cluster.local."
