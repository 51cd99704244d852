// Package dnslog is the Corefile's `log` directive: CoreDNS's query log,
// line for line. A block's log lines are Rules (a name scope, the classes
// of answers logged, a format of CoreDNS's {placeholders}), compiled into
// the block's Log; a query is logged by the Log of the block that answers
// it, through the first of its rules whose scope holds the name, when the
// answer's class (CoreDNS's response.Classify: success, denial, error) is
// one the rule logs. Each line is written as CoreDNS's log plugin writes
// it: "[INFO] " and the format filled in.
//
// It owns the formats (CommonFormat, CombinedFormat), the classes and the
// placeholders; internal/corefile reads the directive into Rules,
// internal/blocks compiles each block's Log into the block table (which
// block answers a name is decided there, not here), and the server calls
// Log.Log once per answered query whose block logs. It opens no sockets.
package dnslog

import (
	"fmt"
	"strings"
)

// Class is a set of CoreDNS's response classes.
type Class uint8

// The classes of CoreDNS's plugin/pkg/response: success (NOERROR with an
// answer or a delegation), denial (NXDOMAIN, NODATA), error (anything
// else: SERVFAIL, REFUSED, ...). All is every class.
const (
	Success Class = 1 << iota
	Denial
	Error
	All = Success | Denial | Error
)

// ParseClass reads one of CoreDNS's class names: all, success, denial,
// error.
func ParseClass(s string) (Class, error) {
	switch s {
	case "all":
		return All, nil
	case "success":
		return Success, nil
	case "denial":
		return Denial, nil
	case "error":
		return Error, nil
	}
	return 0, fmt.Errorf("invalid class %q (all, success, denial, error)", s)
}

func (c Class) String() string {
	if c == All {
		return "all"
	}
	var out []string
	for _, x := range []struct {
		c Class
		n string
	}{{Success, "success"}, {Denial, "denial"}, {Error, "error"}} {
		if c&x.c != 0 {
			out = append(out, x.n)
		}
	}
	return strings.Join(out, ",")
}

// The formats of CoreDNS's log plugin (plugin/log/log.go): the default is
// CommonFormat; a format may name them as {common} and {combined}.
const (
	CommonFormat   = `{remote}:{port} - {>id} "{type} {class} {name} {proto} {size} {>do} {>bufsize}" {rcode} {>rflags} {rsize} {duration}`
	CombinedFormat = CommonFormat + ` "{>opcode}"`
	DefaultFormat  = CommonFormat
)

// ExpandFormat replaces {common} and {combined} in a format written in a
// Corefile, as CoreDNS's log setup does.
func ExpandFormat(f string) string {
	f = strings.ReplaceAll(f, "{common}", CommonFormat)
	return strings.ReplaceAll(f, "{combined}", CombinedFormat)
}

// Rule is one name scope of one `log` line of a block.
type Rule struct {
	// Scope is the names logged: a zone as written, made fully qualified
	// (CoreDNS matches it case-insensitively).
	Scope string
	// Classes are the answers logged (All when the line has no class).
	Classes Class
	// Format is the line's format, {common} and {combined} expanded.
	Format string
	// Metadata: the block has the Corefile's metadata, so the labels the
	// log itself sets (CoreDNS's log/type and log/class, the answer's
	// response type and class) have values; other {/label}s print "-",
	// as without it.
	Metadata bool
}

func (r Rule) String() string {
	if r.Metadata {
		return fmt.Sprintf("%s class %s format %q metadata", r.Scope, r.Classes, r.Format)
	}
	return fmt.Sprintf("%s class %s format %q", r.Scope, r.Classes, r.Format)
}

// MetadataLabels are the metadata labels with values here, as the stock
// node-cache's plugins set them (only log sets any of the labels a log
// line can show: forward's forward/upstream is not provided,
// internal/corefile refuses a format showing it with metadata on).
var MetadataLabels = []string{"log/type", "log/class"}
