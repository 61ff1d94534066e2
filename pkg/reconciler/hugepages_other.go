//go:build !linux

package reconciler

const hugePage = 2 << 20

// makeHuge is make where there are no transparent huge pages to ask for
// (hugepages_linux.go).
func makeHuge[T any](n int) []T { return make([]T, n) }
