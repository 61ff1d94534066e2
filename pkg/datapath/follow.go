package datapath

import (
	"context"
	"log/slog"
	"time"
)

// A Watch runs until it fails, which Done tells, or is closed:
// *RoutingWatch, *PortWatch.
type Watch interface {
	Done() <-chan struct{}
	Close() error
}

// FollowWatch runs the watch start makes until ctx is done. A watch that
// fails to start, or ends, is logged ("what failed: meanwhile; retrying")
// and started again after retry; a failed close at the end is logged as
// what.
func FollowWatch[W Watch](ctx context.Context, start func() (W, error), retry time.Duration, log *slog.Logger, what, meanwhile string) {
	for {
		w, err := start()
		if err == nil {
			select {
			case <-ctx.Done():
				if err := w.Close(); err != nil {
					log.Error(what, "err", err)
				}
				return
			case <-w.Done():
				err = w.Close()
			}
		}
		log.Error(what+" failed: "+meanwhile+"; retrying", "err", err, "retry_in", retry)
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry):
		}
	}
}
