package server

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
)

// What one request message may make the daemon hold. The daemon reads a
// message whole and decodes it (unknown fields included, which protobuf
// keeps) before the handler sees it, and a streaming handler keeps its
// request until it ends. Two bounds keep that in proportion to what the
// client sends and needs:
//
//   - bulk procedures (bulkProcedures: file data, tars, stdin, build
//     contexts, code) take messages up to maxRequestMessage; every other
//     procedure up to maxSmallRequestMessage, far above its largest
//     legitimate request (a create's argv and env are at most 1 MiB);
//   - a compressed message may expand to at most maxExpansion times its
//     compressed size, and always to minExpansionBound (so the SDKs' 1 MiB
//     file chunks, which WithFileCompression gzips, pass whatever they
//     hold).
//
// Before, 40 Events calls whose requests carried 60 MiB of zeros in an
// unknown field, gzip-compressed to 61 KB each, made the daemon hold 5.3 GiB
// for as long as the streams stayed open (TestRequestBombs).
const (
	maxSmallRequestMessage = 4 << 20
	maxExpansion           = 100
	minExpansionBound      = 2 << 20
)

// bulkProcedures take messages up to maxRequestMessage.
var bulkProcedures = map[string]bool{
	sbxv1connect.SandboxServiceExecProcedure:             true, // stdin
	sbxv1connect.SandboxServiceExecInteractiveProcedure:  true,
	sbxv1connect.SandboxServiceWriteFileProcedure:        true,
	sbxv1connect.SandboxServiceUploadTarProcedure:        true,
	sbxv1connect.ImageServiceImportImageProcedure:        true,
	sbxv1connect.ImageServiceBuildImageProcedure:         true, // context, copy tars (the builder's budget)
	sbxv1connect.CodebaseServiceCreateCodebaseProcedure:  true,
	sbxv1connect.ProcessServiceStartProcessProcedure:     true, // stdin
	sbxv1connect.ProcessServiceSendProcessInputProcedure: true,
	sbxv1connect.CodeServiceRunCodeProcedure:             true, // code
}

// serveService mounts one service on mux: its bulk procedures with
// maxRequestMessage, the others with maxSmallRequestMessage. newHandler is
// the service's generated constructor bound to its implementation.
func serveService(mux *http.ServeMux, newHandler func(...connect.HandlerOption) (string, http.Handler)) {
	path, small := newHandler(handlerOptions(maxSmallRequestMessage)...)
	mux.Handle(path, small)
	var big http.Handler
	for proc, bulk := range bulkProcedures {
		if !bulk || !strings.HasPrefix(proc, path) {
			continue
		}
		if big == nil {
			_, big = newHandler(handlerOptions(maxRequestMessage)...)
		}
		mux.Handle(proc, big)
	}
}

// handlerOptions are the options of an API service handler taking
// messages up to readMax. The tenancy interceptor is here so that no
// service can be served without it.
func handlerOptions(readMax int) []connect.HandlerOption {
	opts := []connect.HandlerOption{
		connect.WithCompressMinBytes(compressMinBytes),
		connect.WithReadMaxBytes(readMax),
		connect.WithCompression("gzip",
			func() connect.Decompressor { return &boundedGzip{} },
			func() connect.Compressor { return gzip.NewWriter(io.Discard) }),
		connect.WithInterceptors(tenancyInterceptor{}),
	}
	for _, c := range jsonCodecs() {
		opts = append(opts, connect.WithCodec(c)) // JSON clients' enum names (jsonenums.go)
	}
	return opts
}

// errExpansion is a compressed message expanding past its bound.
var errExpansion = errors.New("compressed request expands more than its bound")

// boundedGzip is the API's gzip decompressor: a message may expand to at
// most maxExpansion times the compressed bytes read (at least
// minExpansionBound), so that a few KB of compressed zeros cannot make the
// daemon hold the 64 MiB a message may have.
type boundedGzip struct {
	src countingReader
	zr  *gzip.Reader
	out int64
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (d *boundedGzip) Reset(r io.Reader) error {
	d.src, d.out = countingReader{r: r}, 0
	if d.zr == nil {
		zr, err := gzip.NewReader(&d.src)
		if err != nil {
			return err
		}
		d.zr = zr
		return nil
	}
	return d.zr.Reset(&d.src)
}

func (d *boundedGzip) Read(p []byte) (int, error) {
	if d.zr == nil {
		return 0, io.ErrUnexpectedEOF
	}
	n, err := d.zr.Read(p)
	d.out += int64(n)
	if d.out > minExpansionBound && d.out > maxExpansion*d.src.n {
		return n, fmt.Errorf("%w: %d bytes from %d compressed, more than %d times (send such data uncompressed): %w",
			errExpansion, d.out, d.src.n, maxExpansion, connect.NewError(connect.CodeResourceExhausted, errExpansion))
	}
	return n, err
}

func (d *boundedGzip) Close() error {
	if d.zr == nil {
		return nil
	}
	return d.zr.Close()
}
