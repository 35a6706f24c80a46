package execframe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	in := &sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: &sbxv1.ExecRequest{Argv: []string{"true"}, Stdin: []byte("x")}}}
	outs := []*sbxv1.ExecOutput{
		{Event: &sbxv1.ExecOutput_Started{Started: &sbxv1.ExecStarted{Pid: 7}}},
		{Event: &sbxv1.ExecOutput_Stdout{Stdout: bytes.Repeat([]byte("o"), 40<<10)}},
		{Event: &sbxv1.ExecOutput_Exited{Exited: &sbxv1.ExecExited{ExitCode: 3}}},
	}
	if err := w.Write(FrameInput, in); err != nil {
		t.Fatal(err)
	}
	for _, o := range outs {
		if err := w.Write(FrameOutput, o); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.WriteError(5, "no such sandbox"); err != nil {
		t.Fatal(err)
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	r := NewReader(&buf)
	got, err := r.ReadInput()
	if err != nil || !proto.Equal(got, in) {
		t.Fatalf("input: got %v, %v; want %v", got, err, in)
	}
	for _, want := range outs {
		got, err := r.ReadOutput()
		if err != nil || !proto.Equal(got, want) {
			t.Fatalf("output: got %v, %v; want %v", got, err, want)
		}
	}
	_, err = r.ReadOutput()
	var fe *Error
	if !errors.As(err, &fe) || fe.Code != 5 || fe.Message != "no such sandbox" {
		t.Fatalf("error frame: got %v, want code 5 and its message", err)
	}
	if _, err := r.ReadOutput(); !errors.Is(err, io.EOF) {
		t.Fatalf("at the end: got %v, want io.EOF", err)
	}
}

func TestBadFrames(t *testing.T) {
	frame := func(typ byte, n uint32, payload string) []byte {
		b := []byte{typ}
		b = binary.BigEndian.AppendUint32(b, n)
		return append(b, payload...)
	}
	tests := []struct {
		name    string
		data    []byte
		input   bool // ReadInput, else ReadOutput
		wantErr string
	}{
		{"too large", frame(FrameOutput, MaxPayload+1, ""), false, "more than"},
		{"truncated payload", frame(FrameOutput, 10, "abc"), false, "unexpected EOF"},
		{"truncated header", []byte{FrameOutput, 0, 0}, false, "unexpected EOF"},
		{"output where input is due", frame(FrameOutput, 0, ""), true, "want 'I'"},
		{"unknown type", frame('X', 0, ""), false, "frame type 'X'"},
		{"garbage payload", frame(FrameOutput, 3, "\xff\xff\xff"), false, "exec output frame"},
		{"short error frame", frame(FrameError, 2, "ab"), false, "too short"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := NewReader(bytes.NewReader(tc.data))
			var err error
			if tc.input {
				_, err = r.ReadInput()
			} else {
				_, err = r.ReadOutput()
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestAnnouncedLengthNotTrusted: a frame that announces the largest payload
// and then ends costs what arrived, not what was announced.
func TestAnnouncedLengthNotTrusted(t *testing.T) {
	var h [headerLen]byte
	h[0] = FrameInput
	binary.BigEndian.PutUint32(h[1:], MaxPayload)
	in := append(h[:], "abc"...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := NewReader(bytes.NewReader(in)).Next()
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("got %v, want io.ErrUnexpectedEOF", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Errorf("reading a truncated %d-byte frame allocated %d bytes", MaxPayload, grew)
	}
}

// TestErrorOf: an error frame carries a Connect error's code and message
// (not its text, which repeats the code), and other errors with the
// fallback code.
func TestErrorOf(t *testing.T) {
	for _, tc := range []struct {
		err      error
		wantCode connect.Code
		wantMsg  string
	}{
		{connect.NewError(connect.CodeNotFound, errors.New("no such box")), connect.CodeNotFound, "no such box"},
		{fmt.Errorf("exec: %w", connect.NewError(connect.CodeInvalidArgument, errors.New("bad user"))), connect.CodeInvalidArgument, "bad user"},
		{errors.New("plain"), connect.CodeInternal, "plain"},
	} {
		var buf bytes.Buffer
		w := NewWriter(&buf)
		if err := w.WriteErrorOf(tc.err, connect.CodeInternal); err != nil {
			t.Fatal(err)
		}
		if err := w.Flush(); err != nil {
			t.Fatal(err)
		}
		_, err := NewReader(&buf).ReadOutput()
		var fe *Error
		if !errors.As(err, &fe) {
			t.Fatalf("%v: read %v, want an *Error", tc.err, err)
		}
		ce := fe.ConnectError()
		if ce.Code() != tc.wantCode || ce.Message() != tc.wantMsg {
			t.Errorf("%v: got %v %q, want %v %q", tc.err, ce.Code(), ce.Message(), tc.wantCode, tc.wantMsg)
		}
	}
}

// TestDataFieldNumbers holds IsData's field numbers to the generated
// ExecOutput: a renumbered proto must not make a relay pass exited events
// on undecoded.
func TestDataFieldNumbers(t *testing.T) {
	fields := (&sbxv1.ExecOutput{}).ProtoReflect().Descriptor().Fields()
	for _, tc := range []struct {
		name string
		want int
	}{{"stdout", fieldStdout}, {"stderr", fieldStderr}} {
		f := fields.ByName(protoreflect.Name(tc.name))
		if f == nil || int(f.Number()) != tc.want || f.Kind() != protoreflect.BytesKind {
			t.Errorf("ExecOutput.%s: got %v, want bytes field %d", tc.name, f, tc.want)
		}
	}
}

// TestIsData: only a payload that is exactly one stdout or stderr event is
// data a relay may pass on undecoded.
func TestIsData(t *testing.T) {
	enc := func(m *sbxv1.ExecOutput) []byte {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	stdout := enc(&sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Stdout{Stdout: []byte("hello")}})
	exited := enc(&sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Exited{Exited: &sbxv1.ExecExited{ExitCode: 3}}})
	for _, tc := range []struct {
		name    string
		payload []byte
		want    bool
	}{
		{"stdout", stdout, true},
		{"stderr", enc(&sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Stderr{Stderr: []byte("oops")}}), true},
		{"empty stdout", enc(&sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Stdout{Stdout: []byte{}}}), true},
		{"exited", exited, false},
		{"started", enc(&sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Started{Started: &sbxv1.ExecStarted{Pid: 7}}}), false},
		{"keepalive", enc(&sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Keepalive{Keepalive: &sbxv1.ExecKeepalive{}}}), false},
		{"empty", nil, false},
		{"stdout then exited", append(slices.Clone(stdout), exited...), false},
		{"stdout twice", append(slices.Clone(stdout), stdout...), false},
		{"truncated", stdout[:len(stdout)-1], false},
		{"stdout as varint", protowire.AppendVarint(protowire.AppendTag(nil, 2, protowire.VarintType), 5), false},
	} {
		if got := IsData(tc.payload); got != tc.want {
			t.Errorf("%s: IsData(%x) = %v, want %v", tc.name, tc.payload, got, tc.want)
		}
	}
}
