package execframe

import (
	"bytes"
	"io"
	"testing"

	"google.golang.org/protobuf/proto"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// FuzzReader feeds the frame reader what the other end of an exec
// connection sends (a client to the daemon, a box's agent to the daemon).
// Frames re-encode to the bytes they were read from; no frame is bigger
// than MaxPayload, nor held in more memory than the bytes that arrived
// plus one growth step; a stream that ends mid-frame says so.
func FuzzReader(f *testing.F) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	_ = w.Write(FrameInput, &sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: &sbxv1.ExecRequest{Argv: []string{"true"}}}})
	_ = w.Write(FrameOutput, &sbxv1.ExecOutput{})
	_ = w.WriteError(3, "bad")
	_ = w.Flush()
	f.Add(buf.Bytes())
	f.Add([]byte{'I', 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{'I', 0x04, 0, 0, 0, 1, 2})
	f.Fuzz(func(t *testing.T, in []byte) {
		fr := NewReader(bytes.NewReader(in))
		var again bytes.Buffer
		rw := NewWriter(&again)
		var err error
		for {
			var typ byte
			var payload []byte
			if typ, payload, err = fr.Next(); err != nil {
				break
			}
			if len(payload) > MaxPayload || cap(payload) > len(in)+growStep {
				t.Fatalf("frame of %d bytes (capacity %d) from %d bytes of input", len(payload), cap(payload), len(in))
			}
			if err := rw.writeRaw(typ, payload); err != nil {
				t.Fatal(err)
			}
		}
		_ = rw.Flush()
		if !bytes.HasPrefix(in, again.Bytes()) {
			t.Fatalf("frames re-encode to %x, not a prefix of the input", again.Bytes())
		}
		if again.Len() == len(in) && err != io.EOF {
			t.Fatalf("clean end after whole frames: got %v, want io.EOF", err)
		}
		if again.Len() < len(in) && err == io.EOF {
			t.Fatalf("%d bytes left over but the reader said io.EOF", len(in)-again.Len())
		}

		// Typed reads: a decoded message written back reads the same.
		out, err := NewReader(bytes.NewReader(in)).ReadOutput()
		if err != nil {
			return
		}
		var b bytes.Buffer
		ow := NewWriter(&b)
		if err := ow.Write(FrameOutput, out); err != nil {
			t.Fatal(err)
		}
		_ = ow.Flush()
		back, err := NewReader(&b).ReadOutput()
		if err != nil || !proto.Equal(back, out) {
			t.Fatalf("output %v came back as %v, %v", out, back, err)
		}
	})
}
