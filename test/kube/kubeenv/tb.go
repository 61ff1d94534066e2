package kubeenv

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
)

// TB is what kubeenv needs of its caller: the part of testing.TB it uses.
// A test passes its *testing.T; a command that runs a control plane (the
// control-plane benchmark, test/bench/kubeproxy) passes the TB that Run
// gives it.
type TB interface {
	Helper()
	Cleanup(func())
	Logf(format string, args ...any)
	Error(args ...any)
	Errorf(format string, args ...any)
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Failed() bool
}

// Run calls fn with a TB that behaves as a test's does outside a test:
// Fatal and Fatalf end fn's goroutine (runtime.Goexit, as in a test), Logf
// goes to logf, and the functions given to Cleanup run, last registered
// first, once fn has ended, however it ended. Run returns fn's error
// joined with every Fatal and Error reported.
func Run(logf func(format string, args ...any), fn func(t TB) error) error {
	r := &runTB{logf: logf}
	done := make(chan error, 1)
	go func() {
		var err error
		defer func() { done <- err }()
		err = fn(r)
	}()
	err := <-done
	r.mu.Lock()
	cleanups := r.cleanups
	r.cleanups = nil
	r.mu.Unlock()
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return errors.Join(append([]error{err}, r.errs...)...)
}

// runTB is Run's TB.
type runTB struct {
	logf     func(format string, args ...any)
	mu       sync.Mutex
	cleanups []func()
	errs     []error
}

func (r *runTB) Helper() {}

func (r *runTB) Cleanup(fn func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cleanups = append(r.cleanups, fn)
}

func (r *runTB) Logf(format string, args ...any) { r.logf(format, args...) }

func (r *runTB) Error(args ...any) { r.fail(fmt.Sprint(args...)) }

func (r *runTB) Errorf(format string, args ...any) { r.fail(fmt.Sprintf(format, args...)) }

func (r *runTB) Fatal(args ...any) {
	r.fail(fmt.Sprint(args...))
	runtime.Goexit()
}

func (r *runTB) Fatalf(format string, args ...any) {
	r.fail(fmt.Sprintf(format, args...))
	runtime.Goexit()
}

func (r *runTB) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.errs) > 0
}

func (r *runTB) fail(msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, errors.New(msg))
}
