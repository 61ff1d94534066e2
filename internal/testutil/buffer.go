package testutil

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer that concurrent writers and readers may share:
// the output of a child process, read by the test while it runs.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
