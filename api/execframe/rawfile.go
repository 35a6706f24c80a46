package execframe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Raw file connections (daemon↔agent protocol 6). A connection to the
// agent's API endpoint whose first byte is FrameFileWrite or FrameFileRead
// carries one file's bytes as a plain byte stream, so that every hop can
// move them with splice(2) or sendfile(2) instead of copying them through
// protobuf messages:
//
//   - write: the daemon sends a FrameFileWrite frame (the data's length,
//     big-endian uint64, then a sbx.v1.WriteFileHeader); the agent opens
//     the file under the same rules as the WriteFile RPC and answers
//     FrameFileReady, or FrameError and closes. Then exactly that many raw
//     bytes follow, and the agent answers FrameFileDone (a
//     sbx.v1.WriteFileResponse) or FrameError. A connection that ends
//     before all the bytes came leaves no file behind.
//   - read: the daemon sends a FrameFileRead frame (a
//     sbx.v1.ReadFileRequest); the agent answers FrameFileSize (the
//     length, big-endian uint64) followed by exactly that many raw bytes,
//     or FrameError. A file that shrinks while it is sent ends the
//     connection early; the daemon must treat a short stream as an error.
//     The agent answers FrameError with code Unimplemented for what has no
//     length known up front (not a regular file, or one whose size says 0,
//     as procfs files do): the daemon then reads it with the ReadFile RPC.
//
// The frames around the raw bytes are read with ReadFrameUnbuffered, never
// with a Reader, whose buffer would swallow the raw bytes after them.
const (
	FrameFileWrite byte = 'W'
	FrameFileRead  byte = 'R'
	FrameFileReady byte = 'K'
	FrameFileDone  byte = 'D'
	FrameFileSize  byte = 'S'
)

// MaxFileHeader bounds the payload of the frames around raw file bytes: a
// header holds a path and a few numbers.
const MaxFileHeader = 64 << 10

// ReadFrameUnbuffered reads one frame of at most max payload bytes from r
// without reading past it.
func ReadFrameUnbuffered(r io.Reader, max int) (typ byte, payload []byte, err error) {
	var h [headerLen]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(h[1:])
	if int64(n) > int64(max) {
		return 0, nil, fmt.Errorf("frame %q of %d bytes, more than %d", h[0], n, max)
	}
	payload = make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return h[0], payload, nil
}

// AppendFrame appends one frame of type typ holding payload to b.
func AppendFrame(b []byte, typ byte, payload []byte) []byte {
	b = append(b, typ)
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	return append(b, payload...)
}

// AppendErrorFrame appends a FrameError frame to b.
func AppendErrorFrame(b []byte, code uint32, msg string) []byte {
	p := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(msg)), code)
	return AppendFrame(b, FrameError, append(p, msg...))
}

// FileWriteFrame is the FrameFileWrite frame for size bytes written as hdr
// says.
func FileWriteFrame(size int64, hdr *sbxv1.WriteFileHeader) ([]byte, error) {
	m, err := proto.Marshal(hdr)
	if err != nil {
		return nil, err
	}
	p := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(m)), uint64(size))
	return AppendFrame(nil, FrameFileWrite, append(p, m...)), nil
}

// ParseFileWrite decodes a FrameFileWrite frame's payload.
func ParseFileWrite(payload []byte) (int64, *sbxv1.WriteFileHeader, error) {
	if len(payload) < 8 {
		return 0, nil, errors.New("file write frame shorter than its length field")
	}
	size := int64(binary.BigEndian.Uint64(payload))
	if size < 0 {
		return 0, nil, fmt.Errorf("file write frame: negative length %d", size)
	}
	hdr := &sbxv1.WriteFileHeader{}
	if err := proto.Unmarshal(payload[8:], hdr); err != nil {
		return 0, nil, fmt.Errorf("file write frame: %w", err)
	}
	return size, hdr, nil
}

// SizeFrame is a FrameFileSize frame for size bytes.
func SizeFrame(size int64) []byte {
	return AppendFrame(nil, FrameFileSize, binary.BigEndian.AppendUint64(nil, uint64(size)))
}

// ParseSize decodes a FrameFileSize frame's payload.
func ParseSize(payload []byte) (int64, error) {
	if len(payload) != 8 {
		return 0, fmt.Errorf("file size frame of %d bytes, want 8", len(payload))
	}
	n := int64(binary.BigEndian.Uint64(payload))
	if n < 0 {
		return 0, fmt.Errorf("file size frame: negative length %d", n)
	}
	return n, nil
}

// ParseError decodes a FrameError frame's payload.
func ParseError(payload []byte) *Error {
	if len(payload) < 4 {
		return &Error{Code: 2, Message: "malformed error frame"} // connect.CodeUnknown
	}
	return &Error{Code: binary.BigEndian.Uint32(payload), Message: string(payload[4:])}
}
