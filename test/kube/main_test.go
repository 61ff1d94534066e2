package kube

import (
	"os"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
)

func TestMain(m *testing.M) {
	os.Exit(agentproc.RunTests(m)) // removes the sluice binaries the traffic tests built
}
