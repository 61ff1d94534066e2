package kube

import "github.com/sluice-lb/sluice/pkg/agent"

// The agent tells the source's tracker what the maps hold, to settle a
// frontend claimed twice after a restart (pkg/source/tracker).
var _ agent.HoldsSource = (*Source)(nil)
