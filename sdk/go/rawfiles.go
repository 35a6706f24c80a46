package sbx

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"connectrpc.com/connect"
)

// The daemon's raw file route (internal/server's FilesPath): a file's bytes
// as a plain HTTP/1.1 body, which the daemon splices to and from the
// sandbox's agent, instead of in WriteFile/ReadFile messages. Uploads of a
// known size of at least rawUploadMin and every download take it unless
// the client asked for compression (WithFileCompression: the Connect calls
// gzip) or the daemon predates it (it answers 404; the client then uses the
// Connect calls from there on).
const filesPath = "/sbx/v1/files"

// rawUploadMin is the smallest upload sent over the raw route: the daemon
// takes over each such connection (and closes it after), so small files
// stay on the kept-alive Connect connections.
const rawUploadMin = 1 << 20

// errNoRawRoute is a daemon without the raw file route.
var errNoRawRoute = errors.New("the daemon has no raw file route")

// knownSize returns how many bytes r has left, if that can be known
// without reading it: a regular *os.File (from its offset), or a reader
// with a Len method saying how many bytes are left unread, as
// *bytes.Reader, *bytes.Buffer and *strings.Reader have.
func knownSize(r io.Reader) (int64, bool) {
	switch v := r.(type) {
	case interface{ Len() int }:
		return int64(v.Len()), true
	case *os.File:
		fi, err := v.Stat()
		if err != nil || !fi.Mode().IsRegular() {
			return 0, false
		}
		off, err := v.Seek(0, io.SeekCurrent)
		if err != nil || off > fi.Size() {
			return 0, false
		}
		return fi.Size() - off, true
	}
	return 0, false
}

// useRaw reports whether file data goes over the raw route.
func (c *Client) useRaw() bool { return !c.compressFiles && !c.noRawFiles.Load() }

// filesURL is the raw route with query q.
func (c *Client) filesURL(q url.Values) string {
	return strings.TrimSuffix(c.baseURL, "/") + filesPath + "?" + q.Encode()
}

// uploadRaw sends size bytes of r to path over the raw route.
func (s *Sandbox) uploadRaw(ctx context.Context, path string, r io.Reader, size int64, mode uint32, appendTo bool) (int64, error) {
	q := url.Values{"sandbox": {s.ID}, "path": {path}}
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(mode), 8))
	}
	if appendTo {
		q.Set("append", "1")
	}
	// The transport unwraps the NopCloser and sends an *os.File with
	// sendfile(2); the caller keeps r open.
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, s.c.filesURL(q), io.NopCloser(r))
	if err != nil {
		return 0, err
	}
	req.ContentLength = size
	if size == 0 {
		req.Body = http.NoBody
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	// The daemon says 100 Continue once the agent has opened the file: a
	// refused path costs no body, and an old daemon's 404 none either.
	req.Header.Set("Expect", "100-continue")
	resp, err := s.c.filesHTTP.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fileRouteError(resp)
	}
	var out struct {
		BytesWritten int64 `json:"bytes_written"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&out); err != nil {
		return 0, fmt.Errorf("reading the daemon's answer: %w", err)
	}
	return out.BytesWritten, nil
}

// downloadRaw streams path to w over the raw route.
func (s *Sandbox) downloadRaw(ctx context.Context, path string, w io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.c.filesURL(url.Values{"sandbox": {s.ID}, "path": {path}}), nil)
	if err != nil {
		return err
	}
	resp, err := s.c.filesHTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fileRouteError(resp)
	}
	// 1 MiB at a time (io.Copy's 32 KiB made `sbx cp`'s pipe hand over
	// 3200 pieces per 100 MiB); writerOnly keeps an *os.File's ReadFrom,
	// which would copy 32 KiB at a time again, out of it.
	n, err := io.CopyBuffer(writerOnly{w}, resp.Body, make([]byte, 1<<20))
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("the download ended after %d bytes (the sandbox stopped, or the file changed?): %w", n, err))
	}
	return nil
}

// writerOnly hides all but Write of a writer from io.CopyBuffer.
type writerOnly struct{ io.Writer }

// fileRouteError is the error a non-200 answer of the raw route carries,
// or errNoRawRoute for a daemon without it.
func fileRouteError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	var e struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	if json.Unmarshal(body, &e) != nil || e.Code == "" {
		if resp.StatusCode == http.StatusNotFound {
			return errNoRawRoute
		}
		return connect.NewError(connect.CodeUnknown, fmt.Errorf("daemon answered %s: %s", resp.Status, bytes.TrimSpace(body)))
	}
	var code connect.Code
	if err := code.UnmarshalText([]byte(e.Code)); err != nil {
		code = connect.CodeUnknown
	}
	return connect.NewError(code, errors.New(e.Message))
}
