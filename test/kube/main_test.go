package kube

import (
	"os"
	"testing"

	"github.com/sluice-lb/sluice/test/e2e/harness"
)

func TestMain(m *testing.M) {
	code := m.Run()
	harness.RemoveShared() // the sluice binaries the traffic tests built
	os.Exit(code)
}
