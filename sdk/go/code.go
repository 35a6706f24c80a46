package sbx

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"strings"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// RunCodeOptions tune one RunCode call. The zero value runs the code once
// with no libraries, no timeout and no policy.
type RunCodeOptions struct {
	// Libraries are installed first with the language's installer.
	Libraries []string
	// LibrarySource overrides the installer's index (e.g. pip find-links).
	LibrarySource *sbxv1.LibrarySource
	Timeout       time.Duration
	Env           map[string]string
	// Policy is checked before running (see the "default" preset).
	Policy *sbxv1.CodePolicy
	// Stdout and Stderr receive output as it arrives (it is collected in the result too).
	Stdout, Stderr io.Writer
}

// CodeResult is a finished RunCode.
type CodeResult struct {
	Stdout, Stderr []byte
	ExitCode       int
	// Error says why the run failed (exception, compile error, timeout), if it did.
	Error     string
	TimedOut  bool
	Duration  time.Duration
	Installed []string
	Artifacts []*sbxv1.Artifact
	// Plots are the image artifacts again (figures shown or left open,
	// displayed images) in llm-sandbox's shape: base64 content and format.
	Plots []Plot
	// Value is the last expression's value (contexts only), or nil.
	Value    *sbxv1.CodeValue
	Findings []*sbxv1.PolicyFinding
}

// Plot is an image artifact as base64 plus its format ("png", "svg", "jpeg").
type Plot struct {
	Name          string
	Format        string
	ContentBase64 string
}

// Bytes is the image itself.
func (p Plot) Bytes() ([]byte, error) { return base64.StdEncoding.DecodeString(p.ContentBase64) }

// plotsOf returns the image artifacts (with content) as Plots, in order.
func plotsOf(arts []*sbxv1.Artifact) []Plot {
	var out []Plot
	for _, a := range arts {
		if strings.HasPrefix(a.GetMime(), "image/") && len(a.GetContent()) > 0 {
			out = append(out, Plot{Name: a.GetName(), Format: a.GetFormat(), ContentBase64: base64.StdEncoding.EncodeToString(a.GetContent())})
		}
	}
	return out
}

// RunCode runs code in language lang ("python", "javascript", "bash", ...)
// and returns its output, artifacts and exit code. A failing program is not
// an error; an unavailable language or a refusing policy is.
func (s *Sandbox) RunCode(ctx context.Context, lang, code string, opts RunCodeOptions) (*CodeResult, error) {
	return s.c.runCode(ctx, &sbxv1.RunCodeRequest{Sandbox: s.ID, Language: lang}, code, opts)
}

func (c *Client) runCode(ctx context.Context, req *sbxv1.RunCodeRequest, code string, opts RunCodeOptions) (*CodeResult, error) {
	req.Code, req.Libraries, req.LibrarySource = code, opts.Libraries, opts.LibrarySource
	req.TimeoutMs, req.Env, req.Policy = opts.Timeout.Milliseconds(), opts.Env, opts.Policy
	st, err := c.code.RunCode(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, wrap("run code", err)
	}
	defer st.Close()
	var stdout, stderr bytes.Buffer
	res := &CodeResult{}
	for st.Receive() {
		switch ev := st.Msg().GetEvent().(type) {
		case *sbxv1.RunCodeEvent_Stdout:
			stdout.Write(ev.Stdout)
			if opts.Stdout != nil {
				_, _ = opts.Stdout.Write(ev.Stdout)
			}
		case *sbxv1.RunCodeEvent_Stderr:
			stderr.Write(ev.Stderr)
			if opts.Stderr != nil {
				_, _ = opts.Stderr.Write(ev.Stderr)
			}
		case *sbxv1.RunCodeEvent_Result:
			r := ev.Result
			res.ExitCode, res.Error, res.TimedOut = int(r.GetExitCode()), r.GetError(), r.GetTimedOut()
			res.Duration = time.Duration(r.GetDurationMs()) * time.Millisecond
			res.Installed, res.Artifacts, res.Value, res.Findings = r.GetInstalled(), r.GetArtifacts(), r.GetValue(), r.GetFindings()
			res.Plots = plotsOf(res.Artifacts)
		}
	}
	if err := st.Err(); err != nil {
		return nil, wrap("run code", err)
	}
	res.Stdout, res.Stderr = stdout.Bytes(), stderr.Bytes()
	return res, nil
}

// CodeContext is a stateful kernel in a sandbox: variables, imports and the
// working directory survive between runs.
type CodeContext struct {
	c        *Client
	ID       string
	Sandbox  string
	Language string
	// Info is the context as the daemon listed or created it (nil for a
	// handle made by Client.Context).
	Info *sbxv1.CodeContext
}

// ContextOptions tune CreateContext.
type ContextOptions struct {
	Cwd string
	Env map[string]string
}

// CreateContext starts a kernel for lang ("python" or "javascript").
func (s *Sandbox) CreateContext(ctx context.Context, lang string, opts ContextOptions) (*CodeContext, error) {
	resp, err := s.c.code.CreateContext(ctx, connect.NewRequest(&sbxv1.CreateContextRequest{
		Sandbox: s.ID, Language: lang, Cwd: opts.Cwd, Env: opts.Env,
	}))
	if err != nil {
		return nil, wrap("create context", err)
	}
	return s.c.codeContext(resp.Msg.GetContext()), nil
}

func (c *Client) codeContext(cc *sbxv1.CodeContext) *CodeContext {
	return &CodeContext{c: c, ID: cc.GetId(), Sandbox: cc.GetSandbox(), Language: cc.GetLanguage(), Info: cc}
}

// Contexts lists the sandbox's live contexts.
func (s *Sandbox) Contexts(ctx context.Context) ([]*CodeContext, error) {
	return s.c.Contexts(ctx, s.ID)
}

// Contexts lists live contexts (of one sandbox if sandbox is not empty).
func (c *Client) Contexts(ctx context.Context, sandbox string) ([]*CodeContext, error) {
	resp, err := c.code.ListContexts(ctx, connect.NewRequest(&sbxv1.ListContextsRequest{Sandbox: sandbox}))
	if err != nil {
		return nil, wrap("list contexts", err)
	}
	var out []*CodeContext
	for _, cc := range resp.Msg.GetContexts() {
		out = append(out, c.codeContext(cc))
	}
	return out, nil
}

// Context returns a handle on an existing context by id.
func (c *Client) Context(id string) *CodeContext { return &CodeContext{c: c, ID: id} }

// Run runs code in the context.
func (cc *CodeContext) Run(ctx context.Context, code string, opts RunCodeOptions) (*CodeResult, error) {
	return cc.c.runCode(ctx, &sbxv1.RunCodeRequest{Context: cc.ID}, code, opts)
}

// Close stops the context's kernel.
func (cc *CodeContext) Close(ctx context.Context) error {
	_, err := cc.c.code.CloseContext(ctx, connect.NewRequest(&sbxv1.CloseContextRequest{Context: cc.ID}))
	return wrap("close context", err)
}

// WithClient binds a Sandbox handle made from an id to c.
func (s *Sandbox) WithClient(c *Client) *Sandbox { s.c = c; return s }
