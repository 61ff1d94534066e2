package harness

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// unmount is syscall.Unmount, for a test to make it fail.
var unmount = syscall.Unmount

// removeTempDir detaches every mount at or under dir, deepest first, then
// removes dir. If a mount does not detach, dir is left in place (and the
// error says so, for the caller's log): removing it would delete the files
// of the filesystem still mounted under it.
func removeTempDir(dir string) error {
	mounts, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, mp := range mounts {
		if err := unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", mp, err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w; %s left in place", errors.Join(errs...), dir)
	}
	// EINVAL is also a locked mount's answer, ENOENT a mount point
	// hidden under another until that one went: whatever is still
	// mounted under dir keeps it.
	if left, err := mountsUnder(dir); err != nil || len(left) > 0 {
		return fmt.Errorf("still mounted under it: %q (%v); %s left in place", left, err, dir)
	}
	return os.RemoveAll(dir)
}

// mountsUnder lists the mount points at or under dir in this mount
// namespace (/proc/self/mountinfo), deepest first.
func mountsUnder(dir string) ([]string, error) {
	dir = filepath.Clean(dir)
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountPath(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read /proc/self/mountinfo: %w", err)
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out, nil
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 for a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// removeStaleTempDirs removes, as removeTempDir does, the directories
// root/prefix<pid>-* whose process no longer runs.
func removeStaleTempDirs(root, prefix string, log *slog.Logger) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || !e.IsDir() {
			continue
		}
		pidStr, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			continue // still running (or not ours to judge)
		}
		dir := filepath.Join(root, e.Name())
		if err := removeTempDir(dir); err != nil {
			log.Warn("remove a killed run's temporary directory", "dir", dir, "err", err)
		} else {
			log.Info("removed a killed run's temporary directory", "dir", dir)
		}
	}
}
