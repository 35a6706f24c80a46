package mcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
)

// Backend is the daemon API the tools call: the generated Connect clients
// over one HTTP client. Every call carries the caller's own credentials, so
// the daemon's auth and tenancy rules apply to MCP exactly as to the SDKs.
type Backend struct {
	sandboxes sbxv1connect.SandboxServiceClient
	code      sbxv1connect.CodeServiceClient
	ports     sbxv1connect.PortServiceClient
}

// NewBackend returns a Backend for the daemon at baseURL ("http://host:port"
// or https) reached through hc, which must add the caller's token (see
// BearerTransport). It speaks the Connect protocol (unary and
// server-streaming over HTTP/1.1 or HTTP/2).
func NewBackend(hc *http.Client, baseURL string) *Backend {
	baseURL = strings.TrimSuffix(baseURL, "/")
	return &Backend{
		sandboxes: sbxv1connect.NewSandboxServiceClient(hc, baseURL),
		code:      sbxv1connect.NewCodeServiceClient(hc, baseURL),
		ports:     sbxv1connect.NewPortServiceClient(hc, baseURL),
	}
}

// BearerTransport adds "Authorization: Bearer Token" to every request (an
// empty Token adds nothing) and, when Host is set, sends that Host header.
type BearerTransport struct {
	Base  http.RoundTripper
	Token string
	Host  string
}

// RoundTrip implements http.RoundTripper.
func (t *BearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if t.Token != "" {
		r.Header.Set("Authorization", "Bearer "+t.Token)
	}
	if t.Host != "" {
		r.Host = t.Host
	}
	return t.Base.RoundTrip(r)
}

// capped collects up to max bytes and counts what it dropped.
type capped struct {
	buf     []byte
	max     int
	dropped int64
}

func (c *capped) add(p []byte) {
	room := c.max - len(c.buf)
	if room < 0 {
		room = 0
	}
	if len(p) > room {
		c.dropped += int64(len(p) - room)
		p = p[:room]
	}
	c.buf = append(c.buf, p...)
}

// execResult is a finished command as the exec tool reports it.
type execResult struct {
	ExitCode  int32  `json:"exit_code"`
	Signal    int32  `json:"signal,omitempty"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	OOMKilled bool   `json:"oom_killed,omitempty"`
	PidsLimit bool   `json:"pids_limit_hit,omitempty"`
	Error     string `json:"error,omitempty"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	// StdoutDropped and StderrDropped count output bytes past the limit
	// that were read and discarded.
	StdoutDropped int64 `json:"stdout_dropped_bytes,omitempty"`
	StderrDropped int64 `json:"stderr_dropped_bytes,omitempty"`
}

// exec runs req to its end, keeping at most maxOut bytes of each stream
// (the rest is read and counted, so the exit status is still reported).
func (b *Backend) exec(ctx context.Context, req *sbxv1.ExecRequest, maxOut int) (*execResult, error) {
	st, err := b.sandboxes.Exec(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	defer st.Close()
	stdout, stderr := &capped{max: maxOut}, &capped{max: maxOut}
	var exited *sbxv1.ExecExited
	for st.Receive() {
		switch ev := st.Msg().GetEvent().(type) {
		case *sbxv1.ExecOutput_Stdout:
			stdout.add(ev.Stdout)
		case *sbxv1.ExecOutput_Stderr:
			stderr.add(ev.Stderr)
		case *sbxv1.ExecOutput_Exited:
			exited = ev.Exited
		}
	}
	if err := st.Err(); err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	if exited == nil {
		return nil, errors.New("exec: the stream ended before the command did")
	}
	return &execResult{
		ExitCode: exited.GetExitCode(), Signal: exited.GetSignal(), TimedOut: exited.GetTimedOut(),
		OOMKilled: exited.GetOomKilled(), PidsLimit: exited.GetPidsLimitHit(), Error: exited.GetError(),
		Stdout: string(stdout.buf), Stderr: string(stderr.buf),
		StdoutDropped: stdout.dropped, StderrDropped: stderr.dropped,
	}, nil
}

// codeResult is a finished run_code without its images.
type codeResult struct {
	ExitCode      int32    `json:"exit_code"`
	Error         string   `json:"error,omitempty"`
	TimedOut      bool     `json:"timed_out,omitempty"`
	Stdout        string   `json:"stdout"`
	Stderr        string   `json:"stderr"`
	Value         string   `json:"value,omitempty"`
	Installed     []string `json:"installed,omitempty"`
	Artifacts     []string `json:"artifacts,omitempty"`
	Context       string   `json:"context,omitempty"`
	StdoutDropped int64    `json:"stdout_dropped_bytes,omitempty"`
	StderrDropped int64    `json:"stderr_dropped_bytes,omitempty"`
}

// runCode runs req to its end, like exec, and returns the artifacts too.
func (b *Backend) runCode(ctx context.Context, req *sbxv1.RunCodeRequest, maxOut int) (*codeResult, []*sbxv1.Artifact, *sbxv1.CodeValue, error) {
	st, err := b.code.RunCode(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, nil, nil, fmt.Errorf("run code: %w", err)
	}
	defer st.Close()
	stdout, stderr := &capped{max: maxOut}, &capped{max: maxOut}
	var res *sbxv1.RunCodeResult
	for st.Receive() {
		switch ev := st.Msg().GetEvent().(type) {
		case *sbxv1.RunCodeEvent_Stdout:
			stdout.add(ev.Stdout)
		case *sbxv1.RunCodeEvent_Stderr:
			stderr.add(ev.Stderr)
		case *sbxv1.RunCodeEvent_Result:
			res = ev.Result
		}
	}
	if err := st.Err(); err != nil {
		return nil, nil, nil, fmt.Errorf("run code: %w", err)
	}
	if res == nil {
		return nil, nil, nil, errors.New("run code: the stream ended before the code did")
	}
	out := &codeResult{
		ExitCode: res.GetExitCode(), Error: res.GetError(), TimedOut: res.GetTimedOut(),
		Stdout: string(stdout.buf), Stderr: string(stderr.buf), Value: res.GetValue().GetText(),
		Installed: res.GetInstalled(), Context: res.GetContext(),
		StdoutDropped: stdout.dropped, StderrDropped: stderr.dropped,
	}
	for _, a := range res.GetArtifacts() {
		out.Artifacts = append(out.Artifacts, a.GetName())
	}
	return out, res.GetArtifacts(), res.GetValue(), nil
}

// readFile returns up to max bytes of path and whether there was more.
func (b *Backend) readFile(ctx context.Context, sandbox, path string, max int) ([]byte, bool, error) {
	st, err := b.sandboxes.ReadFile(ctx, connect.NewRequest(&sbxv1.ReadFileRequest{Sandbox: sandbox, Path: path, Length: int64(max) + 1}))
	if err != nil {
		return nil, false, fmt.Errorf("read file: %w", err)
	}
	defer st.Close()
	var data []byte
	for st.Receive() {
		chunk := st.Msg().GetData()
		if len(data)+len(chunk) > max+1 {
			return nil, false, fmt.Errorf("read file: the daemon sent more than the %d bytes asked for", max+1)
		}
		data = append(data, chunk...)
	}
	if err := st.Err(); err != nil {
		return nil, false, fmt.Errorf("read file: %w", err)
	}
	if len(data) > max {
		return data[:max], true, nil
	}
	return data, false, nil
}

// writeFile writes data to path (creating parent directories).
func (b *Backend) writeFile(ctx context.Context, sandbox, path string, data []byte, mode uint32) (int64, error) {
	st := b.sandboxes.WriteFile(ctx)
	err := st.Send(&sbxv1.WriteFileRequest{Msg: &sbxv1.WriteFileRequest_Header{Header: &sbxv1.WriteFileHeader{
		Sandbox: sandbox, Path: path, Mode: mode, MakeParents: true}}})
	for len(data) > 0 && err == nil {
		n := min(len(data), 1<<20)
		err = st.Send(&sbxv1.WriteFileRequest{Msg: &sbxv1.WriteFileRequest_Data{Data: data[:n]}})
		data = data[n:]
	}
	if err != nil && !errors.Is(err, io.EOF) {
		_, _ = st.CloseAndReceive()
		return 0, fmt.Errorf("write file: %w", err)
	}
	// On io.EOF the daemon ended the call: CloseAndReceive has its error.
	resp, err := st.CloseAndReceive()
	if err != nil {
		return 0, fmt.Errorf("write file: %w", err)
	}
	return resp.Msg.GetBytesWritten(), nil
}
