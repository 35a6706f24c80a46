package sbx

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"
)

// TestFileRouteError: a daemon without the raw route (a 404 that is not
// the route's JSON) is errNoRawRoute, so the SDK falls back; the route's
// own errors keep their Connect code and message.
func TestFileRouteError(t *testing.T) {
	for _, tc := range []struct {
		name     string
		status   int
		body     string
		wantNo   bool
		wantCode connect.Code
		wantMsg  string
	}{
		{"old daemon", http.StatusNotFound, "404 page not found\n", true, 0, ""},
		{"missing file", http.StatusNotFound, `{"code":"not_found","message":"read /x: no such file or directory"}`, false, connect.CodeNotFound, "read /x: no such file or directory"},
		{"disk full", http.StatusTooManyRequests, `{"code":"resource_exhausted","message":"write /x: no space left on device"}`, false, connect.CodeResourceExhausted, "no space left"},
		{"not JSON", http.StatusBadGateway, "bad gateway", false, connect.CodeUnknown, "502"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := &http.Response{StatusCode: tc.status, Status: strconv.Itoa(tc.status) + " " + http.StatusText(tc.status), Body: io.NopCloser(strings.NewReader(tc.body))}
			err := fileRouteError(resp)
			if got := errors.Is(err, errNoRawRoute); got != tc.wantNo {
				t.Fatalf("errNoRawRoute: got %v (%v), want %v", got, err, tc.wantNo)
			}
			if tc.wantNo {
				return
			}
			if got := connect.CodeOf(err); got != tc.wantCode || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("got %v %q, want %v containing %q", got, err, tc.wantCode, tc.wantMsg)
			}
		})
	}
}

// TestKnownSize: what an upload can size without reading it (and so send
// over the raw route), counting from the reader's current position.
func TestKnownSize(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, make([]byte, 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Seek(100, io.SeekStart)
	br := bytes.NewReader(make([]byte, 50))
	br.Read(make([]byte, 10))
	for _, tc := range []struct {
		name   string
		r      io.Reader
		want   int64
		wantOK bool
	}{
		{"file at 100", f, 900, true},
		{"bytes.Reader read 10", br, 40, true},
		{"strings.Reader", strings.NewReader("abc"), 3, true},
		{"bytes.Buffer", bytes.NewBufferString("abcd"), 4, true},
		{"a reader with Len", lenReader{7}, 7, true},
		{"a pipe", io.MultiReader(strings.NewReader("x")), 0, false},
	} {
		n, ok := knownSize(tc.r)
		if n != tc.want || ok != tc.wantOK {
			t.Errorf("%s: got %d, %v; want %d, %v", tc.name, n, ok, tc.want, tc.wantOK)
		}
	}
}

// lenReader says it has n bytes left, as a progress-counting wrapper does.
type lenReader struct{ n int }

func (lenReader) Read([]byte) (int, error) { return 0, io.EOF }
func (r lenReader) Len() int               { return r.n }
