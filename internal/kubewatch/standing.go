package kubewatch

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// State is a watch's standing with the API server.
type State int32

const (
	// Starting: the first list has not completed.
	Starting State = iota
	// Synced: the watch follows the API server.
	Synced
	// Lost: the last list or watch call failed; what the watch knew stays.
	Lost
	// Forbidden: the API server refused the first list (no RBAC); the watch
	// stopped for good (only a watch that asks for it, Standing.StopOnForbidden).
	Forbidden
)

func (s State) String() string {
	switch s {
	case Synced:
		return "synced"
	case Lost:
		return "lost"
	case Forbidden:
		return "forbidden"
	}
	return "starting"
}

// Standing keeps a watch's State from the outcome of its calls (Note, the
// Noting list-watch's callback, and FirstSync) and counts it in three
// metrics: NAME_losses_total, NAME_errors_total and NAME_synced. Its methods
// are safe for concurrent use.
type Standing struct {
	// StopOnForbidden: a Forbidden answer before the first sync makes the
	// state Forbidden for good (Note then returns true: stop the watch).
	// Once synced, a 403 is a restarting API server whose authorizer is not
	// ready yet: lost, and retried.
	StopOnForbidden bool
	// Changed is called on every change of state, with the call's error
	// (nil for Synced): the watch's one log line.
	Changed func(old, now State, err error)

	state      atomic.Int32
	everSynced atomic.Bool
	losses     prometheus.Counter
	errors     prometheus.Counter
	synced     prometheus.GaugeFunc
}

// StandingHelp is the help text of a Standing's three metrics.
type StandingHelp struct{ Losses, Errors, Synced string }

// NewStanding makes a Standing whose metrics are
// nodelocaldns_SUBSYSTEM_NAME_{losses_total,errors_total,synced}.
func NewStanding(subsystem, name string, help StandingHelp) *Standing {
	s := &Standing{
		losses: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "nodelocaldns", Subsystem: subsystem, Name: name + "_losses_total", Help: help.Losses,
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "nodelocaldns", Subsystem: subsystem, Name: name + "_errors_total", Help: help.Errors,
		}),
	}
	s.synced = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "nodelocaldns", Subsystem: subsystem, Name: name + "_synced", Help: help.Synced,
	}, func() float64 {
		if s.State() == Synced {
			return 1
		}
		return 0
	})
	return s
}

// State is the current state.
func (s *Standing) State() State { return State(s.state.Load()) }

// Collectors are the three metrics.
func (s *Standing) Collectors() []prometheus.Collector {
	return []prometheus.Collector{s.losses, s.errors, s.synced}
}

// EverSynced reports whether the first sync has happened.
func (s *Standing) EverSynced() bool { return s.everSynced.Load() }

// FirstSync records the informer's first complete list (Run's synced).
func (s *Standing) FirstSync() {
	s.everSynced.Store(true)
	s.set(Synced, nil)
}

// Note records the outcome of one list or watch call: a failure (other
// than NoLoss) is counted and makes the watch Lost, or Forbidden (see
// StopOnForbidden; the result is then true); a success after the first
// sync makes a Lost watch Synced again.
func (s *Standing) Note(err error) (stop bool) {
	if err == nil {
		if s.everSynced.Load() && s.State() == Lost {
			s.set(Synced, nil)
		}
		return false
	}
	if NoLoss(err) {
		return false
	}
	s.errors.Inc()
	if s.StopOnForbidden && apierrors.IsForbidden(err) && !s.everSynced.Load() {
		s.set(Forbidden, err)
		return true
	}
	s.set(Lost, err)
	return false
}

func (s *Standing) set(now State, err error) {
	for {
		old := s.State()
		if old == now || old == Forbidden {
			return // Forbidden ended the watch: it stays
		}
		if !s.state.CompareAndSwap(int32(old), int32(now)) {
			continue
		}
		if now == Lost {
			s.losses.Inc()
		}
		if s.Changed != nil {
			s.Changed(old, now, err)
		}
		return
	}
}
