// Package execframe owns sbx's framed exec protocol: the messages of the
// Exec RPC (sbx.v1.ExecInput towards the command, sbx.v1.ExecOutput back) in
// length-prefixed frames on a plain stream instead of HTTP/2. Two hops use
// it, because there one HTTP/2 round trip cost about as much as spawning a
// short command:
//
//   - the daemon to the agent: one Unix connection per command, on the
//     agent's exec socket;
//   - a client to the daemon: the API's exec upgrade (GET /exec with
//     "Upgrade: sbx-exec" over HTTP/1.1, see docs/ARCHITECTURE.md), where
//     a connection carries one command after another.
//
// A frame is one type byte, a big-endian uint32 payload length and the
// payload. The caller sends FrameInput frames (the first of a command holds
// its start message); the other side answers with FrameOutput frames,
// ending with the exited event, or with one FrameError frame. The caller
// closing the connection cancels the running command: it never half-closes.
// The package imports only the API's messages, protobuf and connect (for
// its error codes), so the agent and the SDK can use it.
package execframe

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Frame types.
const (
	FrameInput  byte = 'I' // sbx.v1.ExecInput, daemon to agent
	FrameOutput byte = 'O' // sbx.v1.ExecOutput, agent to daemon
	FrameError  byte = 'E' // a Connect error code (uint32) and a message, then the agent closes
)

// MaxPayload bounds a frame's payload: the start message carries stdin given
// up front, output events at most the agent's 32 KiB chunks.
const MaxPayload = 64 << 20

// growStep is the most Next allocates ahead of a payload's bytes arriving.
const growStep = 64 << 10

// bufSize is the reader's and the writer's buffer: room for one whole
// output frame of the agent's (32 KiB of data and a few bytes of header)
// and most of the next, so that a frame goes out in one write instead of a
// full buffer and then its last few bytes, and a relay reads and writes
// more than one frame at a time when they come faster than it sends.
const bufSize = 64 << 10

// headerLen is the type byte and the length.
const headerLen = 5

// Reader reads frames.
type Reader struct {
	r *bufio.Reader
	// buf is reused for payloads that are decoded and not kept
	// (ReadInput, ReadOutput): a relay then allocates no buffer per frame.
	buf []byte
}

// NewReader reads frames from r.
func NewReader(r io.Reader) *Reader { return &Reader{r: bufio.NewReaderSize(r, bufSize)} }

// Buffered is how many bytes have been read from the stream and not yet
// returned in a frame: more than zero means the next frame (or part of it)
// is already here, so a relay may hold its writes back for it.
func (fr *Reader) Buffered() int { return fr.r.Buffered() }

// NextShared reads one frame as Next does, into storage the reader reuses:
// the payload is valid only until the next read. A relay that writes it on
// at once (Writer.WriteFrame) allocates nothing per frame.
func (fr *Reader) NextShared() (typ byte, payload []byte, err error) {
	return fr.nextDecoded()
}

// Next reads one frame. A clean end of stream before a frame is io.EOF; one
// inside a frame is io.ErrUnexpectedEOF.
func (fr *Reader) Next() (typ byte, payload []byte, err error) {
	return fr.next(nil)
}

// next reads one frame into buf's storage (grown as bytes arrive, never to
// the announced length up front), or into a new slice when buf is nil.
func (fr *Reader) next(buf []byte) (typ byte, payload []byte, err error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(fr.r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if n > MaxPayload {
		return 0, nil, fmt.Errorf("exec frame of %d bytes, more than %d", n, MaxPayload)
	}
	payload = buf[:0]
	if payload == nil {
		payload = make([]byte, 0, min(n, growStep))
	}
	for len(payload) < int(n) {
		chunk := min(int(n)-len(payload), growStep)
		payload = slices.Grow(payload, chunk)
		got, err := io.ReadFull(fr.r, payload[len(payload):len(payload)+chunk])
		payload = payload[:len(payload)+got]
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return 0, nil, err
		}
	}
	return h[0], payload, nil
}

// nextDecoded reads a frame whose payload the caller decodes (copying what
// it keeps) before the next read: into the reader's reused buffer, which
// is let go when a rare huge frame grew it past growStep.
func (fr *Reader) nextDecoded() (typ byte, payload []byte, err error) {
	typ, payload, err = fr.next(fr.buf)
	if cap(payload) <= growStep {
		fr.buf = payload[:0]
	} else {
		fr.buf = nil
	}
	return typ, payload, err
}

// ReadInput reads a FrameInput frame.
func (fr *Reader) ReadInput() (*sbxv1.ExecInput, error) {
	typ, payload, err := fr.nextDecoded()
	if err != nil {
		return nil, err
	}
	if typ != FrameInput {
		return nil, fmt.Errorf("exec frame type %q, want %q", typ, FrameInput)
	}
	in := &sbxv1.ExecInput{}
	if err := proto.Unmarshal(payload, in); err != nil {
		return nil, fmt.Errorf("exec input frame: %w", err)
	}
	return in, nil
}

// Error is a FrameError frame's content.
type Error struct {
	Code    uint32 // a connect.Code
	Message string
}

func (e *Error) Error() string { return e.Message }

// ConnectError is e as the Connect error it stands for.
func (e *Error) ConnectError() *connect.Error {
	return connect.NewError(connect.Code(e.Code), errors.New(e.Message))
}

// ReadOutput reads a FrameOutput frame; a FrameError frame is returned as
// an *Error.
func (fr *Reader) ReadOutput() (*sbxv1.ExecOutput, error) {
	typ, payload, err := fr.nextDecoded()
	if err != nil {
		return nil, err
	}
	return DecodeOutput(typ, payload)
}

// DecodeOutput decodes a frame read with Next or NextShared as ReadOutput
// does.
func DecodeOutput(typ byte, payload []byte) (*sbxv1.ExecOutput, error) {
	switch typ {
	case FrameOutput:
		out := &sbxv1.ExecOutput{}
		if err := proto.Unmarshal(payload, out); err != nil {
			return nil, fmt.Errorf("exec output frame: %w", err)
		}
		return out, nil
	case FrameError:
		if len(payload) < 4 {
			return nil, errors.New("exec error frame too short")
		}
		return nil, &Error{Code: binary.BigEndian.Uint32(payload), Message: string(payload[4:])}
	}
	return nil, fmt.Errorf("exec frame type %q, want %q or %q", typ, FrameOutput, FrameError)
}

// Field numbers of sbx.v1.ExecOutput's data events (process.proto;
// TestDataFieldNumbers checks them against the generated descriptor).
const (
	fieldStdout = 2
	fieldStderr = 3
)

// IsData reports whether a FrameOutput frame's payload is exactly one
// stdout or stderr event, encoded as the agent encodes it: one
// length-delimited field 2 or 3 that spans the whole payload. A relay may
// pass such a frame on without decoding it (nothing in it needs the
// daemon's attention: the bytes are the command's, bounded by MaxPayload),
// and must decode any other (a started, keepalive or exited event, or
// something it should refuse). Anything else, including a stdout field
// followed by an exited one (which a decoder would read as exited), is not
// data.
func IsData(payload []byte) bool {
	_, _, ok := DataOf(payload)
	return ok
}

// DataOf returns the command's bytes of a payload IsData accepts (a slice
// of payload, not a copy) and whether they are stderr; ok is false for
// any other payload, which the caller decodes instead.
func DataOf(payload []byte) (data []byte, stderr, ok bool) {
	num, typ, n := protowire.ConsumeTag(payload)
	if n < 0 || typ != protowire.BytesType || (num != fieldStdout && num != fieldStderr) {
		return nil, false, false
	}
	data, m := protowire.ConsumeBytes(payload[n:])
	if m < 0 || n+m != len(payload) {
		return nil, false, false
	}
	return data, num == fieldStderr, true
}

// Writer writes frames into a buffer; Flush sends them.
type Writer struct {
	w *bufio.Writer
	// scratch is reused to marshal messages.
	scratch []byte
}

// NewWriter writes frames to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: bufio.NewWriterSize(w, bufSize)} }

// Write buffers one frame of type typ holding m.
func (fw *Writer) Write(typ byte, m proto.Message) error {
	b, err := proto.MarshalOptions{}.MarshalAppend(fw.scratch[:0], m)
	if err != nil {
		return err
	}
	if cap(b) <= growStep {
		fw.scratch = b
	}
	return fw.writeRaw(typ, b)
}

// WriteErrorOf buffers a FrameError frame for err as a Connect handler
// would answer it: the code and message of the *connect.Error in it, else
// otherwise and err's text.
func (fw *Writer) WriteErrorOf(err error, otherwise connect.Code) error {
	code, msg := otherwise, err.Error()
	if ce := new(connect.Error); errors.As(err, &ce) {
		code, msg = ce.Code(), ce.Message()
	}
	return fw.WriteError(uint32(code), msg)
}

// WriteError buffers a FrameError frame.
func (fw *Writer) WriteError(code uint32, msg string) error {
	b := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(msg)), code)
	return fw.writeRaw(FrameError, append(b, msg...))
}

// WriteFrame buffers one frame of type typ holding payload as it is (a
// frame read with NextShared, passed on undecoded).
func (fw *Writer) WriteFrame(typ byte, payload []byte) error { return fw.writeRaw(typ, payload) }

func (fw *Writer) writeRaw(typ byte, b []byte) error {
	if len(b) > MaxPayload {
		return fmt.Errorf("exec frame of %d bytes, more than %d", len(b), MaxPayload)
	}
	var h [headerLen]byte
	h[0] = typ
	binary.BigEndian.PutUint32(h[1:], uint32(len(b)))
	if _, err := fw.w.Write(h[:]); err != nil {
		return err
	}
	_, err := fw.w.Write(b)
	return err
}

// Flush sends the buffered frames.
func (fw *Writer) Flush() error { return fw.w.Flush() }
