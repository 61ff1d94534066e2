// Command image builds Sluice's container image without a container
// engine: it cross-compiles cmd/sluice and cmd/sluicectl (static, no cgo),
// puts them in one layer on an empty base (scratch), and writes the image
// as a tarball of an OCI image layout, which registry clients push as is:
//
//	skopeo copy oci-archive:bin/sluice-image.tar docker://REGISTRY/sluice:VERSION
//	podman load -i bin/sluice-image.tar
//
// `make image` runs it. The image holds nothing but the two binaries: the
// agent reads no file of its own from the image at run time. Its API
// credentials and CA come from the service account volume the kubelet
// mounts, or from a --kubeconfig the operator mounts; its host-name lookups
// read the /etc/resolv.conf and /etc/hosts the runtime provides; everything
// else it touches is the node's (/sys/fs/bpf, the cgroup2 mount, netlink).
//
// The build is reproducible: file times are the commit's time (or
// SOURCE_DATE_EPOCH), owners are root, the Go build is -trimpath, so one
// commit gives one image digest. The tag is the release `sluice --version`
// prints (cmd/sluice/version.go), which is the tag deploy/ names.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// binDir is where the binaries live in the image; the Dockerfile copies
// them to the same place.
const binDir = "usr/local/bin"

func main() {
	root := flag.String("root", ".", "the Sluice source tree")
	out := flag.String("out", "bin/sluice-image.tar", "the OCI layout tarball to write")
	repo := flag.String("repo", "ghcr.io/sluice-lb/sluice", "the repository the image is meant for (recorded in its labels)")
	platforms := flag.String("platforms", "linux/"+runtime.GOARCH, "comma-separated os/arch to build for; more than one gives an image index")
	flag.Parse()
	if err := build(*root, *out, *repo, strings.Split(*platforms, ",")); err != nil {
		fmt.Fprintf(os.Stderr, "image: %v\n", err)
		os.Exit(1)
	}
}

func build(root, out, repo string, platforms []string) (err error) {
	root, err = filepath.Abs(root)
	if err != nil {
		return err
	}
	version, err := readVersion(root)
	if err != nil {
		return err
	}
	commit, epoch := gitCommit(root)
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH: %w", err)
		}
		epoch = time.Unix(n, 0).UTC()
	}

	tmp, err := os.MkdirTemp("", "sluice-image-")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(tmp)) }()

	var images []v1.Image
	for _, p := range platforms {
		goos, goarch, ok := strings.Cut(strings.TrimSpace(p), "/")
		if !ok || goos != "linux" {
			return fmt.Errorf("platform %q: want linux/ARCH", p)
		}
		img, err := platformImage(root, filepath.Join(tmp, goarch), goarch, version, commit, repo, epoch)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		images = append(images, img)
	}

	// The layout: one entry in index.json, named by the tag, so that
	// `skopeo copy oci-archive:FILE` finds it without a :ref.
	dir := filepath.Join(tmp, "layout")
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	ref := layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": version})
	var digest v1.Hash
	if len(images) == 1 {
		if digest, err = images[0].Digest(); err == nil {
			err = lp.AppendImage(images[0], ref)
		}
	} else {
		idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
		for i, img := range images {
			goarch := strings.TrimPrefix(strings.TrimSpace(platforms[i]), "linux/")
			idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img,
				Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: goarch}}})
		}
		if digest, err = idx.Digest(); err == nil {
			err = lp.AppendIndex(idx, ref)
		}
	}
	if err != nil {
		return fmt.Errorf("write layout: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	if err := tarDir(dir, out, epoch); err != nil {
		return fmt.Errorf("write %s: %w", out, err)
	}
	fmt.Printf("%s: %s:%s@%s (commit %s, %s)\n", out, repo, version, digest, commit, strings.Join(platforms, ","))
	return nil
}

// readVersion takes the release from cmd/sluice/version.go, the line that
// `sluice --version` prints.
func readVersion(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "cmd", "sluice", "version.go"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^var version = "([^"]+)"$`).FindSubmatch(b)
	if m == nil {
		return "", errors.New(`cmd/sluice/version.go has no line var version = "..."`)
	}
	return string(m[1]), nil
}

// gitCommit returns HEAD (with -dirty if the tree has uncommitted changes)
// and its commit time; "unknown" and the Unix epoch outside a git checkout.
func gitCommit(root string) (string, time.Time) {
	git := func(args ...string) (string, error) {
		out, err := exec.Command("git", append([]string{"-C", root}, args...)...).Output()
		return strings.TrimSpace(string(out)), err
	}
	rev, err := git("rev-parse", "HEAD")
	if err != nil {
		return "unknown", time.Unix(0, 0).UTC()
	}
	epoch := time.Unix(0, 0).UTC()
	if s, err := git("log", "-1", "--format=%ct"); err == nil {
		if n, err := strconv.ParseInt(s, 10, 64); err == nil {
			epoch = time.Unix(n, 0).UTC()
		}
	}
	if st, err := git("status", "--porcelain", "--untracked-files=no"); err == nil && st != "" {
		rev += "-dirty"
	}
	return rev, epoch
}

// platformImage builds the binaries for goarch into dir and returns the
// image holding them.
func platformImage(root, dir, goarch, version, commit, repo string, epoch time.Time) (v1.Image, error) {
	ldflags := "-s -w -X main.version=" + version + " -X main.commit=" + commit
	bins := map[string]string{"sluice": "./cmd/sluice", "sluicectl": "./cmd/sluicectl"}
	for name, pkg := range bins {
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", ldflags, "-o", filepath.Join(dir, name), pkg)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+goarch, "GOFLAGS=-buildvcs=false")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return nil, fmt.Errorf("go build %s: %w", pkg, err)
		}
	}
	layerTar, err := binariesLayer(dir, []string{"sluice", "sluicectl"}, epoch)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: v1.History{
		Created:   v1.Time{Time: epoch},
		CreatedBy: "deploy/tools/image: " + binDir + "/sluice, " + binDir + "/sluicectl",
	}})
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goarch
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = []string{"/" + binDir + "/sluice"}
	cf.Config.Env = []string{"PATH=/" + binDir}
	cf.Config.Labels = map[string]string{
		"org.opencontainers.image.title":    "sluice",
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.revision": commit,
		"org.opencontainers.image.source":   "https://github.com/sluice-lb/sluice",
		"org.opencontainers.image.url":      repo,
	}
	return mutate.ConfigFile(img, cf)
}

// binariesLayer returns an uncompressed tar of usr/local/bin/NAME for each
// name, read from dir, with fixed owners and times.
func binariesLayer(dir string, names []string, epoch time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range []string{"usr/", "usr/local/", binDir + "/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	sort.Strings(names)
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return nil, err
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: binDir + "/" + n, Mode: 0o755, Size: int64(len(b)), ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarDir writes the files under dir to a tar file at out, in name order,
// with fixed times and owners, atomically.
func tarDir(dir, out string, epoch time.Time) (err error) {
	var paths []string
	if err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p != dir {
			paths = append(paths, p)
		}
		return nil
	}); err != nil {
		return err
	}
	sort.Strings(paths)
	f, err := os.CreateTemp(filepath.Dir(out), ".sluice-image-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = f.Close() // perhaps closed already; it is removed in any case
			err = errors.Join(err, os.Remove(f.Name()))
		}
	}()
	tw := tar.NewWriter(f)
	for _, p := range paths {
		rel, _ := filepath.Rel(dir, p)
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: filepath.ToSlash(rel), ModTime: epoch, Mode: 0o644, Format: tar.FormatPAX}
		if fi.IsDir() {
			hdr.Typeflag, hdr.Name, hdr.Mode = tar.TypeDir, hdr.Name+"/", 0o755
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			continue
		}
		hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		_, err = io.Copy(tw, src)
		if err := errors.Join(err, src.Close()); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(f.Name(), out)
}
