package manifest

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// DefaultDebounce is how long Source waits after a file event for more
// before reloading: editors and `kubectl get -o yaml >` write in bursts.
const DefaultDebounce = 100 * time.Millisecond

// Source watches manifest files and hands the complete desired state to
// apply at start and after every change.
type Source struct {
	path     string
	log      *slog.Logger
	loader   *loader
	debounce time.Duration

	logged map[string]bool // errors and warnings logged, not repeated while they persist
	// applied says a state was handed over: until then, files of unknown
	// content hold it back (see the package comment).
	applied bool
	// nodeChanged tells Run that SetNodeAddresses changed the node.
	nodeChanged chan struct{}
}

// NewSource returns a Source for path, a file or a directory.
func NewSource(path string, opts translate.Options, log *slog.Logger) *Source {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Source{path: path, log: log, loader: newLoader(opts), debounce: DefaultDebounce,
		nodeChanged: make(chan struct{}, 1)}
}

// SetNodeAddresses changes the addresses NodePorts are served on
// (translate.Node.Addresses; addrs are kept, not copied): Run then makes a
// new state, after its debounce, re-translating only the Services that
// read them and reading no file that did not change. It may be called
// from any goroutine, before Run too.
func (s *Source) SetNodeAddresses(addrs []netip.Addr) {
	if !s.loader.tracker.SetNodeAddresses(addrs) {
		return
	}
	select {
	case s.nodeChanged <- struct{}{}:
	default: // one is pending: it covers this change
	}
}

// SetHolds tells the change tracker what the datapath holds, to settle a
// frontend claimed twice after a restart (agent.HoldsSource). Call it
// before Run.
func (s *Source) SetHolds(holds func(*model.Service) bool) { s.loader.tracker.SetHolds(holds) }

// Run loads the manifests, calls apply with the desired state, and does so
// again after every change of the files, until ctx is done. It watches the
// directory (or, for a single file, its parent directory, so that an
// editor's write-to-temporary-then-rename is seen). It returns an error
// only if the path cannot be read or watched at start.
func (s *Source) Run(ctx context.Context, apply func(*model.State)) error {
	fi, err := os.Stat(s.path)
	if err != nil {
		return fmt.Errorf("manifest source: %w", err)
	}
	dir, file := s.path, ""
	if !fi.IsDir() {
		dir, file = filepath.Dir(s.path), filepath.Base(s.path)
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("manifest source: watch: %w", err)
	}
	defer w.Close()
	if err := w.Add(dir); err != nil {
		return fmt.Errorf("manifest source: watch %s: %w", dir, err)
	}

	if err := s.reload(apply, nil); err != nil {
		return err
	}

	// What the events since the last load were about: the files named
	// (base names), or all when an event cannot say (the kubelet's swap
	// of a ConfigMap volume's ..data, a lost event).
	changed, all := map[string]bool{}, false
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			name := filepath.Base(ev.Name)
			if ev.Op == fsnotify.Chmod || !relevant(name, file) {
				continue
			}
			if strings.HasPrefix(name, "..") {
				all = true
			}
			changed[name] = true
			timer.Reset(s.debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			// An overflow loses events: reload to be sure.
			s.log.Warn("Manifest watch error; reloading", "path", s.path, "error", err)
			all = true
			timer.Reset(s.debounce)
		case <-s.nodeChanged:
			// The files named since the last load, if any, are
			// read with it; none else (changed is empty).
			timer.Reset(s.debounce)
		case <-timer.C:
			only := changed
			if all {
				only = nil
			}
			changed, all = map[string]bool{}, false
			if err := s.reload(apply, only); err != nil {
				// The path went away: keep the last state programmed
				// and wait for it to come back.
				s.log.Error("Reload manifests", "path", s.path, "error", err)
			}
		}
	}
}

// relevant reports whether an event on name, in the watched directory, may
// change the manifests: the file itself (file mode) or any manifest file
// (directory mode), and, in both, the names the kubelet's atomic writer
// swaps under a ConfigMap or Secret volume. There the files are symlinks
// into ..data, itself a symlink to a timestamped directory
// (..2026_11_23_10_00_00.123456789); an update writes a new timestamped
// directory and renames a new ..data_tmp symlink over ..data: the only
// events in the watched directory are on names beginning with "..".
func relevant(name, file string) bool {
	if strings.HasPrefix(name, "..") {
		return true
	}
	if file != "" {
		return name == file
	}
	return isManifest(name)
}

// reload loads the manifests, reading only the files named in changed
// (nil: all), and calls apply. Errors and warnings are logged when they
// first appear, not again while they persist.
func (s *Source) reload(apply func(*model.State), changed map[string]bool) error {
	res, err := s.loader.loadChanged(s.path, changed)
	if err != nil {
		return fmt.Errorf("manifest source: %w", err)
	}
	seen := map[string]bool{}
	for _, e := range errorStrings(res.Errors) {
		seen[e] = true
		if !s.logged[e] {
			s.log.Warn("Bad manifest", "error", e)
		}
	}
	for _, w := range res.Warnings {
		seen[w] = true
		if !s.logged[w] {
			s.log.Warn("Manifest object not served as written", "reason", w)
		}
	}
	for _, w := range res.Skipped {
		seen[w] = true
		if !s.logged[w] {
			s.log.Info("Service not served", "reason", w)
		}
	}
	for e := range s.logged {
		if !seen[e] {
			s.log.Debug("Manifest message no longer applies", "message", e)
		}
	}
	s.logged = seen
	if !s.applied && len(res.Unknown) > 0 {
		// After a restart the maps hold what these files last defined:
		// a state without it would remove it. Wait for them to parse.
		s.log.Warn("Not applying the manifests until these files can be read and parsed", "files", res.Unknown)
		return nil
	}
	s.log.Info("Loaded manifests", "path", s.path, "services", res.Services, "endpointslices", res.Slices,
		"frontends", res.State.Services.Len(), "errors", len(res.Errors), "ignored", len(res.Warnings), "skipped", len(res.Skipped))
	s.applied = true
	apply(res.State)
	return nil
}
