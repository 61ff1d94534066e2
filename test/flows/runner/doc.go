// Package runner plays the packet-flow corpus (package flows, the YAML
// next to it) as real traffic against the real sluice binary, and reports
// per flow whether Sluice gives the expected answer: kube-proxy's, or a
// deviation the corpus documents.
//
// Each case gets a network of its own (net.go): this node, where the agent
// runs with tc on its uplink and on every pod's veth and socket load
// balancing on a cgroup that holds only the node's own clients; pods behind
// it; another node holding every remote endpoint; a router with the
// external hosts behind it, which also traps packets the node lets through
// untranslated. Every endpoint, and every original destination of an
// UNTOUCHED flow, is a reporting server that says which address it was
// reached on and which source it saw, so translation and masquerade are
// read from what the servers saw, not inferred.
//
// A flow is judged from probes (judge.go): connections until every
// expected endpoint has answered and no other, masqueraded as expected;
// sticky or expiring affinity; REJECT (ECONNREFUSED at once), DROP (no
// answer, and nothing saw it arrive anywhere), UNTOUCHED (the sink at the
// destination sees the original source), HEALTHCHECK (the health-check
// server's status and local endpoint count). The corpus's node settings
// become agent flags through one table (settings.go); a flag the agent
// does not know yet is dropped and noted on every flow of the case.
//
// The run writes results/latest.md and compares the failures with
// known-failures.txt, which may only shrink (report.go). README.md in the
// parent directory says how to run it and read the results.
package runner
