package model

import (
	"fmt"
	"maps"
	"net/netip"
	"runtime"
	"testing"
)

// BenchmarkServices compares Services with the Go map it replaced
// (issue 14), at 30,000 and 100,000 frontends: set-one is one frontend
// replaced in a copy (Set; the map: maps.Clone and a store), get a
// lookup, all a walk of every frontend, build all of them from empty (the
// tracker's first state); heap-B/frontend is what each holds, per
// frontend.
func BenchmarkServices(b *testing.B) {
	for _, n := range []int{30000, 100000} {
		keys := make([]L4Addr, n)
		svcs := make([]*Service, n)
		for i := range n {
			keys[i] = L4Addr{Addr: netip.AddrFrom4([4]byte{10, byte(96 + i>>16), byte(i >> 8), byte(i)}), Port: 80, Proto: TCP}
			svcs[i] = &Service{Frontend: keys[i]}
		}
		heap := func(build func() any) float64 {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			v := build()
			runtime.GC()
			runtime.ReadMemStats(&after)
			runtime.KeepAlive(v)
			return float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
		}
		var s Services
		trie := heap(func() any {
			var sb ServicesBuilder
			for i := range n {
				sb.Set(keys[i], svcs[i])
			}
			s = sb.Services()
			return s
		})
		var m map[L4Addr]*Service
		mapped := heap(func() any {
			m = map[L4Addr]*Service{}
			for i := range n {
				m[keys[i]] = svcs[i]
			}
			return m
		})
		b.Run(fmt.Sprintf("%dk/trie/build", n/1000), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var sb ServicesBuilder
				for i := range n {
					sb.Set(keys[i], svcs[i])
				}
				sb.Services()
			}
		})
		b.Run(fmt.Sprintf("%dk/trie/build-one-pass", n/1000), func(b *testing.B) {
			b.ReportAllocs()
			ents := make([]ServiceEntry, n)
			for b.Loop() {
				for i := range n {
					ents[i] = ServiceEntry{keys[i], svcs[i]}
				}
				if _, ok := BuildServices(ents); !ok {
					b.Fatal("a frontend twice")
				}
			}
		})
		b.Run(fmt.Sprintf("%dk/map/build", n/1000), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				m := map[L4Addr]*Service{}
				for i := range n {
					m[keys[i]] = svcs[i]
				}
			}
		})
		b.Run(fmt.Sprintf("%dk/trie/set-one", n/1000), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				c := s
				c.Set(keys[i%n], svcs[(i+1)%n])
				i++
			}
			b.ReportMetric(trie, "heap-B/frontend")
		})
		b.Run(fmt.Sprintf("%dk/map/set-one", n/1000), func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				c := maps.Clone(m)
				c[keys[i%n]] = svcs[(i+1)%n]
				i++
			}
			b.ReportMetric(mapped, "heap-B/frontend")
		})
		b.Run(fmt.Sprintf("%dk/trie/get", n/1000), func(b *testing.B) {
			i := 0
			for b.Loop() {
				if s.Get(keys[i%n]) == nil {
					b.Fatal("missing")
				}
				i += 7919
			}
		})
		b.Run(fmt.Sprintf("%dk/map/get", n/1000), func(b *testing.B) {
			i := 0
			for b.Loop() {
				if m[keys[i%n]] == nil {
					b.Fatal("missing")
				}
				i += 7919
			}
		})
		b.Run(fmt.Sprintf("%dk/trie/all", n/1000), func(b *testing.B) {
			for b.Loop() {
				c := 0
				for range s.All() {
					c++
				}
				if c != n {
					b.Fatal(c)
				}
			}
		})
		b.Run(fmt.Sprintf("%dk/map/all", n/1000), func(b *testing.B) {
			for b.Loop() {
				c := 0
				for range m {
					c++
				}
				if c != n {
					b.Fatal(c)
				}
			}
		})
	}
}
