package mcp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Limits bound what one tool call may send and get back. Output past a
// limit is read and dropped (the result says how much); input past one is
// refused with an error naming the field.
type Limits struct {
	// MaxInputBytes bounds a command, a program's code, stdin or a file's
	// content sent by the client.
	MaxInputBytes int
	// MaxOutputBytes bounds each of stdout and stderr, and a file read.
	MaxOutputBytes int
	// MaxImageBytes bounds the images one run_code returns, together.
	MaxImageBytes int
	// MaxEntries bounds list_files and list_sandboxes.
	MaxEntries int
	// DefaultTimeout and MaxTimeout bound exec and run_code.
	DefaultTimeout, MaxTimeout time.Duration
	// SandboxTimeout is the lifetime of a sandbox created without
	// timeout_seconds; MaxSandboxTimeout bounds the one asked for.
	SandboxTimeout, MaxSandboxTimeout time.Duration
}

// DefaultLimits are the limits of `sbx mcp` and the daemon's /mcp.
var DefaultLimits = Limits{
	MaxInputBytes:     4 << 20,
	MaxOutputBytes:    1 << 20,
	MaxImageBytes:     8 << 20,
	MaxEntries:        1000,
	DefaultTimeout:    60 * time.Second,
	MaxTimeout:        10 * time.Minute,
	SandboxTimeout:    time.Hour,
	MaxSandboxTimeout: 24 * time.Hour,
}

// rasterMIME are the artifact types returned as MCP image content.
var rasterMIME = map[string]bool{"image/png": true, "image/jpeg": true, "image/gif": true, "image/webp": true}

// LabelKey marks the sandboxes MCP tools create (value "1").
const LabelKey = "sbx-mcp"

type createIn struct {
	Image          string            `json:"image,omitempty" jsonschema:"image reference; default \"host\" (the host's /usr read-only, with python3)"`
	Name           string            `json:"name,omitempty" jsonschema:"optional unique name: [a-z0-9][a-z0-9_.-]{0,62}"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"environment variables of every command"`
	TimeoutSeconds int64             `json:"timeout_seconds,omitempty" jsonschema:"lifetime in seconds after which the sandbox is destroyed (default 3600)"`
}

type sandboxIn struct {
	Sandbox string `json:"sandbox" jsonschema:"sandbox id or name"`
}

type execIn struct {
	Sandbox        string            `json:"sandbox" jsonschema:"sandbox id or name"`
	Command        string            `json:"command" jsonschema:"shell command line, run with /bin/sh -c"`
	Workdir        string            `json:"workdir,omitempty" jsonschema:"working directory"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"extra environment variables"`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"text given to the command on stdin"`
	TimeoutSeconds int64             `json:"timeout_seconds,omitempty" jsonschema:"kill the command after this many seconds (default 60, at most 600)"`
}

type runCodeIn struct {
	Sandbox        string   `json:"sandbox" jsonschema:"sandbox id or name"`
	Code           string   `json:"code" jsonschema:"the program"`
	Language       string   `json:"language,omitempty" jsonschema:"python (default), javascript, bash, ..."`
	Context        string   `json:"context,omitempty" jsonschema:"id of a code context whose variables persist between runs"`
	Libraries      []string `json:"libraries,omitempty" jsonschema:"packages to install first"`
	TimeoutSeconds int64    `json:"timeout_seconds,omitempty" jsonschema:"stop the program after this many seconds (default 60, at most 600)"`
}

type pathIn struct {
	Sandbox string `json:"sandbox" jsonschema:"sandbox id or name"`
	Path    string `json:"path" jsonschema:"absolute path in the sandbox"`
}

type writeIn struct {
	Sandbox string `json:"sandbox" jsonschema:"sandbox id or name"`
	Path    string `json:"path" jsonschema:"absolute path in the sandbox (parent directories are created)"`
	Content string `json:"content" jsonschema:"the file's content"`
	Base64  bool   `json:"base64,omitempty" jsonschema:"content is base64 (for binary files)"`
}

type listIn struct {
	Sandbox   string `json:"sandbox" jsonschema:"sandbox id or name"`
	Path      string `json:"path" jsonschema:"directory in the sandbox"`
	Recursive bool   `json:"recursive,omitempty" jsonschema:"list subdirectories too (up to 10 levels)"`
}

type portIn struct {
	Sandbox string `json:"sandbox" jsonschema:"sandbox id or name"`
	Port    uint32 `json:"port" jsonschema:"TCP port a server in the sandbox listens on"`
}

// tools holds what every tool handler shares.
type tools struct {
	b   *Backend
	lim Limits
	// created is told the id of each sandbox create_sandbox makes (nil:
	// nobody tracks them).
	created func(id string)
}

// register adds the tools to s.
func (t *tools) register(s *mcp.Server) {
	mcp.AddTool(s, &mcp.Tool{Name: "create_sandbox", Description: "Create an isolated sandbox (a Linux container with its own filesystem) and return its id. " +
		"It is destroyed after timeout_seconds (default one hour) or by destroy_sandbox."}, t.create)
	mcp.AddTool(s, &mcp.Tool{Name: "list_sandboxes", Description: "List the sandboxes this token can see: id, name, image, state."}, t.list)
	mcp.AddTool(s, &mcp.Tool{Name: "destroy_sandbox", Description: "Destroy a sandbox and everything in it."}, t.destroy)
	mcp.AddTool(s, &mcp.Tool{Name: "exec", Description: "Run a shell command in a sandbox and return its exit code, stdout and stderr (each cut at 1 MiB)."}, t.exec)
	mcp.AddTool(s, &mcp.Tool{Name: "run_code", Description: "Run a program (python by default) in a sandbox. Returns stdout, stderr, the error if it failed, " +
		"every figure it showed (matplotlib, seaborn) as image content, and other artifacts (plotly HTML/JSON, SVG) as embedded resources."}, t.runCode)
	mcp.AddTool(s, &mcp.Tool{Name: "create_code_context", Description: "Start a stateful python or javascript interpreter in a sandbox; pass its id as run_code's context to keep variables between runs."}, t.createContext)
	mcp.AddTool(s, &mcp.Tool{Name: "read_file", Description: "Read a file from a sandbox (text, or base64 for binary content; at most 1 MiB)."}, t.readFile)
	mcp.AddTool(s, &mcp.Tool{Name: "write_file", Description: "Write a file in a sandbox, creating parent directories."}, t.writeFile)
	mcp.AddTool(s, &mcp.Tool{Name: "list_files", Description: "List a directory in a sandbox: path, type, size, mode."}, t.listFiles)
	mcp.AddTool(s, &mcp.Tool{Name: "expose_port", Description: "Return the URL (and headers) through which a server listening on a port in the sandbox is reached."}, t.exposePort)
}

// textResult is a tool result of one text block holding v as indented JSON.
func textResult(v any) *mcp.CallToolResult {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		b = []byte(fmt.Sprintf("encoding the result: %v", err))
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(b)}}}
}

// callErr makes an RPC error readable for the agent: its code and message.
func callErr(err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return fmt.Errorf("%s: %s", ce.Code(), ce.Message())
	}
	return err
}

func (t *tools) timeout(sec int64, what string) (time.Duration, error) {
	if sec < 0 {
		return 0, fmt.Errorf("%s: timeout_seconds is %d: want 0 (default) or more", what, sec)
	}
	if sec == 0 {
		return t.lim.DefaultTimeout, nil
	}
	d := time.Duration(sec) * time.Second
	if d > t.lim.MaxTimeout {
		return 0, fmt.Errorf("%s: timeout_seconds is %d: at most %d", what, sec, int64(t.lim.MaxTimeout/time.Second))
	}
	return d, nil
}

func (t *tools) checkSize(what, field string, n int) error {
	if n > t.lim.MaxInputBytes {
		return fmt.Errorf("%s: %s is %d bytes: at most %d", what, field, n, t.lim.MaxInputBytes)
	}
	return nil
}

func needSandbox(what, sb string) error {
	if sb == "" {
		return fmt.Errorf("%s: sandbox is empty: give a sandbox id or name", what)
	}
	return nil
}

type sandboxOut struct {
	ID        string            `json:"id"`
	Name      string            `json:"name,omitempty"`
	Image     string            `json:"image"`
	State     string            `json:"state"`
	Labels    map[string]string `json:"labels,omitempty"`
	ExpiresAt string            `json:"expires_at,omitempty"`
}

func sandboxOf(s *sbxv1.Sandbox) sandboxOut {
	o := sandboxOut{ID: s.GetId(), Name: s.GetName(), Image: s.GetImage(), Labels: s.GetLabels(),
		State: strings.ToLower(strings.TrimPrefix(s.GetState().String(), "SANDBOX_STATE_"))}
	if ms := s.GetExpiresAtMs(); ms > 0 {
		o.ExpiresAt = time.UnixMilli(ms).UTC().Format(time.RFC3339)
	}
	return o
}

func (t *tools) create(ctx context.Context, _ *mcp.CallToolRequest, in createIn) (*mcp.CallToolResult, any, error) {
	if in.TimeoutSeconds < 0 {
		return nil, nil, fmt.Errorf("create_sandbox: timeout_seconds is %d: want 0 (default) or more", in.TimeoutSeconds)
	}
	life := t.lim.SandboxTimeout
	if in.TimeoutSeconds > 0 {
		life = time.Duration(in.TimeoutSeconds) * time.Second
		if life > t.lim.MaxSandboxTimeout {
			return nil, nil, fmt.Errorf("create_sandbox: timeout_seconds is %d: at most %d", in.TimeoutSeconds, int64(t.lim.MaxSandboxTimeout/time.Second))
		}
	}
	resp, err := t.b.sandboxes.CreateSandbox(ctx, connect.NewRequest(&sbxv1.CreateSandboxRequest{
		Image: in.Image, Name: in.Name, Env: in.Env, TimeoutMs: life.Milliseconds(),
		Labels: map[string]string{LabelKey: "1"},
	}))
	if err != nil {
		return nil, nil, fmt.Errorf("create_sandbox: %w", callErr(err))
	}
	sb := resp.Msg.GetSandbox()
	if t.created != nil {
		t.created(sb.GetId())
	}
	return textResult(sandboxOf(sb)), nil, nil
}

func (t *tools) list(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
	resp, err := t.b.sandboxes.ListSandboxes(ctx, connect.NewRequest(&sbxv1.ListSandboxesRequest{}))
	if err != nil {
		return nil, nil, fmt.Errorf("list_sandboxes: %w", callErr(err))
	}
	out := struct {
		Sandboxes []sandboxOut `json:"sandboxes"`
		Omitted   int          `json:"omitted,omitempty"`
	}{Sandboxes: []sandboxOut{}}
	for i, s := range resp.Msg.GetSandboxes() {
		if i >= t.lim.MaxEntries {
			out.Omitted = len(resp.Msg.GetSandboxes()) - i
			break
		}
		out.Sandboxes = append(out.Sandboxes, sandboxOf(s))
	}
	return textResult(out), nil, nil
}

func (t *tools) destroy(ctx context.Context, _ *mcp.CallToolRequest, in sandboxIn) (*mcp.CallToolResult, any, error) {
	if err := needSandbox("destroy_sandbox", in.Sandbox); err != nil {
		return nil, nil, err
	}
	if _, err := t.b.sandboxes.DestroySandbox(ctx, connect.NewRequest(&sbxv1.DestroySandboxRequest{Sandbox: in.Sandbox})); err != nil {
		return nil, nil, fmt.Errorf("destroy_sandbox: %w", callErr(err))
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "destroyed " + in.Sandbox}}}, nil, nil
}

func (t *tools) exec(ctx context.Context, _ *mcp.CallToolRequest, in execIn) (*mcp.CallToolResult, any, error) {
	if err := needSandbox("exec", in.Sandbox); err != nil {
		return nil, nil, err
	}
	if in.Command == "" {
		return nil, nil, errors.New("exec: command is empty")
	}
	if err := t.checkSize("exec", "command", len(in.Command)); err != nil {
		return nil, nil, err
	}
	if err := t.checkSize("exec", "stdin", len(in.Stdin)); err != nil {
		return nil, nil, err
	}
	d, err := t.timeout(in.TimeoutSeconds, "exec")
	if err != nil {
		return nil, nil, err
	}
	// The daemon kills the command at the timeout; the call's own deadline
	// is a little later so that the exit status still arrives.
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	res, err := t.b.exec(ctx, &sbxv1.ExecRequest{
		Sandbox: in.Sandbox, Argv: []string{"/bin/sh", "-c", in.Command}, Env: in.Env, Workdir: in.Workdir,
		Stdin: []byte(in.Stdin), TimeoutMs: d.Milliseconds(),
	}, t.lim.MaxOutputBytes)
	if err != nil {
		return nil, nil, callErr(err)
	}
	return textResult(res), nil, nil
}

func (t *tools) runCode(ctx context.Context, _ *mcp.CallToolRequest, in runCodeIn) (*mcp.CallToolResult, any, error) {
	if err := needSandbox("run_code", in.Sandbox); err != nil {
		return nil, nil, err
	}
	if err := t.checkSize("run_code", "code", len(in.Code)); err != nil {
		return nil, nil, err
	}
	if len(in.Libraries) > 100 {
		return nil, nil, fmt.Errorf("run_code: %d libraries: at most 100", len(in.Libraries))
	}
	d, err := t.timeout(in.TimeoutSeconds, "run_code")
	if err != nil {
		return nil, nil, err
	}
	lang := in.Language
	if lang == "" && in.Context == "" {
		lang = "python"
	}
	ctx, cancel := context.WithTimeout(ctx, d+30*time.Second)
	defer cancel()
	res, arts, value, err := t.b.runCode(ctx, &sbxv1.RunCodeRequest{
		Sandbox: in.Sandbox, Language: lang, Code: in.Code, Context: in.Context, Libraries: in.Libraries, TimeoutMs: d.Milliseconds(),
	}, t.lim.MaxOutputBytes)
	if err != nil {
		return nil, nil, callErr(err)
	}
	out := textResult(res)
	// Raster images go back as image content; every other artifact (SVG,
	// plotly HTML and JSON, ...) as an embedded resource; together at most
	// MaxImageBytes.
	budget := t.lim.MaxImageBytes
	fits := func(name string, n int) bool {
		if n > budget {
			out.Content = append(out.Content, &mcp.TextContent{Text: fmt.Sprintf("artifact %q (%d bytes) was left out: over the %d-byte limit of artifacts per call", name, n, t.lim.MaxImageBytes)})
			return false
		}
		budget -= n
		return true
	}
	for _, a := range arts {
		data, mime := a.GetContent(), a.GetMime()
		if len(data) == 0 || !fits(a.GetName(), len(data)) {
			continue
		}
		switch {
		case rasterMIME[mime]:
			out.Content = append(out.Content, &mcp.ImageContent{Data: data, MIMEType: mime})
		default:
			rc := &mcp.ResourceContents{URI: "sbx://" + in.Sandbox + "/artifacts/" + url.PathEscape(a.GetName()), MIMEType: mime}
			if utf8.Valid(data) {
				rc.Text = string(data)
			} else {
				rc.Blob = data
			}
			out.Content = append(out.Content, &mcp.EmbeddedResource{Resource: rc})
		}
	}
	if png := value.GetPng(); len(png) > 0 && fits("value", len(png)) {
		out.Content = append(out.Content, &mcp.ImageContent{Data: png, MIMEType: "image/png"})
	}
	if res.Error != "" || res.ExitCode != 0 || res.TimedOut {
		out.IsError = true
	}
	return out, nil, nil
}

func (t *tools) createContext(ctx context.Context, _ *mcp.CallToolRequest, in struct {
	Sandbox  string `json:"sandbox" jsonschema:"sandbox id or name"`
	Language string `json:"language,omitempty" jsonschema:"python (default) or javascript"`
}) (*mcp.CallToolResult, any, error) {
	if err := needSandbox("create_code_context", in.Sandbox); err != nil {
		return nil, nil, err
	}
	lang := in.Language
	if lang == "" {
		lang = "python"
	}
	resp, err := t.b.code.CreateContext(ctx, connect.NewRequest(&sbxv1.CreateContextRequest{Sandbox: in.Sandbox, Language: lang}))
	if err != nil {
		return nil, nil, fmt.Errorf("create_code_context: %w", callErr(err))
	}
	c := resp.Msg.GetContext()
	return textResult(map[string]string{"context": c.GetId(), "language": c.GetLanguage()}), nil, nil
}

func (t *tools) readFile(ctx context.Context, _ *mcp.CallToolRequest, in pathIn) (*mcp.CallToolResult, any, error) {
	if err := needSandbox("read_file", in.Sandbox); err != nil {
		return nil, nil, err
	}
	data, more, err := t.b.readFile(ctx, in.Sandbox, in.Path, t.lim.MaxOutputBytes)
	if err != nil {
		return nil, nil, callErr(err)
	}
	res := &mcp.CallToolResult{}
	if utf8.Valid(data) {
		res.Content = append(res.Content, &mcp.TextContent{Text: string(data)})
	} else {
		res.Content = append(res.Content, &mcp.TextContent{Text: "base64:" + base64.StdEncoding.EncodeToString(data)})
	}
	if more {
		res.Content = append(res.Content, &mcp.TextContent{Text: fmt.Sprintf("[the file is longer: only its first %d bytes are shown]", t.lim.MaxOutputBytes)})
	}
	return res, nil, nil
}

func (t *tools) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in writeIn) (*mcp.CallToolResult, any, error) {
	if err := needSandbox("write_file", in.Sandbox); err != nil {
		return nil, nil, err
	}
	if err := t.checkSize("write_file", "content", len(in.Content)); err != nil {
		return nil, nil, err
	}
	data := []byte(in.Content)
	if in.Base64 {
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, nil, fmt.Errorf("write_file: content is not valid base64: %w", err)
		}
	}
	n, err := t.b.writeFile(ctx, in.Sandbox, in.Path, data, 0o644)
	if err != nil {
		return nil, nil, callErr(err)
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf("wrote %d bytes to %s", n, in.Path)}}}, nil, nil
}

type fileOut struct {
	Path   string `json:"path"`
	Type   string `json:"type"`
	Size   int64  `json:"size"`
	Mode   string `json:"mode"`
	Target string `json:"symlink_target,omitempty"`
}

func (t *tools) listFiles(ctx context.Context, _ *mcp.CallToolRequest, in listIn) (*mcp.CallToolResult, any, error) {
	if err := needSandbox("list_files", in.Sandbox); err != nil {
		return nil, nil, err
	}
	req := &sbxv1.ListDirRequest{Sandbox: in.Sandbox, Path: in.Path, Recursive: in.Recursive}
	if in.Recursive {
		req.MaxDepth = 10
	}
	resp, err := t.b.sandboxes.ListDir(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, nil, fmt.Errorf("list_files: %w", callErr(err))
	}
	out := struct {
		Entries []fileOut `json:"entries"`
		Omitted int       `json:"omitted,omitempty"`
	}{Entries: []fileOut{}}
	for i, e := range resp.Msg.GetEntries() {
		if i >= t.lim.MaxEntries {
			out.Omitted = len(resp.Msg.GetEntries()) - i
			break
		}
		out.Entries = append(out.Entries, fileOut{Path: e.GetPath(), Size: e.GetSize(), Mode: fmt.Sprintf("%04o", e.GetMode()&0o7777),
			Type: strings.ToLower(strings.TrimPrefix(e.GetType().String(), "FILE_TYPE_")), Target: e.GetSymlinkTarget()})
	}
	return textResult(out), nil, nil
}

func (t *tools) exposePort(ctx context.Context, _ *mcp.CallToolRequest, in portIn) (*mcp.CallToolResult, any, error) {
	if err := needSandbox("expose_port", in.Sandbox); err != nil {
		return nil, nil, err
	}
	if in.Port == 0 || in.Port > 65535 {
		return nil, nil, fmt.Errorf("expose_port: port is %d: want 1-65535", in.Port)
	}
	resp, err := t.b.ports.GetPort(ctx, connect.NewRequest(&sbxv1.GetPortRequest{Sandbox: in.Sandbox, Port: in.Port}))
	if err != nil {
		return nil, nil, fmt.Errorf("expose_port: %w", callErr(err))
	}
	p := resp.Msg.GetPort()
	return textResult(map[string]any{"port": p.GetPort(), "url": p.GetUrl(), "host_url": p.GetHostUrl(),
		"websocket_url": p.GetWebsocketUrl(), "headers": p.GetHeaders()}), nil, nil
}
