package datapath

// The BPF objects and their Go bindings are generated and committed, so
// building the agent needs no clang. Regenerate with `go generate
// ./pkg/datapath` (clang-19 and llvm-strip-19 installed); CI checks that
// doing so changes nothing. The kernel and libbpf headers are vendored in
// bpf/vendor and the build uses no other (-nostdinc), so the objects do
// not depend on the host's headers.

//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -cflags "-O2 -g -mcpu=v3 -Wall -Werror -nostdinc" -type lb4_key -type lb4_service -type lb4_backend -type lb4_rev_nat -type ct4_key -type ct4_entry -type ct_backend_key -type ct_gc_args -type sock_rev_key -type sock_rev_entry -type sock_udp_stick_key -type sock_udp_stick -type lb4_affinity_key -type lb4_affinity -type affinity_fix_key -type affinity_fix_args -type affinity_client -type node_dev -type src_range_key -type node_cidr_key -type ct_dir -type ct_flags -type svc_flags -type backend_flags -type rev_nat_flags -type lb_scope -type node_dev_flags -type node_cidr_kind -type metric_reason -type svc_stats -type svc_drop_reason -type explain_record -type explain6_record -type explain_flags -type sock_explain_ctx -type lb6_key -type lb6_backend -type lb6_rev_nat -type src_range6_key -type lb6_affinity_key -type lb6_affinity -type affinity_fix6_key -type sock6_rev_key -type sock6_rev_entry -type sock6_udp_stick_key -type sock6_udp_stick sock ../../bpf/sock.c -- -I../../bpf/vendor
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -cflags "-O2 -g -mcpu=v3 -Wall -Werror -nostdinc" -no-global-types -type v6addr -type ct6_key -type ct6_entry -type ct6_backend_key -type icmp_rl_key -type icmp_rl_peer -type icmp_rl_global -type icmp_rl_conf tc ../../bpf/tc.c -- -I../../bpf/vendor
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -cflags "-O2 -g -mcpu=v3 -Wall -Werror -nostdinc" -no-global-types -type fib4_key -type fib6_key -type fib_hop xdp ../../bpf/xdp.c -- -I../../bpf/vendor
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -cflags "-O2 -g -mcpu=v3 -Wall -Werror -nostdinc" -no-global-types ctgc ../../bpf/ctgc.c -- -I../../bpf/vendor
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -cflags "-O2 -g -mcpu=v3 -Wall -Werror -nostdinc" -no-global-types -type sock_term_rec -type sock_term6_rec -type sock_term_verdict sockdestroy ../../bpf/sockdestroy.c -- -I../../bpf/vendor
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -cflags "-O2 -g -mcpu=v3 -Wall -Werror -nostdinc" -no-global-types migrate ../../bpf/migrate.c -- -I../../bpf/vendor
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -cflags "-O2 -g -mcpu=v3 -Wall -Werror -nostdinc" -no-global-types -type map_count_rec mapcount ../../bpf/mapcount.c -- -I../../bpf/vendor
