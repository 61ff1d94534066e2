// Package testutil is the one home of Sluice's test infrastructure: what
// more than one test package needs and no production code may use. It is
// internal, so it is no part of the module's public surface, and it may
// import testing.
//
// The root package holds the small helpers every kind of test reaches for:
// the privileged check (Privileged), a pin directory on bpffs (PinDir),
// polling until a condition holds (Eventually, EventuallyTrue), requests
// kept up in the background across an agent restart (Traffic), a run loop
// kept going until the test ends (RunUntilCleanup), an agent datapath with
// no programs to attach (NoPrograms), a buffer that concurrent writers
// share (Buffer), a median and its spread (Median, SpreadOf), a scale
// benchmark's sizes (ScaleSizes), the process's CPU time (CPUTime), another
// process's CPU ticks and memory from /proc (ReadProcTicks,
// ReadProcStatusKB), the last lines of a log (LastLines), a
// /metrics scrape (Scrape, Samples), the frontends /readyz?verbose lists
// as not programmed (NotProgrammed), the module's root directory
// (ModuleRoot), distinct free loopback ports (FreePorts) and the
// decisions a fuzz target takes from the fuzzer's bytes (Choices). The
// subpackages are the larger pieces:
//
//   - topology: network namespaces, veths, cgroups, servers and processes
//     in them, for the end-to-end tests, the demo and the benchmarks;
//   - packet: the one builder of test packets (Ethernet, IPv4, TCP, UDP,
//     ICMP) with checksums computed from scratch, and the checker that
//     recomputes the checksums of a program's output;
//   - agentproc: the real sluice agent as a process in a namespace (build
//     once, start, readiness, manifests, teardown);
//   - kubeclient: writes to Kubernetes objects through client-go (a Node's
//     update), against the fake clientset and the real apiserver alike.
//
// None of it imports pkg/datapath: the datapath's own tests use it, and an
// import back would be a cycle.
package testutil
