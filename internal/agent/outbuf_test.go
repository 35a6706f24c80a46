package agent

import (
	"bytes"
	"testing"
)

func TestOutBuf(t *testing.T) {
	type write struct {
		stderr bool
		data   string
	}
	tests := []struct {
		name                   string
		limit                  int
		writes                 []write
		wantOut, wantErr       string
		wantDropOut, wantDropE uint64
	}{
		{name: "under limit", limit: 10, writes: []write{{false, "abc"}, {true, "x"}, {false, "def"}}, wantOut: "abcdef", wantErr: "x"},
		{name: "drop oldest whole chunk", limit: 4, writes: []write{{false, "ab"}, {true, "E"}, {false, "cdef"}}, wantOut: "cdef", wantErr: "E", wantDropOut: 2},
		{name: "trim a chunk", limit: 4, writes: []write{{false, "abc"}, {true, "E"}, {false, "de"}}, wantOut: "bcde", wantErr: "E", wantDropOut: 1},
		{name: "one write beyond limit", limit: 3, writes: []write{{false, "abcdefg"}}, wantOut: "efg", wantDropOut: 4},
		{name: "per stream", limit: 2, writes: []write{{true, "xyz"}, {false, "ab"}}, wantOut: "ab", wantErr: "yz", wantDropE: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b outBuf
			for _, w := range tt.writes {
				b.add(w.stderr, []byte(w.data), tt.limit)
			}
			if got, want := b.buffered(), len(tt.wantOut)+len(tt.wantErr); got != want {
				t.Errorf("buffered: got %d, want %d", got, want)
			}
			var out, errb bytes.Buffer
			for _, c := range b.take() {
				if c.stderr {
					errb.Write(c.data)
				} else {
					out.Write(c.data)
				}
			}
			if got := out.String(); got != tt.wantOut {
				t.Errorf("stdout: got %q, want %q", got, tt.wantOut)
			}
			if got := errb.String(); got != tt.wantErr {
				t.Errorf("stderr: got %q, want %q", got, tt.wantErr)
			}
			do, de := b.takeDropped()
			if do != tt.wantDropOut || de != tt.wantDropE {
				t.Errorf("dropped: got %d/%d, want %d/%d", do, de, tt.wantDropOut, tt.wantDropE)
			}
			if got := b.buffered(); got != 0 {
				t.Errorf("buffered after take: got %d, want 0", got)
			}
		})
	}
}
