package kube

import (
	"os"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
)

func TestMain(m *testing.M) {
	code := m.Run()
	agentproc.RemoveShared() // the sluice binaries the traffic tests built
	os.Exit(code)
}
