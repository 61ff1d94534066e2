//go:build !amd64 && !arm64

package reconciler

// prefetch does nothing here (prefetch_asm.go).
func prefetch(uintptr) {}
