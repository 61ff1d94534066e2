package reconciler

// Apply's errors: one FrontendError per frontend that could not be
// (fully) programmed or removed, so that the agent can tell a Service that
// can never fit as asked (report it, stop retrying it, stay ready) from a
// write that failed (retry with backoff, not ready).

import (
	"errors"
	"fmt"

	"github.com/sluice-lb/sluice/pkg/model"
)

// ErrInvalid is wrapped by errors about a frontend the datapath cannot
// hold however much room there is: an address that is not IPv4 or IPv6
// (or a backend of the other family than its frontend), a
// protocol other than TCP or UDP, more backends than a frontend has slots.
var ErrInvalid = errors.New("not representable in the datapath")

// MaxSlots is how many backends one frontend can name: slots are 16-bit
// (bpf/lib/structs.h), slot 0 being the master.
const MaxSlots = 0xffff

// FrontendError is an error of Apply about one frontend. Apply returns
// them joined (errors.Join), with errors that concern no one frontend.
type FrontendError struct {
	// Service is the Service port the frontend is (or was last)
	// programmed for; empty for a frontend restored from the maps that
	// nobody wants.
	Service  model.ServicePortName
	Frontend model.L4Addr
	// Remove says the error came from removing the frontend.
	Remove bool
	Err    error
}

func (e *FrontendError) Error() string {
	what := ""
	if e.Remove {
		what = "remove: "
	}
	if e.Service == (model.ServicePortName{}) {
		return fmt.Sprintf("frontend %s: %s%v", e.Frontend, what, e.Err)
	}
	return fmt.Sprintf("service %s (%s): %s%v", e.Service, e.Frontend, what, e.Err)
}

func (e *FrontendError) Unwrap() error { return e.Err }

// errInternalScope is why a two-scope frontend keeps its previous
// programming: its master would name an internal scope that failed to be
// programmed (that failure is reported on its own).
var errInternalScope = errors.New("internal scope not programmed")

// frontendError is Apply's error about fe. The agent knows frontends as
// the model does (an address, port and protocol), so an internal scope's
// error names its address and says which scope failed.
func frontendError(svc model.ServicePortName, fe Frontend, remove bool, err error) *FrontendError {
	if fe.Scope == ScopeInternal {
		err = fmt.Errorf("internal scope: %w", err)
	}
	return &FrontendError{Service: svc, Frontend: fe.L4Addr, Remove: remove, Err: err}
}

// Reason names the kind of failure, for logs and metrics: "capacity"
// (ErrCapacity), "invalid" (ErrInvalid) or "write" (a map operation
// failed).
func (e *FrontendError) Reason() string {
	switch {
	case errors.Is(e.Err, ErrCapacity):
		return "capacity"
	case errors.Is(e.Err, ErrInvalid):
		return "invalid"
	}
	return "write"
}

// Permanent reports whether applying the same desired state again cannot
// help: the frontend does not fit (ErrCapacity) or cannot be represented
// (ErrInvalid). Either was found before any write, so the frontend keeps
// its previous programming. It may fit once its Service or the rest of
// the desired state changes (another Service shrinks and frees room).
func (e *FrontendError) Permanent() bool {
	return errors.Is(e.Err, ErrCapacity) || errors.Is(e.Err, ErrInvalid)
}

// validate returns an ErrInvalid error if the datapath cannot hold d at
// all; it is checked before any write, as capacity is. A frontend's
// backends and source ranges are of its own family (the datapath does no
// NAT46/64): sources never produce others, and a frontend that names one
// is refused whole.
func validate(d *desiredFrontend) error {
	if err := validL4(d.fe.L4Addr); err != nil {
		return fmt.Errorf("%w: frontend %s: %v", ErrInvalid, d.fe, err)
	}
	if len(d.backends) > MaxSlots {
		return fmt.Errorf("%w: %d backends, a frontend has %d slots; previous programming kept", ErrInvalid, len(d.backends), MaxSlots)
	}
	v4 := d.fe.Addr.Is4()
	for _, b := range d.backends {
		a := b.L4Addr
		if v4 && a.Addr.Is4() && (a.Proto == model.TCP || a.Proto == model.UDP) {
			continue // what validL4 and the family's check accept, at once
		}
		err := validL4(a)
		if err == nil && a.Addr.Is6() != d.fe.Addr.Is6() {
			err = errors.New("not of the frontend's address family")
		}
		if err != nil {
			return fmt.Errorf("%w: backend %s: %v; previous programming kept", ErrInvalid, a, err)
		}
	}
	for _, p := range d.ranges {
		if p.Addr().Is6() != d.fe.Addr.Is6() || p.Addr().Is4In6() || p.Addr().Zone() != "" {
			return fmt.Errorf("%w: source range %s: not a prefix of the frontend's address family; previous programming kept", ErrInvalid, p)
		}
	}
	return nil
}

// validL4 accepts an IPv4 or IPv6 address. An IPv4-mapped IPv6 address
// (::ffff:10.0.0.1) is refused rather than taken for its IPv4 address:
// the desired state is keyed by addresses, and the maps, which hold it as
// an IPv4 address, would read back as another frontend or backend than
// the one programmed. Sources hand the reconciler plain IPv4 addresses.
func validL4(a model.L4Addr) error {
	switch {
	case !a.Addr.IsValid():
		return errors.New("not an IP address")
	case a.Addr.Is4In6():
		return errors.New("an IPv4-mapped IPv6 address: use the IPv4 address")
	case a.Addr.Zone() != "":
		return errors.New("an address with a zone")
	}
	if a.Proto != model.TCP && a.Proto != model.UDP {
		return fmt.Errorf("protocol %s not supported", a.Proto)
	}
	return nil
}
