package kube

import (
	"strings"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// eventually is testutil.Eventually, under the short name every test of
// this package uses.
var eventually = testutil.Eventually

func hasPrefixLine(body, prefix string) bool {
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			return true
		}
	}
	return false
}
