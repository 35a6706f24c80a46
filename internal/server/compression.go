package server

import (
	"net/http"
	"strings"

	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
)

// Compression of bulk data. Every Connect and gRPC client offers gzip by
// default, and the API compresses messages from compressMinBytes up for
// clients that offer it. For the streams that carry bulk bytes (file
// contents, tars, image exports, process output) that is a loss on any link
// the daemon is normally used over: gzip of 100 MiB of a binary or of
// random bytes ran at 47 MiB/s, a fifth of the same stream uncompressed,
// and the daemon spends the CPU, not the sandbox. So these streams answer
// uncompressed unless the client asks for it by compressing its own request
// (the SDKs' file-compression option does), which is how gRPC and Connect
// already tie a response's encoding to the request's.
//
// dataStreams are the procedures whose responses carry bulk bytes.
var dataStreams = map[string]bool{
	sbxv1connect.SandboxServiceReadFileProcedure:          true,
	sbxv1connect.SandboxServiceDownloadTarProcedure:       true,
	sbxv1connect.SandboxServiceExecProcedure:              true,
	sbxv1connect.SandboxServiceExecInteractiveProcedure:   true,
	sbxv1connect.CodebaseServiceDownloadCodebaseProcedure: true,
	sbxv1connect.ImageServiceExportImageProcedure:         true,
	sbxv1connect.SessionServiceSessionExecProcedure:       true,
	sbxv1connect.CodeServiceRunCodeProcedure:              true,
	sbxv1connect.SandboxServiceLogsProcedure:              true,
	sbxv1connect.ProcessServiceConnectProcessProcedure:    true,
}

// The request headers that name a request's own encoding, and those that
// offer encodings for the response, for gRPC (and gRPC-Web), Connect
// streams and Connect unary calls.
var (
	requestEncodingHeaders = []string{"Grpc-Encoding", "Connect-Content-Encoding", "Content-Encoding"}
	acceptEncodingHeaders  = []string{"Grpc-Accept-Encoding", "Connect-Accept-Encoding", "Accept-Encoding"}
)

// uncompressedData serves h, but requests to a data stream whose own body
// is not compressed lose their offer of compressed responses: the handler
// then answers identity.
func uncompressedData(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if dataStreams[r.URL.Path] && !compressedRequest(r.Header) {
			r = r.Clone(r.Context())
			for _, k := range acceptEncodingHeaders {
				r.Header.Del(k)
			}
		}
		h.ServeHTTP(w, r)
	})
}

// compressedRequest reports whether a request says its body is compressed.
func compressedRequest(h http.Header) bool {
	for _, k := range requestEncodingHeaders {
		if v := strings.TrimSpace(h.Get(k)); v != "" && !strings.EqualFold(v, "identity") {
			return true
		}
	}
	return false
}
