package e2e

import (
	"bufio"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// There is no Docker engine to build the image with here, so this checks
// what can be checked without one: the build stage's `go build` lines, run
// as written (with the build stage's ENV and ARG defaults) on this tree,
// produce static binaries that start, and the final stage is the image
// `make image` builds (deploy/image_test.go runs that one): scratch, with
// exactly those outputs in /usr/local/bin, running sluice.
func TestDockerfileBuildsStaticBinaries(t *testing.T) {
	root := moduleRootDir(t)
	f, err := os.Open(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	type stage struct {
		from, name string
		env        []string
		runs       []string
		copies     []string // COPY --from=... lines, without the instruction
		entrypoint string
	}
	var stages []*stage
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instr, rest, _ := strings.Cut(line, " ")
		switch strings.ToUpper(instr) {
		case "FROM":
			img, name, _ := strings.Cut(rest, " AS ")
			stages = append(stages, &stage{from: strings.TrimSpace(img), name: strings.TrimSpace(name)})
		case "ENV", "ARG":
			stages[len(stages)-1].env = append(stages[len(stages)-1].env, strings.Fields(rest)...)
		case "RUN":
			stages[len(stages)-1].runs = append(stages[len(stages)-1].runs, rest)
		case "COPY":
			if strings.HasPrefix(rest, "--from=") {
				stages[len(stages)-1].copies = append(stages[len(stages)-1].copies, rest)
			}
		case "ENTRYPOINT":
			stages[len(stages)-1].entrypoint = rest
		}
	}
	if len(stages) != 2 {
		t.Fatalf("want a two-stage Dockerfile (build, final), got %d stages", len(stages))
	}
	build, final := stages[0], stages[1]
	if !strings.HasPrefix(build.from, "golang:1.26") {
		t.Errorf("build stage FROM %q, want golang:1.26", build.from)
	}
	if !slices.Contains(build.env, "CGO_ENABLED=0") {
		t.Errorf("build stage ENV %v lacks CGO_ENABLED=0", build.env)
	}
	for _, r := range build.runs {
		if strings.Contains(r, "clang") || strings.Contains(r, "go generate") {
			t.Errorf("build stage must use the committed generated files, not regenerate: RUN %s", r)
		}
	}

	// Run each `go build` RUN line the way Docker does (/bin/sh -c), with
	// its output directory moved into a temporary one.
	out := t.TempDir()
	var built []string
	for _, r := range build.runs {
		if !strings.HasPrefix(r, "go build ") {
			continue
		}
		fields := strings.Fields(r)
		i := slices.Index(fields, "-o")
		if i < 0 || i+1 == len(fields) || !strings.HasPrefix(fields[i+1], "/") {
			t.Fatalf("RUN %s: want -o with an absolute path", r)
		}
		built = append(built, fields[i+1])
		line := strings.Replace(r, " -o /", " -o "+out+"/", 1)
		cmd := exec.CommandContext(t.Context(), "/bin/sh", "-c", line)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), build.env...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("RUN %s: %v\n%s", r, err, b)
		}
	}
	if len(built) != 2 {
		t.Fatalf("build stage builds %v, want sluice and sluicectl", built)
	}
	for _, b := range built {
		path := filepath.Join(out, strings.TrimPrefix(b, "/"))
		ef, err := elf.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ef.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s is dynamically linked; the final image has no libc", b)
			}
		}
		ef.Close()
		if o, err := exec.Command(path, "--help").CombinedOutput(); err != nil {
			t.Errorf("%s --help: %v\n%s", b, err, o)
		}
	}

	// The final stage copies what the build stage produced, to where
	// deploy/tools/image puts it, on nothing, and runs sluice.
	if final.from != "scratch" {
		t.Errorf("final stage FROM %s, want scratch, as make image builds", final.from)
	}
	if len(final.copies) != 1 {
		t.Fatalf("final stage COPY --from lines: %q, want one", final.copies)
	}
	fields := strings.Fields(final.copies[0])
	if fields[0] != "--from="+build.name {
		t.Errorf("final stage copies from %s, want --from=%s", fields[0], build.name)
	}
	if srcs := fields[1 : len(fields)-1]; !slices.Equal(srcs, built) {
		t.Errorf("final stage copies %v, build stage builds %v", srcs, built)
	}
	if dst := fields[len(fields)-1]; dst != "/usr/local/bin/" {
		t.Errorf("final stage copies to %s, make image to /usr/local/bin/", dst)
	}
	if want := `["` + fields[len(fields)-1] + `sluice"]`; final.entrypoint != want {
		t.Errorf("ENTRYPOINT %s, want %s", final.entrypoint, want)
	}
}

func moduleRootDir(t *testing.T) string {
	t.Helper()
	root, err := testutil.ModuleRoot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return root
}
