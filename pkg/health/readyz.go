package health

// /readyz, in two forms:
//
//   - brief, on the health address (--health-addr, every address by
//     default, as kube-proxy's :10256, where any pod and any host that
//     reaches the node may ask): ready or not with the reason's first
//     part, and how many frontends of how many Services the last apply
//     could not program. No Service name, no address.
//   - verbose, on the metrics address (--metrics-addr, 127.0.0.1 by
//     default) with ?verbose: the whole reason, and the failures one line
//     each, Service, frontend and error. Without ?verbose it is the brief
//     one.
//
// Either way a probe only copies what the last apply left: Unprogrammed is
// told the failures once per apply (an agent FailureObserver), counts them
// and formats the first maxNotes then. Probes that come by the thousand cost
// no sorting, no formatting and no lock that the agent's apply takes.

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// ReadyFunc returns nil when the agent is ready, else why it is not.
type ReadyFunc func() error

// maxNotes is how many failures /readyz?verbose lists; it counts the rest.
// Maps that are full leave out thousands of Services at once, and a look
// at the endpoint has no use for a body of hundreds of kilobytes.
const maxNotes = 100

// Unprogrammed is what /readyz reports besides readiness: the frontends
// the agent's last apply could not program. A ready agent may have some (a
// Service that does not fit is reported, not waited for). It is an agent
// FailureObserver (SetFailures; the Observer methods do nothing). A nil
// *Unprogrammed reports none.
type Unprogrammed struct {
	last atomic.Pointer[unprogrammedReport]
}

// unprogrammedReport is one apply's failures, counted and formatted.
type unprogrammedReport struct {
	frontends, services int
	// notes are the first maxNotes failures, one line each
	// ("capacity: service ns/name:port (VIP:port/TCP): ..."), and the
	// count of the rest.
	notes string
}

// NewUnprogrammed returns an Unprogrammed that reports no failure until
// SetFailures says otherwise.
func NewUnprogrammed() *Unprogrammed { return &Unprogrammed{} }

// SetFailures records the frontends the last apply could not program
// (sorted by Service and frontend, as the agent gives them).
func (u *Unprogrammed) SetFailures(failures []*reconciler.FrontendError) {
	r := &unprogrammedReport{frontends: len(failures)}
	services := make(map[[2]string]struct{})
	var b strings.Builder
	for i, f := range failures {
		if f.Service != (model.ServicePortName{}) {
			services[[2]string{f.Service.Namespace, f.Service.Name}] = struct{}{}
		}
		if i < maxNotes {
			fmt.Fprintf(&b, "  %s: %s\n", f.Reason(), f.Error())
		}
	}
	if len(failures) > maxNotes {
		fmt.Fprintf(&b, "  and %d more (sluicectl status lists them all)\n", len(failures)-maxNotes)
	}
	r.services, r.notes = len(services), b.String()
	u.last.Store(r)
}

// SetProgrammed does nothing: the failures are all Unprogrammed follows.
func (u *Unprogrammed) SetProgrammed(*model.State) {}

// ObserveSync does nothing: the failures are all Unprogrammed follows.
func (u *Unprogrammed) ObserveSync(time.Duration, error) {}

// report returns the last apply's failures (nil: none known).
func (u *Unprogrammed) report() *unprogrammedReport {
	if u == nil {
		return nil
	}
	return u.last.Load()
}

// VerboseReadyz returns the handler of /readyz for the metrics server:
// with ?verbose it gives the whole reason and lists the failures; without,
// it answers as the health address' /readyz. u may be nil.
func VerboseReadyz(ready ReadyFunc, u *Unprogrammed) http.Handler {
	return readyz(ready, u, true)
}

// readyz answers /readyz: 200 "ok" when ready, 503 "not ready: why"
// otherwise, then the count of failures, if any; with verbose allowed and
// ?verbose asked, the whole reason and the failures themselves.
func readyz(ready ReadyFunc, u *Unprogrammed, verboseAllowed bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, verbose := r.URL.Query()["verbose"]
		verbose = verbose && verboseAllowed
		code, body := http.StatusOK, "ok\n"
		if err := ready(); err != nil {
			why := err.Error()
			if !verbose {
				why = firstPart(err)
			}
			code, body = http.StatusServiceUnavailable, "not ready: "+why+"\n"
		}
		if rep := u.report(); rep != nil && rep.frontends > 0 {
			if verbose {
				body += "not programmed:\n" + rep.notes
			} else {
				body += fmt.Sprintf("not programmed: %d frontends of %d Services (/readyz?verbose on the metrics address lists them)\n",
					rep.frontends, rep.services)
			}
		}
		reply(w, code, body)
	})
}

// firstPart is err's message up to the error it wraps: the agent's
// "applying desired state failed (retrying)" without the write errors
// after it, which name Services and their addresses. An error that is
// nothing but the one it wraps is not given. An error with a Short
// method (the agent's) gives its short part itself.
func firstPart(err error) string {
	// The agent's reason says its short part itself, without formatting
	// the errors it wraps (however many: one per failed write).
	var short interface{ Short() string }
	if errors.As(err, &short) {
		if s := short.Short(); s != "" {
			return s
		}
	}
	msg := err.Error()
	if inner := errors.Unwrap(err); inner != nil {
		if s := inner.Error(); s != "" {
			if i := strings.Index(msg, s); i >= 0 {
				msg = strings.TrimRight(msg[:i], ": ")
			}
		}
	}
	if msg == "" {
		return "the reason is on the metrics address (/readyz?verbose)"
	}
	return msg
}
