package deploy_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"sigs.k8s.io/yaml"
)

// The OCI structures the test reads, from the image spec; only the fields
// it checks.
type ociDescriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
}

type ociIndex struct {
	SchemaVersion int             `json:"schemaVersion"`
	Manifests     []ociDescriptor `json:"manifests"`
}

type ociManifest struct {
	MediaType string          `json:"mediaType"`
	Config    ociDescriptor   `json:"config"`
	Layers    []ociDescriptor `json:"layers"`
}

type ociConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		Entrypoint []string          `json:"Entrypoint"`
		Env        []string          `json:"Env"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
}

// `make image`'s builder, run as the Makefile runs it, writes an OCI layout
// whose every blob matches its digest; unpacked, the image's own file system
// runs `sluice --version` (chrooted into it as root, so nothing of the
// host's can help), which names the tag the layout carries, the commit, and
// the committed BPF objects; and that tag is the one deploy/ names.
func TestImageRunsFromItsOwnFileSystem(t *testing.T) {
	out := filepath.Join(t.TempDir(), "sluice-image.tar")
	absRoot, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	run(t, filepath.Join(root, "deploy", "tools"), "go", "run", "./image", "--root", absRoot, "--out", out)

	blobs := readLayout(t, out)
	var index ociIndex
	mustJSON(t, blobs["index.json"], &index)
	if index.SchemaVersion != 2 || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %+v, want one manifest", index)
	}
	tag := index.Manifests[0].Annotations["org.opencontainers.image.ref.name"]
	var manifest ociManifest
	mustJSON(t, blob(t, blobs, index.Manifests[0]), &manifest)
	if manifest.MediaType != "application/vnd.oci.image.manifest.v1+json" {
		t.Errorf("manifest media type %q", manifest.MediaType)
	}
	var config ociConfig
	mustJSON(t, blob(t, blobs, manifest.Config), &config)
	if config.OS != "linux" || config.Architecture != runtime.GOARCH {
		t.Errorf("image platform %s/%s, want linux/%s", config.OS, config.Architecture, runtime.GOARCH)
	}
	if !slices.Equal(config.Config.Entrypoint, []string{"/usr/local/bin/sluice"}) {
		t.Errorf("entrypoint %q", config.Config.Entrypoint)
	}
	if v := config.Config.Labels["org.opencontainers.image.version"]; v != tag {
		t.Errorf("version label %q, tag %q", v, tag)
	}

	// Unpack the layers, as a runtime would, into the image's root.
	fs := t.TempDir()
	var files []string
	for _, l := range manifest.Layers {
		if l.MediaType != "application/vnd.oci.image.layer.v1.tar+gzip" {
			t.Fatalf("layer media type %q", l.MediaType)
		}
		files = append(files, unpackLayer(t, blob(t, blobs, l), fs)...)
	}
	if want := []string{"usr/local/bin/sluice", "usr/local/bin/sluicectl"}; !slices.Equal(files, want) {
		t.Errorf("the image holds %q, want only %q", files, want)
	}
	for _, f := range files {
		p := filepath.Join(fs, f)
		if dynamic, err := dynamicallyLinked(p); err != nil {
			t.Fatal(err)
		} else if dynamic {
			t.Errorf("%s is dynamically linked; the image has no libc", p)
		}
	}

	cmd := exec.CommandContext(t.Context(), filepath.Join(fs, config.Config.Entrypoint[0]), "--version")
	if os.Geteuid() == 0 {
		// Inside the image's file system: no /etc, no libc, no /proc.
		cmd = exec.CommandContext(t.Context(), config.Config.Entrypoint[0], "--version")
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: fs}
		cmd.Env = config.Config.Env
		cmd.Dir = "/"
	} else {
		t.Log("not root: running the image's binary without a chroot")
	}
	vout, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sluice --version in the image: %v\n%s", err, vout)
	}
	t.Logf("sluice --version in the image:\n%s", vout)
	lines := strings.Split(strings.TrimSpace(string(vout)), "\n")
	if len(lines) < 3 {
		t.Fatalf("--version printed %q", vout)
	}
	if lines[0] != "sluice "+tag {
		t.Errorf("the image's sluice says %q, its tag is %q", lines[0], tag)
	}
	head := strings.TrimSpace(string(run(t, root, "git", "rev-parse", "HEAD")))
	if c := strings.TrimPrefix(lines[1], "commit: "); strings.TrimSuffix(c, "-dirty") != head {
		t.Errorf("commit line %q, HEAD is %s", lines[1], head)
	}
	if want := "bpf objects: " + committedObjectsDigest(t); lines[2] != want {
		t.Errorf("%q, want %q", lines[2], want)
	}

	// deploy/ names exactly this tag, never :latest.
	wantImage := "ghcr.io/sluice-lb/sluice:" + tag
	if got := manifestImage(t); got != wantImage {
		t.Errorf("deploy/sluice.yaml runs %q, make image builds %q", got, wantImage)
	}
	var chart struct{ Version, AppVersion string }
	readYAML(t, filepath.Join("helm", "sluice", "Chart.yaml"), &chart)
	if chart.AppVersion != tag || chart.Version != tag {
		t.Errorf("Chart.yaml version %q appVersion %q, image tag %q", chart.Version, chart.AppVersion, tag)
	}

	// The build is reproducible: the same tree gives the same manifest.
	again := filepath.Join(t.TempDir(), "again.tar")
	run(t, filepath.Join(root, "deploy", "tools"), "go", "run", "./image", "--root", absRoot, "--out", again)
	var index2 ociIndex
	mustJSON(t, readLayout(t, again)["index.json"], &index2)
	if index2.Manifests[0].Digest != index.Manifests[0].Digest {
		t.Errorf("two builds of one tree: manifests %s and %s", index.Manifests[0].Digest, index2.Manifests[0].Digest)
	}
}

// readLayout reads an OCI layout tarball: index.json, oci-layout, and the
// blobs by digest, each checked against its digest.
func readLayout(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	eachTarEntry(t, f, func(h *tar.Header, tr *tar.Reader) {
		if h.Typeflag != tar.TypeReg {
			return
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if hexd, ok := strings.CutPrefix(h.Name, "blobs/sha256/"); ok {
			if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != hexd {
				t.Errorf("blob %s has digest %x", h.Name, sum)
			}
			files["sha256:"+hexd] = b
			return
		}
		files[h.Name] = b
	})
	if !bytes.Contains(files["oci-layout"], []byte(`"imageLayoutVersion"`)) {
		t.Errorf("oci-layout: %q", files["oci-layout"])
	}
	return files
}

// eachTarEntry calls fn with every entry of the tar stream r, failing t
// if the stream is broken; fn reads the entry's content from tr.
func eachTarEntry(t *testing.T, r io.Reader, fn func(h *tar.Header, tr *tar.Reader)) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		fn(h, tr)
	}
}

func blob(t *testing.T, blobs map[string][]byte, d ociDescriptor) []byte {
	t.Helper()
	b, ok := blobs[d.Digest]
	if !ok {
		t.Fatalf("blob %s missing from the layout", d.Digest)
	}
	if int64(len(b)) != d.Size {
		t.Fatalf("blob %s: %d bytes, descriptor says %d", d.Digest, len(b), d.Size)
	}
	return b
}

// unpackLayer extracts a gzipped tar layer under dir and returns the
// regular files it held.
func unpackLayer(t *testing.T, layer []byte, dir string) []string {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(layer))
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	eachTarEntry(t, zr, func(h *tar.Header, tr *tar.Reader) {
		name := filepath.Clean(h.Name)
		if filepath.IsAbs(name) || strings.HasPrefix(name, "..") {
			t.Fatalf("layer entry %q escapes the root", h.Name)
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s owned by %d:%d, want root", h.Name, h.Uid, h.Gid)
		}
		p := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, os.FileMode(h.Mode)&0o777); err != nil {
				t.Fatal(err)
			}
			files = append(files, name)
		default:
			t.Errorf("layer entry %s of type %c", h.Name, h.Typeflag)
		}
	})
	return files
}

// dynamicallyLinked reports whether the ELF executable at path names an
// interpreter (a libc's dynamic loader).
func dynamicallyLinked(path string) (bool, error) {
	ef, err := elf.Open(path)
	if err != nil {
		return false, err
	}
	defer ef.Close()
	return slices.ContainsFunc(ef.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP }), nil
}

// committedObjectsDigest is `cat pkg/datapath/*_bpfel.o | sha256sum`.
func committedObjectsDigest(t *testing.T) string {
	t.Helper()
	objs, err := filepath.Glob(filepath.Join(root, "pkg", "datapath", "*_bpfel.o"))
	if err != nil || len(objs) == 0 {
		t.Fatalf("no BPF objects (%v)", err)
	}
	h := sha256.New()
	for _, o := range objs {
		b, err := os.ReadFile(o)
		if err != nil {
			t.Fatal(err)
		}
		h.Write(b)
	}
	return fmt.Sprintf("sha256:%x", h.Sum(nil))
}

// manifestImage is the image of the DaemonSet in deploy/sluice.yaml.
func manifestImage(t *testing.T) string {
	t.Helper()
	for _, o := range decodeObjects(t, mustRead(t, "sluice.yaml")) {
		if o.Kind == "DaemonSet" {
			return daemonSet(t, o).Spec.Template.Spec.Containers[0].Image
		}
	}
	t.Fatal("deploy/sluice.yaml has no DaemonSet")
	return ""
}

func mustJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%v in %s", err, b)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	if err := yaml.Unmarshal(mustRead(t, path), v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
