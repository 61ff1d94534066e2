package manifest

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// mappedRSS returns how much of file's mappings in this process is in
// its RSS (/proc/self/smaps), in bytes.
func mappedRSS(t *testing.T, file string) int {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	in, rss := false, 0
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) >= 5 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			in = len(fields) >= 6 && fields[5] == file
			continue
		}
		if in && len(fields) == 3 && fields[0] == "Rss:" {
			kb, _ := strconv.Atoi(fields[1])
			rss += kb << 10
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rss
}

// TestMappedPagesDropsWhatWasRead: the pages of a mapped file that a pass
// has read leave the RSS as it passes them, a dropStep at a time, and
// all of them when it ends.
func TestMappedPagesDropsWhatWasRead(t *testing.T) {
	const size = 8 << 20
	p := filepath.Join(t.TempDir(), "f.json")
	if err := os.WriteFile(p, []byte(strings.Repeat("x", size)), 0o644); err != nil {
		t.Fatal(err)
	}
	sum := 0
	check := func(what string, maxRSS int) {
		t.Helper()
		if got := mappedRSS(t, p); got > maxRSS {
			t.Errorf("%s: %d KiB of the mapping in the RSS, want at most %d", what, got>>10, maxRSS>>10)
		}
	}
	err := readFileMapped(p, func(data []byte, pages *mappedPages) bool {
		for i := 0; i < len(data); i += pageSize {
			sum += int(data[i])
		}
		if got := mappedRSS(t, p); got < size/2 {
			t.Fatalf("the pages read are not in the RSS (%d KiB): nothing to test", got>>10)
		}
		pages.upTo(5 << 20)
		check("after the first 5 MiB were passed", 3<<20+256<<10)
		pages.upTo(5<<20 + 4096) // less than dropStep more: not yet
		check("4 KiB later", 3<<20+256<<10)
		pages.passed(data[6<<20 : 7<<20])
		check("after the first 7 MiB were passed", 1<<20+256<<10)
		pages.passed([]byte("not in the mapping"))
		check("after bytes elsewhere were passed", 1<<20+256<<10)
		pages.dropAll()
		check("after the pass ended", 256<<10)
		// Read again: faulted in again, the same bytes.
		again := 0
		for i := 0; i < len(data); i += pageSize {
			again += int(data[i])
		}
		if again != sum {
			t.Errorf("read again after the drop: %d, want %d", again, sum)
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestFirstLoadDropsMappedPages: while the items of a List are decoded
// from the file's mapping, the pages before the item decoded have left
// the RSS (at most about dropStep of them are in it), where they all
// were.
func TestFirstLoadDropsMappedPages(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"apiVersion":"v1","kind":"List","items":[`)
	const n = 16000
	pad := strings.Repeat("p", 800)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"apiVersion":"v1","kind":"Service","metadata":{"name":"svc-` + strconv.Itoa(i) +
			`","namespace":"bench","annotations":{"pad":"` + pad + `"}},"spec":{"clusterIP":"10.96.` +
			strconv.Itoa(i/250) + "." + strconv.Itoa(i%250+1) + `","ports":[{"port":80}]}}`)
	}
	b.WriteString(`]}`)
	p := filepath.Join(t.TempDir(), "services.json")
	if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	l := newLoader(translate.Options{})
	items, most := 0, 0
	l.afterItem = func() {
		if items++; items%500 == 0 {
			most = max(most, mappedRSS(t, p))
		}
	}
	res, err := l.load(p)
	if err != nil || len(res.Errors) > 0 || res.Services != n {
		t.Fatalf("load: %v %v, %d Services", err, res.Errors, res.Services)
	}
	if items != n {
		t.Fatalf("%d items decoded, want %d", items, n)
	}
	if limit := dropStep + 2<<20; most > limit {
		t.Errorf("while the items of a %d MiB List were decoded, up to %d KiB of it was in the RSS: want at most %d", b.Len()>>20, most>>10, limit>>10)
	}
	t.Logf("a %d MiB List: at most %d KiB of it in the RSS while its items were decoded", b.Len()>>20, most>>10)
}
