// Package namesfile is the file the agent writes and sluicectl reads to
// name the frontends it lists: which Service port each programmed frontend
// belongs to. The maps hold no names (they are the datapath's, sized per
// entry), and bpffs holds no regular files, so the agent writes this small
// JSON file (sluice --names-file) after every apply that changes it,
// atomically (a rename), and sluicectl reads it when it is there. It is a
// label, not state: the agent never reads it back, and a missing or stale
// file only costs sluicectl its names.
package namesfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/sluice-lb/sluice/pkg/model"
)

// Default is where the agent writes the names and sluicectl reads them.
const Default = "/run/sluice/names.json"

// File is the file's content.
type File struct {
	// BPFFS is the bpffs the agent pinned under: a reader of other
	// pins (another agent's, as in tests) ignores the file.
	BPFFS string `json:"bpffs"`
	// Frontends are sorted by frontend.
	Frontends []Frontend `json:"frontends"`
}

// Frontend names one frontend.
type Frontend struct {
	Frontend string `json:"frontend"` // model.L4Addr's String: 10.96.0.10:80/TCP
	Service  string `json:"service"`  // namespace/name:port
	Kind     string `json:"kind"`     // ClusterIP, NodePort, ExternalIP or LoadBalancer
}

var kindNames = map[model.FrontendKind]string{
	model.ClusterIP: "ClusterIP", model.NodePort: "NodePort", model.ExternalIP: "ExternalIP", model.LoadBalancer: "LoadBalancer",
}

// Of returns the names of the frontends of s, programmed under bpffs,
// encoded.
func Of(bpffs string, s *model.State) ([]byte, error) {
	f := File{BPFFS: filepath.Clean(bpffs), Frontends: []Frontend{}}
	for _, fe := range slices.SortedFunc(s.Services.Keys(), model.L4Addr.Compare) {
		svc := s.Services.Get(fe)
		f.Frontends = append(f.Frontends, Frontend{Frontend: fe.String(), Service: svc.Name.String(), Kind: kindNames[svc.Kind]})
	}
	return json.Marshal(f)
}

// Read returns the Service of each frontend (by model.L4Addr's String) in
// the file at path, if it names the frontends pinned under bpffs; no file
// (or another bpffs's) is no names.
func Read(path, bpffs string) (map[string]Frontend, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]Frontend{}, nil
	}
	if err != nil {
		return nil, err
	}
	var f File
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("names file %s: %w", path, err)
	}
	if f.BPFFS != filepath.Clean(bpffs) {
		return map[string]Frontend{}, nil
	}
	out := make(map[string]Frontend, len(f.Frontends))
	for _, fe := range f.Frontends {
		out[fe.Frontend] = fe
	}
	return out, nil
}

// WriteAtomic replaces path with b: a reader sees the old file or the new
// one, never a part.
func WriteAtomic(path string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		// The temporary file is ours and useless now; failing to remove
		// it leaves a dot file beside the names, nothing worse.
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
