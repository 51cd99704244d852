package trace

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nodelocaldns/nodelocaldns/internal/answer"
	"github.com/nodelocaldns/nodelocaldns/internal/corefile"
)

// The trace directive: read from the Corefile here (corefile.Register),
// its spans recorded once each sampled query is answered (answer.Register,
// handler.go) and sent by the exporter of its endpoint (export.go), which
// whoever runs the handlers owns.
func init() {
	corefile.Register("trace", corefile.Spec{
		Parse:        parse,
		Forms:        "trace [zipkin|datadog] [ENDPOINT] { every AMOUNT; service NAME; client_server [BOOL]; datadog_analytics_rate RATE; zipkin_max_backlog_size SIZE; zipkin_max_batch_size SIZE; zipkin_max_batch_interval DURATION }",
		Distinct:     func(cfg any) []string { return []string{ExporterKey(*cfg.(*Config))} },
		MaxDistinct:  MaxExporters,
		DistinctCost: "an exporter: a goroutine and a backlog",
		Describe: func(_ *corefile.Server, cfg any) []string {
			t := cfg.(*Config)
			return []string{fmt.Sprintf("trace: %s spans of one query in %d to %s, service %q (internal/trace): sent in the background, dropped and counted when the collector is slow or gone", t.Type, t.Every, t.Endpoint, t.Service)}
		},
	})
	answer.Register("trace", setup)
}

// parse reads `trace` as CoreDNS 1.13's plugin/trace (the stock
// node-cache's) does into a *Config, normalized: an optional endpoint type
// (zipkin, datadog; any case) and endpoint, and a block of every,
// service, client_server, datadog_analytics_rate and the zipkin
// reporter's bounds. CoreDNS skips an option it does not know; we refuse
// it (nothing in a Corefile is silently ignored), and refuse an option of
// the other endpoint type (CoreDNS accepts zipkin_* with datadog and
// datadog_analytics_rate with zipkin, and they do nothing).
func parse(_ *corefile.Server, d *corefile.Directive, _ any) (any, error) {
	c := Config{Every: DefaultEvery}
	switch len(d.Args) {
	case 0:
	case 1:
		c.Endpoint = d.Args[0].Text
	case 2:
		c.Type, c.Endpoint = strings.ToLower(d.Args[0].Text), d.Args[1].Text
		if c.Type != Zipkin && c.Type != Datadog {
			return nil, corefile.Bad(d, "tracing endpoint type '%s' is not supported", c.Type)
		}
	default:
		return nil, corefile.Bad(d, "takes at most two arguments")
	}
	if c.Type == "" {
		c.Type = DefaultType
	}
	if c.Type == Datadog && strings.Contains(c.Endpoint, "/") {
		return nil, corefile.Bad(d, "datadog: the endpoint is the agent's HOST:PORT, got %q", c.Endpoint)
	}
	for _, o := range d.Block {
		if err := parseOption(d, o, &c); err != nil {
			return nil, err
		}
	}
	c.Normalize()
	return &c, nil
}

// parseOption reads one option of a trace block into c.
func parseOption(d, o *corefile.Directive, c *Config) error {
	one := func() (string, error) {
		if len(o.Args) != 1 {
			return "", corefile.BadOpt(d, o, "%s takes one argument", o.Name)
		}
		return o.Args[0].Text, nil
	}
	switch o.Name {
	case "every":
		v, err := one()
		if err != nil {
			return err
		}
		if c.Every, err = strconv.ParseUint(v, 10, 64); err != nil {
			return corefile.BadOpt(d, o, "every: %q is not a count", v)
		}
	case "service":
		v, err := one()
		if err != nil {
			return err
		}
		c.Service = v
	case "client_server":
		if len(o.Args) > 1 {
			return corefile.BadOpt(d, o, "client_server takes at most one argument")
		}
		c.ClientServer = true
		if len(o.Args) == 1 {
			b, err := strconv.ParseBool(o.Args[0].Text)
			if err != nil {
				return corefile.BadOpt(d, o, "client_server: %q is not a boolean", o.Args[0].Text)
			}
			c.ClientServer = b
		}
	case "datadog_analytics_rate":
		return parseAnalyticsRate(d, o, c)
	case "zipkin_max_backlog_size", "zipkin_max_batch_size", "zipkin_max_batch_interval":
		if c.Type != Zipkin {
			return corefile.BadOpt(d, o, "%s applies to zipkin only (CoreDNS accepts it with %s and ignores it)", o.Name, c.Type)
		}
		v, err := one()
		if err != nil {
			return err
		}
		return parseZipkinBound(d, o, v, c)
	default:
		return corefile.BadOpt(d, o, "option %s is not supported (CoreDNS skips an option it does not know)", o.Name)
	}
	return nil
}

// parseAnalyticsRate reads datadog_analytics_rate [RATE] into c.
func parseAnalyticsRate(d, o *corefile.Directive, c *Config) error {
	if c.Type != Datadog {
		return corefile.BadOpt(d, o, "datadog_analytics_rate applies to datadog only (CoreDNS accepts it with zipkin and ignores it)")
	}
	if len(o.Args) > 1 {
		return corefile.BadOpt(d, o, "datadog_analytics_rate takes at most one argument")
	}
	c.AnalyticsRate = 0
	if len(o.Args) == 1 {
		r, err := strconv.ParseFloat(o.Args[0].Text, 64)
		if err != nil {
			return corefile.BadOpt(d, o, "datadog_analytics_rate: %q is not a number", o.Args[0].Text)
		}
		if r > 1 || r < 0 {
			return corefile.BadOpt(d, o, "datadog analytics rate must be between 0 and 1, '%f' is not supported", r)
		}
		c.AnalyticsRate = r
	}
	return nil
}

// parseZipkinBound reads one of the zipkin reporter's bounds (value v).
func parseZipkinBound(d, o *corefile.Directive, v string, c *Config) error {
	if o.Name == "zipkin_max_batch_interval" {
		dur, err := time.ParseDuration(v)
		if err != nil || dur < 0 {
			return corefile.BadOpt(d, o, "zipkin_max_batch_interval: %q is not a duration", v)
		}
		if dur > 0 && dur < 10*time.Millisecond {
			// A bound of ours: one POST per 10 ms at most.
			return corefile.BadOpt(d, o, "zipkin_max_batch_interval: %s is below 10ms", dur)
		}
		c.BatchInterval = dur
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > MaxBacklog {
		return corefile.BadOpt(d, o, "%s: %q is not a size between 0 (the default) and %d", o.Name, v, MaxBacklog)
	}
	if o.Name == "zipkin_max_backlog_size" {
		c.Backlog = n
	} else {
		c.Batch = n
	}
	return nil
}
