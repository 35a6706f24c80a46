package server

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"errors"
	"io"
	"testing"

	"connectrpc.com/connect"
)

// boundedGzip passes what expands little, or to at most minExpansionBound,
// and refuses a message expanding more than maxExpansion times with
// ResourceExhausted.
func TestBoundedGzip(t *testing.T) {
	random := make([]byte, 8<<20)
	_, _ = rand.Read(random)
	for _, tc := range []struct {
		name string
		data []byte
		ok   bool
	}{
		{"a 1 MiB chunk of zeros", make([]byte, 1<<20+16), true},
		{"8 MiB of random bytes", random, true},
		{"8 MiB of zeros", make([]byte, 8<<20), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var z bytes.Buffer
			zw := gzip.NewWriter(&z)
			_, _ = zw.Write(tc.data)
			_ = zw.Close()
			d := &boundedGzip{}
			if err := d.Reset(&z); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(d)
			switch {
			case tc.ok && (err != nil || !bytes.Equal(got, tc.data)):
				t.Errorf("got %d bytes, %v; want the %d bytes back", len(got), err, len(tc.data))
			case !tc.ok && (!errors.Is(err, errExpansion) || connect.CodeOf(err) != connect.CodeResourceExhausted):
				t.Errorf("got %d bytes, %v; want ResourceExhausted saying it expands past its bound", len(got), err)
			}
		})
	}
}
