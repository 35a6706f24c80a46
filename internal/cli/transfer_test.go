package cli

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"
)

func TestTransferLine(t *testing.T) {
	for _, tc := range []struct {
		name     string
		n, total int64
		want     string
	}{
		{"known total", 512, 1024, "copying x: 512B of 1KiB (50%)"},
		{"unknown total", 3 << 20, 0, "copying x: 3MiB"},
		{"time only", 0, -1, "copying x: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &transfer{what: "copying x", start: time.Now()}
			p.set(tc.n, tc.total)
			if got := p.line(); !strings.HasPrefix(got, tc.want) {
				t.Errorf("line %q, want it to start with %q", got, tc.want)
			}
		})
	}
}

// TestTransferOffTheTerminal: without a terminal on stderr nothing is
// shown and the wrappers pass data through untouched.
func TestTransferOffTheTerminal(t *testing.T) {
	var stderr bytes.Buffer
	a := &app{stderr: &stderr}
	p := a.newTransfer("copying", 10)
	if p != nil {
		t.Fatal("newTransfer gave a progress line for a stderr that is no terminal")
	}
	var out bytes.Buffer
	if _, err := io.Copy(p.writer(&out), p.reader(strings.NewReader("data"))); err != nil || out.String() != "data" {
		t.Errorf("copy through a nil transfer: %q, %v", out.String(), err)
	}
	p.set(1, 2)
	p.done()
	if stderr.Len() != 0 {
		t.Errorf("stderr got %q, want nothing", stderr.String())
	}
}

// TestSizedReaderLen: the bytes left go down as they are read, so the SDK
// sizes what is left of a file whose progress is shown.
func TestSizedReaderLen(t *testing.T) {
	r := &sizedReader{r: strings.NewReader("abcdef"), left: 6}
	if got := r.Len(); got != 6 {
		t.Fatalf("Len before reading: got %d, want 6", got)
	}
	buf := make([]byte, 4)
	if n, err := r.Read(buf); n != 4 || err != nil {
		t.Fatalf("Read: got %d, %v; want 4, nil", n, err)
	}
	if got := r.Len(); got != 2 {
		t.Errorf("Len after 4 bytes: got %d, want 2", got)
	}
}
