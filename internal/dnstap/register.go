package dnstap

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// The dnstap directive: read from the Corefile here (corefile.Register),
// its messages sent by the handler of every block that has it
// (answer.Register, handler.go), through one Tap per distinct
// configuration, which whoever runs the handlers owns.
func init() {
	corefile.Register("dnstap", corefile.Spec{
		Parse:      parse,
		Repeatable: true,
		Forms:      "dnstap SOCKET (PATH, unix://PATH, tcp://HOST:PORT, tls://HOST:PORT) [full [WRITEBUFFER_MIB [QUEUE_x10000]]] [{ identity IDENTITY; version VERSION; extra EXTRA; skipverify }]",
		Distinct: func(cfg any) []string {
			var keys []string
			for _, c := range cfg.([]Config) {
				keys = append(keys, c.Key())
			}
			return keys
		},
		MaxDistinct:  MaxTaps,
		DistinctCost: "a queue, a connection and a goroutine",
		Describe:     describe,
		Dials:        dials,
	})
	answer.Register("dnstap", setup)
}

// parse reads one dnstap line, `dnstap SOCKET [full [WRITEBUFFER
// [QUEUE]]] { identity X; version X; extra X; skipverify }`, as CoreDNS
// 1.13 (the stock's) and 1.15 read it, and appends it to the block's
// ([]Config). Where CoreDNS ignores a word (a second argument that is not
// `full`, arguments past the fourth, an unknown option, an option's
// second argument) we refuse it: nothing written is dropped silently. An
// extra with {placeholders} is refused: CoreDNS fills them from the
// request and metadata per message, we send extra as written.
func parse(_ *corefile.Server, d *corefile.Directive, prev any) (any, error) {
	cfgs, _ := prev.([]Config)
	a := d.ArgStrings()
	if len(a) == 0 || len(a) > 4 {
		return nil, corefile.Bad(d, "takes a socket and at most three more arguments")
	}
	c := Config{WriteBufferMiB: 1, QueueMultiple: 1, Identity: Hostname(), Version: DefaultVersion()}
	var err error
	if c.Network, c.Address, err = ParseEndpoint(a[0]); err != nil {
		return nil, corefile.Bad(d, "%v", err)
	}
	if len(a) >= 2 {
		if a[1] != "full" {
			return nil, corefile.Bad(d, "the second argument is full or nothing, not %q (CoreDNS ignores it)", a[1])
		}
		c.Full = true
	}
	num := func(v string, max int, what string) (int, error) {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > max {
			return 0, fmt.Errorf("%s %q: want 1 to %d", what, v, max)
		}
		return n, nil
	}
	if len(a) >= 3 {
		if c.WriteBufferMiB, err = num(a[2], MaxWriteBufferMiB, "write buffer (MiB)"); err != nil {
			return nil, corefile.Bad(d, "%v", err)
		}
	}
	if len(a) >= 4 {
		if c.QueueMultiple, err = num(a[3], MaxQueueMultiple, "queue (x10000 messages)"); err != nil {
			return nil, corefile.Bad(d, "%v", err)
		}
	}
	for _, o := range d.Block {
		if err := parseOption(d, o, &c); err != nil {
			return nil, err
		}
	}
	return append(cfgs, c), nil
}

// parseOption reads one option of a dnstap block into c.
func parseOption(d, o *corefile.Directive, c *Config) error {
	switch o.Name {
	case "skipverify":
		if len(o.Args) != 0 {
			return corefile.BadOpt(d, o, "skipverify takes no argument")
		}
		if c.Network != "tls" {
			return corefile.BadOpt(d, o, "skipverify is for a tls:// socket (CoreDNS ignores it elsewhere)")
		}
		c.SkipVerify = true
	case "identity", "version", "extra":
		if len(o.Args) != 1 {
			return corefile.BadOpt(d, o, "%s takes one argument", o.Name)
		}
		v := o.Args[0].Text
		switch o.Name {
		case "identity":
			c.Identity = v
		case "version":
			c.Version = v
		case "extra":
			if strings.ContainsAny(v, "{}") {
				return corefile.BadOpt(d, o, "%v", errors.New("extra with {placeholders} is not supported (we send extra as written; no directive of ours sets metadata)"))
			}
			c.Extra = v
		}
	default:
		return corefile.BadOpt(d, o, "option %s is not supported", o.Name)
	}
	return nil
}

// describe says, for -check-config, what each of the block's taps sends.
func describe(_ *corefile.Server, cfg any) []string {
	var out []string
	for _, t := range cfg.([]Config) {
		full := ""
		if t.Full {
			full = " full"
		}
		q := fmt.Sprintf("a queue of %d messages", t.QueueLen())
		if asked := max(t.QueueMultiple, 1) * QueueUnit; asked > t.QueueLen() {
			q = fmt.Sprintf("a queue of %d messages (QUEUE asks for %d: at most %d here, each slot allocated at start)", t.QueueLen(), asked, MaxQueueLen)
		}
		out = append(out, fmt.Sprintf("dnstap %s%s: CLIENT_QUERY and CLIENT_RESPONSE of every query this block answers (cache hits too), identity %q, version %q; %s and at most %d MiB waiting in all taps, dropped and counted when the collector is slow or gone", t.Endpoint(), full, t.Identity, t.Version, q, MaxQueueBytes>>20))
	}
	return out
}

// dials are the collectors the block's taps send to over the network.
func dials(cfg any) []corefile.Dial {
	var out []corefile.Dial
	for _, t := range cfg.([]Config) {
		if ap, err := netip.ParseAddrPort(t.Address); err == nil && t.Network != "unix" {
			out = append(out, corefile.Dial{Addr: ap, What: "dnstap " + t.Endpoint(), Why: "its frames would come back to us as queries, tapped in turn"})
		}
	}
	return out
}
