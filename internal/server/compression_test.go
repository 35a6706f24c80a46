package server

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

// encodings records the encoding of each answer the front gave, by path.
type encodings struct {
	mu sync.Mutex
	// got is guarded by mu.
	got map[string]string
}

func (e *encodings) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		enc := ""
		for _, k := range []string{"Grpc-Encoding", "Connect-Content-Encoding", "Content-Encoding"} {
			enc += w.Header().Get(k)
		}
		e.mu.Lock()
		e.got[r.URL.Path] = enc
		e.mu.Unlock()
	})
}

func (e *encodings) of(path string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.got[path]
}

// TestFileDataUncompressedUnlessAsked checks that file data leaves the
// daemon uncompressed for clients that merely accept gzip (every Connect
// and gRPC client does), and gzipped for a client that asks by compressing
// its own request, in gRPC and in Connect's protocol, and through the SDK
// with and without WithFileCompression.
func TestFileDataUncompressedUnlessAsked(t *testing.T) {
	enc := &encodings{got: map[string]string{}}
	e := newExecEnv(t, enc.wrap)
	ctx := context.Background()
	_, sb := e.client(t)
	// Compressible and larger than compressMinBytes: the API would gzip it.
	data := []byte(strings.Repeat("all work and no play makes jack a dull boy\n", 8192))
	if err := sb.WriteFile(ctx, "/data.txt", data, 0); err != nil {
		t.Fatal(err)
	}
	url := e.srv.URL + sbxv1connect.SandboxServiceReadFileProcedure
	tests := []struct {
		name string
		opts []connect.ClientOption
		want string
	}{
		{"grpc, accepts gzip", []connect.ClientOption{connect.WithGRPC()}, ""},
		{"grpc, compresses its request", []connect.ClientOption{connect.WithGRPC(), connect.WithSendGzip()}, "gzip"},
		{"connect, accepts gzip", nil, ""},
		{"connect, compresses its request", []connect.ClientOption{connect.WithSendGzip()}, "gzip"},
		{"grpc-web, accepts gzip", []connect.ClientOption{connect.WithGRPCWeb()}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := connect.NewClient[sbxv1.ReadFileRequest, sbxv1.FileChunk](http.DefaultClient, url, tt.opts...)
			req := connect.NewRequest(&sbxv1.ReadFileRequest{Sandbox: e.sb, Path: "/data.txt"})
			req.Header().Set("Authorization", "Bearer "+execTestToken)
			st, err := c.CallServerStream(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			var got bytes.Buffer
			for st.Receive() {
				got.Write(st.Msg().GetData())
			}
			if err := st.Err(); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Bytes(), data) {
				t.Fatalf("read %d bytes, want the %d written", got.Len(), len(data))
			}
			if g := enc.of(sbxv1connect.SandboxServiceReadFileProcedure); g != tt.want {
				t.Errorf("answer's encoding = %q, want %q", g, tt.want)
			}
		})
	}
	for _, tt := range []struct {
		name string
		opts []sbx.Option
		want string
	}{
		{"sdk", nil, ""},
		{"sdk WithFileCompression", []sbx.Option{sbx.WithFileCompression()}, "gzip"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, sb := e.client(t, tt.opts...)
			if err := sb.WriteFile(ctx, "/again.txt", data, 0); err != nil {
				t.Fatal(err)
			}
			got, err := sb.ReadFile(ctx, "/again.txt")
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("read %d bytes, want the %d written", len(got), len(data))
			}
			if g := enc.of(sbxv1connect.SandboxServiceReadFileProcedure); g != tt.want {
				t.Errorf("ReadFile answer's encoding = %q, want %q", g, tt.want)
			}
		})
	}
}
