package testutil

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestTraffic(t *testing.T) {
	var n atomic.Int64
	tr := StartTraffic(2, func() error {
		if n.Add(1)%10 == 0 {
			return errors.New("every tenth fails")
		}
		time.Sleep(time.Millisecond)
		return nil
	})
	EventuallyTrue(t, "50 successes", 5*time.Second, func() bool { return tr.OK() >= 50 })
	tr.Stop()
	tr.Stop()
	ok, failed := tr.OK(), tr.Failed()
	if ok+failed != n.Load() || failed == 0 {
		t.Errorf("%d ok + %d failed, after %d requests", ok, failed, n.Load())
	}
	if err := tr.FirstErr(); err == nil || err.Error() != "every tenth fails" {
		t.Errorf("FirstErr = %v", err)
	}
	time.Sleep(10 * time.Millisecond)
	if n.Load() != ok+failed {
		t.Error("requests went on after Stop")
	}
}
