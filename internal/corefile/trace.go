package corefile

import (
	"strconv"
	"strings"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/trace"
)

// setupTrace reads `trace` as CoreDNS 1.13's plugin/trace (the stock
// node-cache's) does: an optional endpoint type (zipkin, datadog; any
// case) and endpoint, and a block of every, service, client_server,
// datadog_analytics_rate and the zipkin reporter's bounds. CoreDNS skips
// an option it does not know; we refuse it (nothing in a Corefile is
// silently ignored), and refuse an option of the other endpoint type
// (CoreDNS accepts zipkin_* with datadog and datadog_analytics_rate with
// zipkin, and they do nothing).
func setupTrace(s *Server, d *Directive) error {
	c := trace.Config{Every: trace.DefaultEvery}
	switch len(d.Args) {
	case 0:
	case 1:
		c.Endpoint = d.Args[0].Text
	case 2:
		c.Type, c.Endpoint = strings.ToLower(d.Args[0].Text), d.Args[1].Text
		if c.Type != trace.Zipkin && c.Type != trace.Datadog {
			return bad(d, "tracing endpoint type '%s' is not supported", c.Type)
		}
	default:
		return bad(d, "takes at most two arguments")
	}
	if c.Type == "" {
		c.Type = trace.DefaultType
	}
	if c.Type == trace.Datadog && strings.Contains(c.Endpoint, "/") {
		return bad(d, "datadog: the endpoint is the agent's HOST:PORT, got %q", c.Endpoint)
	}
	for _, o := range d.Block {
		one := func() (string, error) {
			if len(o.Args) != 1 {
				return "", badOpt(d, o, "%s takes one argument", o.Name)
			}
			return o.Args[0].Text, nil
		}
		zipkinOnly := func() error {
			if c.Type != trace.Zipkin {
				return badOpt(d, o, "%s applies to zipkin only (CoreDNS accepts it with %s and ignores it)", o.Name, c.Type)
			}
			return nil
		}
		switch o.Name {
		case "every":
			v, err := one()
			if err != nil {
				return err
			}
			if c.Every, err = strconv.ParseUint(v, 10, 64); err != nil {
				return badOpt(d, o, "every: %q is not a count", v)
			}
		case "service":
			v, err := one()
			if err != nil {
				return err
			}
			c.Service = v
		case "client_server":
			if len(o.Args) > 1 {
				return badOpt(d, o, "client_server takes at most one argument")
			}
			c.ClientServer = true
			if len(o.Args) == 1 {
				b, err := strconv.ParseBool(o.Args[0].Text)
				if err != nil {
					return badOpt(d, o, "client_server: %q is not a boolean", o.Args[0].Text)
				}
				c.ClientServer = b
			}
		case "datadog_analytics_rate":
			if c.Type != trace.Datadog {
				return badOpt(d, o, "datadog_analytics_rate applies to datadog only (CoreDNS accepts it with zipkin and ignores it)")
			}
			if len(o.Args) > 1 {
				return badOpt(d, o, "datadog_analytics_rate takes at most one argument")
			}
			c.AnalyticsRate = 0
			if len(o.Args) == 1 {
				r, err := strconv.ParseFloat(o.Args[0].Text, 64)
				if err != nil {
					return badOpt(d, o, "datadog_analytics_rate: %q is not a number", o.Args[0].Text)
				}
				if r > 1 || r < 0 {
					return badOpt(d, o, "datadog analytics rate must be between 0 and 1, '%f' is not supported", r)
				}
				c.AnalyticsRate = r
			}
		case "zipkin_max_backlog_size", "zipkin_max_batch_size":
			if err := zipkinOnly(); err != nil {
				return err
			}
			v, err := one()
			if err != nil {
				return err
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 0 || n > trace.MaxBacklog {
				return badOpt(d, o, "%s: %q is not a size between 0 (the default) and %d", o.Name, v, trace.MaxBacklog)
			}
			if o.Name == "zipkin_max_backlog_size" {
				c.Backlog = n
			} else {
				c.Batch = n
			}
		case "zipkin_max_batch_interval":
			if err := zipkinOnly(); err != nil {
				return err
			}
			v, err := one()
			if err != nil {
				return err
			}
			dur, err := time.ParseDuration(v)
			if err != nil || dur < 0 {
				return badOpt(d, o, "zipkin_max_batch_interval: %q is not a duration", v)
			}
			if dur > 0 && dur < 10*time.Millisecond {
				// A bound of ours: one POST per 10 ms at most.
				return badOpt(d, o, "zipkin_max_batch_interval: %s is below 10ms", dur)
			}
			c.BatchInterval = dur
		default:
			return badOpt(d, o, "option %s is not supported (CoreDNS skips an option it does not know)", o.Name)
		}
	}
	c.Normalize()
	s.Trace = &c
	return nil
}
