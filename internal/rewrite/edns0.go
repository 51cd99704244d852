package rewrite

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/miekg/dns"

	"github.com/nodelocaldns/nodelocaldns/internal/rwanswer"
)

// edns0Rule is `rewrite edns0 local|nsid|subnet set|replace|append|unset
// ... [revert]`: it changes the options of the query sent upstream, as
// CoreDNS's rewrite changes the request its forward sends. The client's
// own query is never changed (the upstream query is built apart), so
// `revert` has nothing left to restore.
type edns0Rule struct {
	rwanswer.OptRule
	data     []byte // a static local value
	variable string // a local {placeholder}
	v4, v6   uint8  // subnet masks
}

// The placeholders of an edns0 local value this cache can give: what the
// fetch knows of the question and of the client that asked it first.
const (
	varQName    = "{qname}"
	varQType    = "{qtype}"
	varClientIP = "{client_ip}"
)

// parseEdns0 reads an edns0 rule's arguments (after `edns0`), as CoreDNS's
// newEdns0Rule.
func parseEdns0(args []string) (*edns0Rule, error) {
	if len(args) < 2 {
		return nil, errors.New("too few arguments for an EDNS0 rule")
	}
	typ, action := strings.ToLower(args[0]), strings.ToLower(args[1])
	r := &edns0Rule{OptRule: rwanswer.OptRule{Action: action}}
	switch typ {
	case "local":
		r.Type = rwanswer.OptLocal
	case "nsid":
		r.Type, r.Code = rwanswer.OptNSID, dns.EDNS0NSID
	case "subnet":
		r.Type, r.Code = rwanswer.OptSubnet, dns.EDNS0SUBNET
	}
	switch action {
	case "append", "replace", "set":
	case "unset":
		switch typ {
		case "local":
			if len(args) != 3 {
				return nil, errors.New("local unset action requires exactly two arguments")
			}
			return r, r.parseCode(args[2])
		case "nsid", "subnet":
			if len(args) != 2 {
				return nil, fmt.Errorf("%s unset action requires exactly one argument", typ)
			}
			return r, nil
		}
		return nil, fmt.Errorf("invalid rule type %q", typ)
	default:
		return nil, fmt.Errorf("invalid action: %q", action)
	}
	if args[len(args)-1] == "revert" {
		args = args[:len(args)-1]
	}
	switch typ {
	case "local":
		if len(args) != 4 {
			return nil, errors.New("EDNS0 local rules require three or four args")
		}
		if err := r.parseCode(args[2]); err != nil {
			return nil, err
		}
		if err := r.parseLocalValue(args[3]); err != nil {
			return nil, err
		}
		return r, nil
	case "nsid":
		if len(args) != 2 {
			return nil, errors.New("EDNS0 NSID rules can accept no more than one arg")
		}
		return r, nil
	case "subnet":
		if len(args) != 4 {
			return nil, errors.New("EDNS0 subnet rules require three or four args")
		}
		if err := r.parseSubnet(args[2], args[3]); err != nil {
			return nil, err
		}
		return r, nil
	}
	return nil, fmt.Errorf("invalid rule type %q", typ)
}

// parseLocalValue reads an edns0 local rule's VALUE: a {variable}, a
// metadata {label}, hex (0x...) or the text itself.
func (r *edns0Rule) parseLocalValue(v string) error {
	if strings.HasPrefix(v, "{") && strings.HasSuffix(v, "}") {
		switch v {
		case varQName, varQType, varClientIP:
			r.variable, r.Variable = v, true
			return nil
		case "{client_port}", "{server_ip}", "{server_port}", "{protocol}":
			return fmt.Errorf("variable %s is not supported: the fetch a query starts is shared by every client asking it at once, and it knows the first one's address only", v)
		}
		if p := strings.Index(v[1:len(v)-1], "/"); p > 0 && p < len(v)-3 {
			// A metadata label: CoreDNS takes it and applies the
			// rule when the label has a value. Of the stock
			// node-cache's plugins only log and forward set labels,
			// after rewrite has run: the rule never applies there,
			// nor here.
			r.variable, r.Variable, r.Unavailable = v, true, true
			return nil
		}
		return fmt.Errorf("unsupported variable name %q", v)
	}
	r.data = []byte(v)
	if strings.HasPrefix(v, "0x") {
		d, err := hex.DecodeString(v[2:])
		if err != nil {
			return err
		}
		r.data = d
	}
	return nil
}

// parseSubnet reads an edns0 subnet rule's IPv4 and IPv6 mask lengths.
func (r *edns0Rule) parseSubnet(a4, a6 string) error {
	v4, err := strconv.ParseUint(a4, 0, 16)
	if err != nil {
		return err
	}
	if v4 > 32 {
		return fmt.Errorf("invalid IPv4 bit mask length %d", v4)
	}
	v6, err := strconv.ParseUint(a6, 0, 16)
	if err != nil {
		return err
	}
	if v6 > 128 {
		return fmt.Errorf("invalid IPv6 bit mask length %d", v6)
	}
	r.v4, r.v6 = uint8(v4), uint8(v6)
	return nil
}

func (r *edns0Rule) parseCode(s string) error {
	c, err := strconv.ParseUint(s, 0, 16)
	if err != nil {
		return err
	}
	r.Code = uint16(c)
	return nil
}

// usesClient: the rule's value is the asking client's (its address).
func (r *edns0Rule) usesClient() bool {
	return r.variable == varClientIP || r.Type == rwanswer.OptSubnet && r.Action != "unset"
}

// UsesClient reports whether some rule needs the address of the client
// asking (the server must record it: Server.SetRecordAskers).
func UsesClient(rules []*Rule) bool {
	for _, r := range rules {
		if r.edns0 != nil && r.edns0.usesClient() {
			return true
		}
	}
	return false
}

// apply changes r's options; done as CoreDNS's rule reports it. client
// is the asking client (invalid: none, a refresh of the cache's own).
func (e *edns0Rule) apply(r *dns.Msg, client netip.Addr) bool {
	if e.Unavailable {
		return false // CoreDNS: no value, the rule is ignored
	}
	var value dns.EDNS0
	switch {
	case e.Action == "unset":
	case e.Type == rwanswer.OptNSID:
		value = &dns.EDNS0_NSID{Code: dns.EDNS0NSID}
	case e.Type == rwanswer.OptSubnet:
		client = client.Unmap()
		if !client.IsValid() {
			return false // CoreDNS: no family, the rule is ignored
		}
		s := &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: e.v4}
		bits := int(e.v4)
		if client.Is6() {
			s.Family, s.SourceNetmask, bits = 2, e.v6, int(e.v6)
		}
		p, _ := client.Prefix(bits)
		s.Address = p.Addr().AsSlice()
		value = s
	case e.Variable:
		var d []byte
		switch e.variable {
		case varQName:
			d = []byte(r.Question[0].Name)
		case varQType:
			d = binary.BigEndian.AppendUint16(nil, r.Question[0].Qtype)
		case varClientIP:
			if !client.IsValid() {
				return false // CoreDNS: no value, the rule is ignored
			}
			d = client.Unmap().AsSlice()
		}
		value = &dns.EDNS0_LOCAL{Code: e.Code, Data: d}
	default:
		value = &dns.EDNS0_LOCAL{Code: e.Code, Data: e.data}
	}
	o := r.IsEdns0()
	if o == nil {
		r.SetEdns0(4096, false)
		o = r.IsEdns0()
	}
	at := -1
	for i, opt := range o.Option {
		if e.sameKind(opt) {
			at = i
			break
		}
	}
	op, done := e.Decide(at >= 0)
	switch op {
	case rwanswer.OptAdd:
		o.Option = append(o.Option, value)
	case rwanswer.OptReplace:
		o.Option[at] = value
	case rwanswer.OptRemove:
		kept := o.Option[:0]
		for _, opt := range o.Option {
			if opt.Option() != e.Code {
				kept = append(kept, opt)
			}
		}
		o.Option = kept
	}
	return done
}

// sameKind: opt is of the rule's kind and code (CoreDNS looks for an
// EDNS0_LOCAL of the code, the NSID or the subnet option).
func (e *edns0Rule) sameKind(opt dns.EDNS0) bool {
	switch o := opt.(type) {
	case *dns.EDNS0_LOCAL:
		return e.Type == rwanswer.OptLocal && o.Code == e.Code
	case *dns.EDNS0_NSID:
		return e.Type == rwanswer.OptNSID
	case *dns.EDNS0_SUBNET:
		return e.Type == rwanswer.OptSubnet
	}
	return false
}
