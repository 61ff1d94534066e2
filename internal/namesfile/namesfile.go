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
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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
	var b bytes.Buffer
	if err := encode(&b, bpffs, s); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// WriteState writes the names of the frontends of s, programmed under
// bpffs, to path, atomically (as WriteAtomic). It encodes a File as
// json.Marshal does, a frontend at a time into the file: at 30,000
// frontends the File and its encoding would be 10 MB of the agent's heap,
// and their growth 25 MB allocated, at the end of the agent's first apply,
// its peak of memory.
func WriteState(path, bpffs string, s *model.State) error {
	return writeAtomic(path, func(f *os.File) error { return encode(f, bpffs, s) })
}

// encode writes the File naming the frontends of s to w, as json.Marshal
// would encode it, a frontend at a time, in writes of about chunk bytes.
func encode(w io.Writer, bpffs string, s *model.State) error {
	fes := make([]model.L4Addr, 0, s.Services.Len())
	fes = slices.AppendSeq(fes, s.Services.Keys())
	slices.SortFunc(fes, model.L4Addr.Compare)
	q, err := json.Marshal(filepath.Clean(bpffs))
	if err != nil {
		return err
	}
	b := make([]byte, 0, chunk+1024)
	b = append(append(append(b, `{"bpffs":`...), q...), `,"frontends":[`...)
	var scratch []byte
	for i, fe := range fes {
		svc := s.Services.Get(fe)
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"frontend":`...)
		scratch = fe.AppendTo(scratch[:0])
		b = appendString(b, scratch)
		b = append(b, `,"service":`...)
		scratch = svc.Name.AppendTo(scratch[:0])
		b = appendString(b, scratch)
		b = append(b, `,"kind":`...)
		b = appendString(b, append(scratch[:0], kindNames[svc.Kind]...))
		b = append(b, '}')
		if len(b) >= chunk {
			if _, err := w.Write(b); err != nil {
				return err
			}
			b = b[:0]
		}
	}
	b = append(b, "]}"...)
	_, err = w.Write(b)
	return err
}

// chunk is about how much of the file encode writes at once.
const chunk = 32 << 10

// appendString appends s as a JSON string, as json.Marshal encodes it:
// as it is, quoted, if it holds printable ASCII only that JSON or
// json.Marshal's HTML escaping would not escape (addresses and Kubernetes
// names do); else by json.Marshal.
func appendString(b, s []byte) []byte {
	for _, c := range s {
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(string(s)) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
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
	return writeAtomic(path, func(f *os.File) error {
		_, err := f.Write(b)
		return err
	})
}

// writeAtomic writes path by fill, through a temporary file renamed into
// place.
func writeAtomic(path string, fill func(*os.File) error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	err = fill(tmp)
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
