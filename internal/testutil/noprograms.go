package testutil

// NoPrograms is an agent.Datapath without BPF programs, for tests that
// run the agent over a reconciler writing to its own (fake or real)
// datapath: there is nothing to attach, commit, close or put back.
type NoPrograms struct{}

// AttachCgroup attaches nothing.
func (NoPrograms) AttachCgroup(string) error { return nil }

// AttachDevices attaches nothing.
func (NoPrograms) AttachDevices([]string) error { return nil }

// Close closes nothing.
func (NoPrograms) Close() error { return nil }

// Commit has nothing to keep.
func (NoPrograms) Commit() error { return nil }

// Abort has nothing to put back.
func (NoPrograms) Abort() error { return nil }
