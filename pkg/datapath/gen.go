package datapath

// The BPF objects and their Go bindings are generated and committed, so
// building the agent needs no clang. Regenerate with `go generate
// ./pkg/datapath` (clang-19, llvm-strip-19 and libbpf-dev installed); CI
// checks that doing so changes nothing.

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -cflags "-O2 -g -Wall -Werror" -type lb4_key -type lb4_service -type lb4_backend -type lb4_rev_nat -type ct4_key -type ct4_entry -type sock_rev_key -type sock_rev_entry -type lb4_affinity_key -type lb4_affinity -type node_dev -type src_range_key sock ../../bpf/sock.c -- -I/usr/include/x86_64-linux-gnu
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -cflags "-O2 -g -Wall -Werror" -no-global-types tc ../../bpf/tc.c -- -I/usr/include/x86_64-linux-gnu
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -cflags "-O2 -g -Wall -Werror" -no-global-types xdp ../../bpf/xdp.c -- -I/usr/include/x86_64-linux-gnu
