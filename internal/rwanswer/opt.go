package rwanswer

// OptRule is an edns0 rule (`rewrite edns0 local|nsid|subnet
// set|replace|append|unset ...`) as the walk of a block's rules needs it:
// it changes the options of the query sent upstream (internal/rewrite does
// that) and, as CoreDNS's, counts as applied (a `stop` ends the walk) or
// not depending on what the earlier edns0 rules put there. Both sides
// decide it with Decide, so they agree.
type OptRule struct {
	// Type is the option's kind: OptLocal (EDNS0_LOCAL, by Code), OptNSID
	// or OptSubnet.
	Type uint8
	// Code is the option code.
	Code uint16
	// Action is set, replace, append or unset.
	Action string
	// Variable: a local rule whose value is a {placeholder}.
	Variable bool
	// Unavailable: the value never exists (a metadata label no directive
	// sets before the query is forwarded): the rule never applies.
	Unavailable bool
}

// The option kinds of an edns0 rule.
const (
	OptLocal uint8 = iota
	OptNSID
	OptSubnet
)

// OptOp is what an edns0 rule does to the query's options.
type OptOp uint8

// What an edns0 rule does.
const (
	OptNone    OptOp = iota // nothing
	OptReplace              // replace the value of the first option of its kind and code
	OptAdd                  // add an option
	OptRemove               // remove every option of its code
)

// Decide is CoreDNS's edns0 rule logic: given whether the query already
// has an option of the rule's kind and code (found), what the rule does
// and whether it counts as applied.
func (o *OptRule) Decide(found bool) (op OptOp, done bool) {
	if o.Unavailable {
		return OptNone, false
	}
	switch o.Action {
	case "unset":
		return OptRemove, true
	case "set", "replace":
		if found {
			return OptReplace, true
		}
		if o.Action == "set" {
			return OptAdd, true
		}
		return OptNone, false
	case "append":
		if found && (o.Variable || o.Type == OptSubnet) {
			return OptNone, false
		}
		return OptAdd, true
	}
	return OptNone, false
}

// optSet is the options a walk has put in the query: kind and code.
type optSet struct {
	n    int
	opts [16]struct {
		typ  uint8
		code uint16
	}
}

func (s *optSet) apply(o *OptRule) bool {
	found := false
	for i := 0; i < s.n; i++ {
		if s.opts[i].typ == o.Type && s.opts[i].code == o.Code {
			found = true
		}
	}
	op, done := o.Decide(found)
	switch op {
	case OptAdd:
		if s.n < len(s.opts) {
			s.opts[s.n].typ, s.opts[s.n].code = o.Type, o.Code
			s.n++
		}
	case OptRemove:
		j := 0
		for i := 0; i < s.n; i++ {
			if s.opts[i].code != o.Code {
				s.opts[j] = s.opts[i]
				j++
			}
		}
		s.n = j
	}
	return done
}
