package health

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// failure is a FrontendError of Service ns/name:port at vip:80/TCP.
func failure(ns, name, port, vip string, err error) *reconciler.FrontendError {
	return &reconciler.FrontendError{Service: model.ServicePortName{Namespace: ns, Name: name, Port: port},
		Frontend: model.L4Addr{Addr: netip.MustParseAddr(vip), Port: 80, Proto: model.TCP}, Err: err}
}

func getBody(h http.Handler, path string) (int, string) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

// The health address is on every address of the node: its /readyz says
// ready or not and how many frontends of how many Services are not
// programmed, and never which, with ?verbose or without, nor the wrapped
// error of a failed apply (the write errors name Services and VIPs). The
// metrics address lists them with ?verbose, and answers as the health
// address without. Both families, and a restored frontend that nobody
// wants (no Service: counted as a frontend, not as a Service).
func TestReadyzNamesServicesOnlyOnTheMetricsAddress(t *testing.T) {
	u := NewUnprogrammed()
	u.SetFailures([]*reconciler.FrontendError{
		failure("default", "big", "http", "10.96.0.20", reconciler.ErrCapacity),
		failure("default", "big", "https", "10.96.0.20", reconciler.ErrCapacity),
		failure("secret-ns", "db6", "", "2001:db8:96::7", reconciler.ErrInvalid),
		{Frontend: model.L4Addr{Addr: netip.MustParseAddr("10.96.0.99"), Port: 53, Proto: model.UDP}, Remove: true, Err: errors.New("EBUSY")},
	})
	write := failure("secret-ns", "web", "", "10.96.0.30", errors.New("update map: ENOSPC"))
	readyErr := error(nil)
	ready := func() error { return readyErr }
	secrets := []string{"default/big", "secret-ns", "db6", "web", "10.96.0.20", "10.96.0.30", "10.96.0.99", "2001:db8:96::7", "ENOSPC", "EBUSY"}
	const count = "not programmed: 4 frontends of 2 Services (/readyz?verbose on the metrics address lists them)\n"
	healthAddr, metricsAddr := Handler(ready, u), VerboseReadyz(ready, u)

	for _, r := range []struct {
		err  error
		code int
		want string
	}{
		{nil, http.StatusOK, "ok\n" + count},
		{fmt.Errorf("applying desired state failed (retrying): %w", errors.Join(write)), http.StatusServiceUnavailable,
			"not ready: applying desired state failed (retrying)\n" + count},
	} {
		readyErr = r.err
		for _, a := range []struct {
			name string
			h    http.Handler
			path string
		}{
			{"health address", healthAddr, "/readyz"},
			{"health address", healthAddr, "/readyz?verbose"},
			{"metrics address", metricsAddr, "/readyz"},
		} {
			code, body := getBody(a.h, a.path)
			if code != r.code || body != r.want {
				t.Errorf("%s %s with ready %v = %d %q, want %d %q", a.name, a.path, r.err, code, body, r.code, r.want)
			}
			for _, s := range secrets {
				if strings.Contains(body, s) {
					t.Errorf("%s %s with ready %v names %q:\n%s", a.name, a.path, r.err, s, body)
				}
			}
		}
		code, body := getBody(metricsAddr, "/readyz?verbose")
		want := "not programmed:\n" +
			"  capacity: service default/big:http (10.96.0.20:80/TCP): " + reconciler.ErrCapacity.Error() + "\n" +
			"  capacity: service default/big:https (10.96.0.20:80/TCP): " + reconciler.ErrCapacity.Error() + "\n" +
			"  invalid: service secret-ns/db6 ([2001:db8:96::7]:80/TCP): " + reconciler.ErrInvalid.Error() + "\n" +
			"  write: frontend 10.96.0.99:53/UDP: remove: EBUSY\n"
		if r.err == nil {
			want = "ok\n" + want
		} else {
			want = "not ready: " + r.err.Error() + "\n" + want
		}
		if code != r.code || body != want {
			t.Errorf("metrics address /readyz?verbose with ready %v = %d %q, want %d %q", r.err, code, body, r.code, want)
		}
	}

	// None left: "ok" alone on both.
	readyErr = nil
	u.SetFailures(nil)
	for _, path := range []string{"/readyz", "/readyz?verbose"} {
		for name, h := range map[string]http.Handler{"health": healthAddr, "metrics": metricsAddr} {
			if code, body := getBody(h, path); code != http.StatusOK || body != "ok\n" {
				t.Errorf("%s address %s with no failure = %d %q, want 200 \"ok\\n\"", name, path, code, body)
			}
		}
	}
}

// Maps that are full leave out thousands of Services: /readyz?verbose lists
// the first maxNotes and counts the rest; the brief /readyz counts them.
func TestReadyzBoundsNotes(t *testing.T) {
	const n = maxNotes + 50
	failures := make([]*reconciler.FrontendError, n)
	for i := range failures {
		failures[i] = failure("default", fmt.Sprintf("svc-%d", i), "http", fmt.Sprintf("10.96.%d.%d", i/256, i%256), reconciler.ErrCapacity)
	}
	u := NewUnprogrammed()
	u.SetFailures(failures)
	ready := func() error { return nil }
	code, body := getBody(VerboseReadyz(ready, u), "/readyz?verbose")
	if got := strings.Count(body, "capacity: "); code != http.StatusOK || got != maxNotes ||
		!strings.HasSuffix(body, "\n  and 50 more (sluicectl status lists them all)\n") {
		t.Errorf("/readyz?verbose with %d failures = %d, %d of them listed, body ends %q; want 200, %d listed and the 50 more counted",
			n, code, got, body[max(0, len(body)-80):], maxNotes)
	}
	code, body = getBody(Handler(ready, u), "/readyz")
	if want := fmt.Sprintf("ok\nnot programmed: %d frontends of %d Services (/readyz?verbose on the metrics address lists them)\n", n, n); code != http.StatusOK || body != want {
		t.Errorf("brief /readyz with %d failures = %d %q, want 200 %q", n, code, body, want)
	}
}

// shortErr is an error that says its short part itself, as the agent's
// Ready reasons do: the words before the first ": ".
type shortErr struct{ error }

func (e shortErr) Short() string { s, _, _ := strings.Cut(e.Error(), ": "); return s }

// firstPart keeps a wrapping error's own words only; an error that wraps
// nothing is whole; one that is only the wrapped one's words is not given;
// an error with a Short method (in the chain) gives its words.
func TestFirstPart(t *testing.T) {
	inner := errors.New("service ns/a (10.96.0.1:80/TCP): ENOSPC")
	for _, c := range []struct {
		err  error
		want string
	}{
		{errors.New("no desired state received yet"), "no desired state received yet"},
		{fmt.Errorf("re-applying the desired state failed (retrying): %w", inner), "re-applying the desired state failed (retrying)"},
		{fmt.Errorf("apply: %w", errors.Join(inner, errors.New("map x: EPERM"))), "apply"},
		{fmt.Errorf("%w", inner), "the reason is on the metrics address (/readyz?verbose)"},
		// Two wrapped errors (Unwrap gives none): the Short method's words.
		{shortErr{fmt.Errorf("apply failed: %w, %w", inner, errors.New("map x: EPERM"))}, "apply failed"},
		{fmt.Errorf("agent: %w", shortErr{fmt.Errorf("apply failed: %w", inner)}), "apply failed"},
	} {
		if got := firstPart(c.err); got != c.want {
			t.Errorf("firstPart(%q) = %q, want %q", c.err, got, c.want)
		}
	}
}
