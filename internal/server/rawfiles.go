package server

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/splice"
)

// The API's raw file route: a file's bytes as a plain HTTP/1.1 body, moved
// between the client's connection and the agent's with splice(2), instead
// of in WriteFile/ReadFile messages (which cost the daemon, the agent and
// the client about half a CPU-second per 100 MiB in framing, protobuf
// copies and garbage).
//
//	PUT FilesPath?sandbox=S&path=P[&mode=644][&append=1][&parents=0]
//	  with a Content-Length (no chunked bodies) writes the body to the file,
//	  all or nothing unless appending, as WriteFile does (parents are made
//	  unless parents=0). "Expect: 100-continue" is answered once the agent
//	  has opened the file, so a refused path costs no body. The answer is
//	  JSON, {"bytes_written": N}, and the connection closes after it (the
//	  daemon took it over to splice from it).
//	GET FilesPath?sandbox=S&path=P[&offset=N][&length=N]
//	  answers the file's bytes with a Content-Length; a body shorter than
//	  that (the connection cut) means the transfer failed. Files without a
//	  length known up front (procfs, devices) and agents older than
//	  protocol 6 are answered chunked, from the ReadFile stream.
//
// Errors are JSON, {"code": "<connect code>", "message": "..."}, with the
// HTTP status Connect gives the code. The same tenancy rules as the
// WriteFile and ReadFile RPCs apply, and the calls count against the
// sandbox's --file-max-streams. The daemon holds no more of a transfer than
// a pipe's pages (agentconn.RawPipeBytes), so the request bytes budget has
// nothing to charge (the fallback for old agents reads 1 MiB at a time).
const FilesPath = "/sbx/v1/files"

// rawDrainTimeout bounds how long the daemon reads (and drops) the rest of
// a body it refused midway, so that the client reads the answer instead of
// a reset.
const rawDrainTimeout = 5 * time.Second

// serveFiles serves FilesPath for an authenticated request. The request's
// Observer counts it as the WriteFile or ReadFile call it stands for.
func (f *Front) serveFiles(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	var procedure string
	var err error
	switch r.Method {
	case http.MethodPut:
		procedure = sbxv1connect.SandboxServiceWriteFileProcedure
		err = f.serveUpload(w, r)
	case http.MethodGet:
		procedure = sbxv1connect.SandboxServiceReadFileProcedure
		err = f.serveDownload(w, r)
	default:
		w.Header().Set("Allow", "GET, PUT")
		writeFileError(w, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("%s takes GET (download) and PUT (upload), not %s", FilesPath, r.Method)))
		return
	}
	observerFrom(r.Context()).called(r.Context(), procedure, nil, time.Since(start), err)
}

// fileQuery reads the query parameters of FilesPath.
type fileQuery struct {
	sandbox, path       string
	mode                uint32
	appendTo, noParents bool
	offset, length      int64
}

func parseFileQuery(r *http.Request) (fileQuery, error) {
	q := r.URL.Query()
	fq := fileQuery{sandbox: q.Get("sandbox"), path: q.Get("path"), appendTo: q.Get("append") == "1", noParents: q.Get("parents") == "0"}
	if fq.sandbox == "" || fq.path == "" {
		return fq, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s needs the sandbox and path query parameters", FilesPath))
	}
	if s := q.Get("mode"); s != "" {
		m, err := strconv.ParseUint(s, 8, 32)
		if err != nil || m > 0o7777 {
			return fq, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("mode %q is not an octal permission (e.g. 644)", s))
		}
		fq.mode = uint32(m)
	}
	for _, p := range []struct {
		name string
		v    *int64
	}{{"offset", &fq.offset}, {"length", &fq.length}} {
		if s := q.Get(p.name); s != "" {
			n, err := strconv.ParseInt(s, 10, 64)
			if err != nil || n < 0 {
				return fq, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s %q is not a non-negative integer", p.name, s))
			}
			*p.v = n
		}
	}
	return fq, nil
}

// serveUpload writes a PUT's body into a file of the sandbox.
func (f *Front) serveUpload(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	fq, err := parseFileQuery(r)
	if err == nil && r.ProtoMajor != 1 {
		err = connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s uploads need HTTP/1.1", FilesPath))
	}
	if err == nil && r.ContentLength < 0 {
		err = connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s uploads need a Content-Length (no chunked bodies)", FilesPath))
	}
	if err == nil {
		err = admit(ctx, sbxv1connect.SandboxServiceWriteFileProcedure)
	}
	if err != nil {
		writeFileError(w, err)
		return err
	}
	conn, release, err := f.streams.file(ctx, fq.sandbox)
	if err != nil {
		writeFileError(w, err)
		return err
	}
	defer release()
	nc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		err = connect.NewError(connect.CodeInternal, fmt.Errorf("taking over the connection: %w", err))
		writeFileError(w, err)
		return err
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Time{})
	// The request's context lasts as long as this handler; the front's
	// ends when the daemon stops (the server no longer tracks nc).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(f.done, cancel)()
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()

	// Body bytes read with the request head come first, then the socket.
	var src io.Reader = nc
	if k := brw.Reader.Buffered(); k > 0 {
		p, _ := brw.Reader.Peek(k)
		src = &splice.Prefixed{P: p, R: nc}
	}
	expect := strings.EqualFold(r.Header.Get("Expect"), "100-continue")
	continued := false
	ready := func() error {
		if expect {
			continued = true
			if _, err := io.WriteString(nc, "HTTP/1.1 100 Continue\r\n\r\n"); err != nil {
				return fmt.Errorf("%w: answering 100-continue: %w", splice.ErrSource, err)
			}
		}
		return nil
	}
	hdr := &sbxv1.WriteFileHeader{Sandbox: fq.sandbox, Path: fq.path, Mode: fq.mode, MakeParents: !fq.noParents, Append: fq.appendTo}
	var written int64
	resp, taken, err := conn.WriteFileRaw(ctx, hdr, r.ContentLength, src, ready)
	if errors.Is(err, errors.ErrUnsupported) {
		// An agent before protocol 6: the WriteFile stream.
		if err = ready(); err == nil {
			written, taken, err = writeFileStream(ctx, conn, hdr, src, r.ContentLength)
		}
	} else if err == nil {
		written = resp.GetBytesWritten()
	}
	if err != nil {
		if errors.Is(err, splice.ErrSource) || ctx.Err() != nil {
			return err // the client left (or the daemon stops): nobody to answer
		}
		writeRawAnswer(nc, fileErrorStatus(err), fileErrorBody(err))
		if !expect || continued {
			// Read what the client still sends, so that it gets the
			// answer rather than a reset.
			_ = closeWrite(nc)
			_ = nc.SetReadDeadline(time.Now().Add(rawDrainTimeout))
			_, _ = io.Copy(io.Discard, io.LimitReader(src, r.ContentLength-taken))
		}
		return err
	}
	b, _ := json.Marshal(map[string]int64{"bytes_written": written})
	writeRawAnswer(nc, http.StatusOK, b)
	return nil
}

// writeFileStream is the WriteFile stream to an older agent: the body in
// 1 MiB messages. It returns the bytes written and the bytes read from
// body.
func writeFileStream(ctx context.Context, conn *agentconn.Conn, hdr *sbxv1.WriteFileHeader, body io.Reader, size int64) (written, taken int64, err error) {
	out := conn.WriteFile(ctx)
	if err := out.Send(&sbxv1.WriteFileRequest{Msg: &sbxv1.WriteFileRequest_Header{Header: hdr}}); err != nil && !errors.Is(err, io.EOF) {
		return 0, 0, err
	}
	buf := make([]byte, min(size, 1<<20))
	for taken < size {
		k, err := io.ReadFull(body, buf[:min(int64(len(buf)), size-taken)])
		taken += int64(k)
		if err != nil {
			out.CloseAndReceive() //nolint:errcheck // already failing
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return 0, taken, fmt.Errorf("%w: %w", splice.ErrSource, err)
		}
		if err := out.Send(&sbxv1.WriteFileRequest{Msg: &sbxv1.WriteFileRequest_Data{Data: buf[:k]}}); err != nil {
			if errors.Is(err, io.EOF) {
				break // the agent ended the stream; CloseAndReceive says why
			}
			return 0, taken, err
		}
	}
	resp, err := out.CloseAndReceive()
	if err != nil {
		return 0, taken, err
	}
	return resp.Msg.GetBytesWritten(), taken, nil
}

// serveDownload answers a GET with the file's bytes.
func (f *Front) serveDownload(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	fq, err := parseFileQuery(r)
	if err == nil {
		err = admit(ctx, sbxv1connect.SandboxServiceReadFileProcedure)
	}
	if err != nil {
		writeFileError(w, err)
		return err
	}
	conn, release, err := f.streams.file(ctx, fq.sandbox)
	if err != nil {
		writeFileError(w, err)
		return err
	}
	defer release()
	req := &sbxv1.ReadFileRequest{Sandbox: fq.sandbox, Path: fq.path, Offset: fq.offset, Length: fq.length}
	rr, err := conn.ReadFileRaw(ctx, req)
	if errors.Is(err, errors.ErrUnsupported) {
		return readFileStream(ctx, w, conn, req)
	}
	if err != nil {
		writeFileError(w, err)
		return err
	}
	defer rr.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(rr.Size, 10))
	w.WriteHeader(http.StatusOK)
	// http's response.ReadFrom hands the LimitedReader over the agent's
	// socket to the client connection's ReadFrom: spliced (plain TCP).
	if n, err := io.Copy(w, rr.Body); n < rr.Size {
		observerFrom(ctx).called(ctx, sbxv1connect.SandboxServiceReadFileProcedure, nil, 0,
			connect.NewError(connect.CodeUnavailable, fmt.Errorf("download cut after %d of %d bytes: %w", n, rr.Size, err)))
		panic(http.ErrAbortHandler) // cut the connection: the client sees a short body
	}
	return nil
}

// readFileStream answers a download from the ReadFile stream (chunked).
func readFileStream(ctx context.Context, w http.ResponseWriter, conn *agentconn.Conn, req *sbxv1.ReadFileRequest) error {
	st, err := conn.ReadFile(ctx, connect.NewRequest(req))
	if err != nil {
		writeFileError(w, err)
		return err
	}
	defer st.Close()
	started := false
	for st.Receive() {
		if !started {
			w.Header().Set("Content-Type", "application/octet-stream")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		if _, err := w.Write(st.Msg().GetData()); err != nil {
			return err
		}
	}
	if err := st.Err(); err != nil {
		if started {
			observerFrom(ctx).called(ctx, sbxv1connect.SandboxServiceReadFileProcedure, nil, 0, err)
			panic(http.ErrAbortHandler)
		}
		writeFileError(w, err)
		return err
	}
	if !started {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
	}
	return nil
}

// fileErrorStatus is the HTTP status Connect answers err's code with.
func fileErrorStatus(err error) int {
	switch connect.CodeOf(err) {
	case connect.CodeCanceled:
		return 499
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition, connect.CodeOutOfRange:
		return http.StatusBadRequest
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeAlreadyExists, connect.CodeAborted:
		return http.StatusConflict
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeUnimplemented:
		return http.StatusNotImplemented
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	}
	return http.StatusInternalServerError
}

// fileErrorBody is err as JSON: its Connect code and message.
func fileErrorBody(err error) []byte {
	msg := err.Error()
	if ce := new(connect.Error); errors.As(err, &ce) {
		msg = ce.Message()
	}
	b, _ := json.Marshal(map[string]string{"code": connect.CodeOf(err).String(), "message": msg})
	return b
}

// writeFileError answers a request not taken over with err.
func writeFileError(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(fileErrorStatus(err))
	_, _ = w.Write(fileErrorBody(err))
}

// writeRawAnswer writes a whole HTTP/1.1 answer on a taken-over connection,
// which closes after it.
func writeRawAnswer(nc net.Conn, status int, body []byte) {
	bw := bufio.NewWriter(nc)
	fmt.Fprintf(bw, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n", status, http.StatusText(status), len(body))
	_, _ = bw.Write(body)
	_ = bw.Flush()
}
