package agent

import (
	"strings"
	"testing"
	"time"
)

func readRing(r *logRing, cur *logCursor) (out string, dropped [2]uint64) {
	chunks, d := r.read(cur)
	var b strings.Builder
	for _, c := range chunks {
		if c.stderr {
			b.WriteString("E:")
		}
		b.Write(c.data)
	}
	return b.String(), d
}

func TestLogRingSelect(t *testing.T) {
	t0 := time.Unix(1000, 0)
	fill := func() *logRing {
		r := &logRing{limit: 1 << 10}
		r.add(false, []byte("a1\na2\n"), t0)
		r.add(true, []byte("e1\n"), t0.Add(time.Second))
		r.add(false, []byte("a3\na4"), t0.Add(2*time.Second))
		return r
	}
	for _, tc := range []struct {
		name  string
		since time.Time
		tail  int64
		want  string
	}{
		{"all", time.Time{}, -1, "a1\na2\nE:e1\na3\na4"},
		{"tail 0", time.Time{}, 0, ""},
		{"tail 1 counts a last line without newline", time.Time{}, 1, "a4"},
		{"tail 2", time.Time{}, 2, "a3\na4"},
		{"tail 3 crosses streams", time.Time{}, 3, "E:e1\na3\na4"},
		{"tail 4 cuts a piece", time.Time{}, 4, "a2\nE:e1\na3\na4"},
		{"tail beyond", time.Time{}, 99, "a1\na2\nE:e1\na3\na4"},
		{"since", t0.Add(time.Second), -1, "E:e1\na3\na4"},
		{"since and tail", t0.Add(time.Second), 99, "E:e1\na3\na4"},
		{"since after all", t0.Add(time.Hour), -1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := fill()
			cur := r.cursor(tc.since, tc.tail)
			got, dropped := readRing(r, &cur)
			if got != tc.want || dropped != [2]uint64{} {
				t.Errorf("got %q dropped %v, want %q dropped none", got, dropped, tc.want)
			}
			// Later output reaches the reader, also output appended to a
			// piece it has read (coalescing).
			r.add(false, []byte("!"), t0.Add(2*time.Second))
			if got, _ := readRing(r, &cur); got != "!" {
				t.Errorf("after more output: got %q, want %q", got, "!")
			}
		})
	}
}

func TestLogRingTrailingNewlineTail(t *testing.T) {
	r := &logRing{limit: 1 << 10}
	r.add(false, []byte("x\ny\n"), time.Now())
	cur := r.cursor(time.Time{}, 1)
	if got, _ := readRing(r, &cur); got != "y\n" {
		t.Errorf("tail 1: got %q, want %q", got, "y\n")
	}
}

// TestLogRingDrops: a reader that falls behind is told how many bytes of
// each stream it missed; the ring stays within its bounds.
func TestLogRingDrops(t *testing.T) {
	r := &logRing{limit: 8}
	start := time.Now()
	cur := r.cursor(time.Time{}, -1)
	r.add(false, []byte("0123456789"), start) // 2 dropped at once
	r.add(true, []byte("ab"), start)
	got, d := readRing(r, &cur)
	if got != "23456789E:ab" || d != [2]uint64{2, 0} {
		t.Fatalf("got %q dropped %v, want 23456789E:ab dropped [2 0]", got, d)
	}
	for i := range 10 {
		r.add(false, []byte("xyz"), start.Add(time.Duration(i)*time.Second))
	}
	got, d = readRing(r, &cur)
	if got != "yzxyzxyz" || d != [2]uint64{22, 0} {
		t.Errorf("got %q dropped %v, want yzxyzxyz dropped [22 0]", got, d)
	}
	if r.size != [2]int{8, 2} || r.dropped() != [2]uint64{32, 0} {
		t.Errorf("ring holds %v, dropped %v; want [8 2], [32 0]", r.size, r.dropped())
	}

	old := maxLogChunks
	maxLogChunks = 4
	t.Cleanup(func() { maxLogChunks = old })
	r = &logRing{limit: 1 << 20}
	for i := range 100 {
		r.add(i%2 == 0, []byte("q"), start)
	}
	if len(r.chunks) != 4 || r.size[0]+r.size[1] != 4 || r.dropped() != [2]uint64{48, 48} {
		t.Errorf("%d pieces, %v bytes, dropped %v; want 4 pieces, 4 bytes, [48 48] dropped", len(r.chunks), r.size, r.dropped())
	}
}
