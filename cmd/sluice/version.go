package main

// What `sluice --version` prints: the release, the commit it was built
// from, and the digest of the BPF objects it loads. The image builder
// (deploy/tools/image) and the Makefile set version and commit with
// -ldflags -X; a plain `go build` in a git checkout gets the commit from
// the build info instead, and the release from the line below.

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/sluice-lb/sluice/pkg/datapath"
)

// version is this release. The image deploy/ names is tagged with it
// (deploy/image_test.go holds them equal), so bump the chart with it.
var version = "0.1.0"

// commit is the git commit the binary was built from, set at link time.
var commit = ""

// buildCommit returns commit, or the revision the go command recorded
// (with -dirty when the tree had uncommitted changes), or "unknown".
func buildCommit() string {
	if commit != "" {
		return commit
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "", false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "unknown"
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}

func printVersion(w io.Writer) error {
	_, err := fmt.Fprintf(w, "sluice %s\ncommit: %s\nbpf objects: %s\ngo: %s %s/%s\n",
		version, buildCommit(), datapath.ObjectsDigest(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return err
}
