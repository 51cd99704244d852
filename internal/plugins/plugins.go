// Package plugins is the one list of the Corefile's directives compiled
// in (CoreDNS's core/plugin/zplugin.go): each package below registers its
// directive (internal/directive for the fetch side, internal/answer for
// the answer side) from an init function, and importing this package is
// what links them in. Adding a directive adds its package and one line
// here. It holds no code of its own.
package plugins

import (
	_ "github.com/nodelocaldns/nodelocaldns/internal/acl"
	_ "github.com/nodelocaldns/nodelocaldns/internal/dns64"
	_ "github.com/nodelocaldns/nodelocaldns/internal/dnslog"
	_ "github.com/nodelocaldns/nodelocaldns/internal/dnstap"
	_ "github.com/nodelocaldns/nodelocaldns/internal/hosts"
	_ "github.com/nodelocaldns/nodelocaldns/internal/loadbalance"
	_ "github.com/nodelocaldns/nodelocaldns/internal/rewrite"
	_ "github.com/nodelocaldns/nodelocaldns/internal/template"
	_ "github.com/nodelocaldns/nodelocaldns/internal/trace"
	_ "github.com/nodelocaldns/nodelocaldns/internal/whoami"
)
