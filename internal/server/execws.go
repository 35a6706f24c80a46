package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"connectrpc.com/connect"
	"github.com/coder/websocket"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	"github.com/sbxdev/sbx/internal/tenant"
)

// ExecWSPath is the dashboard's terminal: an interactive PTY exec over a
// WebSocket, since a browser can neither send the ExecInteractive RPC (a
// bidi stream over HTTP/2) nor set headers on a WebSocket. So the token
// comes in the first message, not in the URL (which logs and Referers
// keep): the client sends one JSON text message,
//
//	{"token": "...", "sandbox": "ID or name", "cols": 80, "rows": 24, "argv": [...]}
//
// (argv optional: the sandbox's bash, else sh), within execWSHelloTimeout;
// a wrong token closes the socket with 1008 before anything else happens.
// Then binary messages are the terminal's input one way and its output the
// other; text messages are control: {"resize": {"cols": C, "rows": R}} in,
// {"exited": {...ExecExited}} or {"error": "..."} out, then a close. The
// upgrade is refused unless the Origin header, when present, names the
// request's own Host (the dashboard's listener, dashboard.go): another
// origin's page (a sandbox's, another site's) cannot drive a terminal, even
// with a token it has no business with.
const ExecWSPath = "/ui/exec"

// execWSHelloTimeout bounds the wait for the first message.
const execWSHelloTimeout = 10 * time.Second

// execWSMaxMessage bounds one message from the client (keystrokes and
// pastes; an upload goes through WriteFile).
const execWSMaxMessage = 1 << 20

// defaultTerminalShell is what the terminal runs without argv.
const defaultTerminalShell = "if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi"

type execWSHello struct {
	Token   string   `json:"token"`
	Sandbox string   `json:"sandbox"`
	Cols    uint32   `json:"cols"`
	Rows    uint32   `json:"rows"`
	Argv    []string `json:"argv"`
}

type execWSControl struct {
	Resize *struct {
		Cols uint32 `json:"cols"`
		Rows uint32 `json:"rows"`
	} `json:"resize"`
}

// serveExecWS upgrades GET ExecWSPath and relays one interactive command.
func (f *Front) serveExecWS(w http.ResponseWriter, r *http.Request) {
	// Accept refuses (403) an Origin whose host:port is not r.Host's: the
	// dashboard's listener is the only origin whose pages may open a
	// terminal (never the API listener's, where sandboxes' pages are
	// served by path).
	opts := &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled}
	c, err := websocket.Accept(w, r, opts)
	if err != nil {
		return
	}
	defer c.CloseNow() //nolint:errcheck
	c.SetReadLimit(execWSMaxMessage)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(f.done, cancel)()

	hctx, hcancel := context.WithTimeout(ctx, execWSHelloTimeout)
	typ, data, err := c.Read(hctx)
	hcancel()
	if err != nil {
		return
	}
	var hello execWSHello
	if typ != websocket.MessageText || json.Unmarshal(data, &hello) != nil {
		c.Close(websocket.StatusPolicyViolation, "the first message must be the JSON hello with the token") //nolint:errcheck
		return
	}
	if !f.openAccess() {
		p, ok := f.authenticate(r, hello.Token)
		if !ok {
			c.Close(websocket.StatusPolicyViolation, "invalid API token") //nolint:errcheck
			return
		}
		ctx = tenant.WithPrincipal(ctx, p)
	}
	start := &sbxv1.ExecRequest{
		Sandbox:   hello.Sandbox,
		Argv:      hello.Argv,
		Tty:       true,
		StdinOpen: true,
		Env:       map[string]string{"TERM": "xterm-256color"},
		Size:      &sbxv1.TerminalSize{Cols: max(hello.Cols, 1), Rows: max(hello.Rows, 1)},
	}
	if len(start.Argv) == 0 {
		start.Shell = defaultTerminalShell
	}
	writeJSON := func(v any) error {
		b, _ := json.Marshal(v)
		return c.Write(ctx, websocket.MessageText, b)
	}
	// The same tenancy rule as the ExecInteractive RPC (the admin token
	// runs nothing in sandboxes; lookups go through the Principal).
	if err := admit(ctx, sbxv1connect.SandboxServiceExecInteractiveProcedure); err != nil {
		_ = writeJSON(map[string]string{"error": errorMessage(err)})
		c.Close(websocket.StatusPolicyViolation, "refused") //nolint:errcheck
		return
	}
	if err := validateExec(start); err != nil {
		_ = writeJSON(map[string]string{"error": errorMessage(err)})
		c.Close(websocket.StatusPolicyViolation, "bad exec request") //nolint:errcheck
		return
	}
	recv := func() (*sbxv1.ExecInput, error) {
		for {
			typ, data, err := c.Read(ctx)
			if err != nil {
				return nil, err
			}
			if typ == websocket.MessageBinary {
				return &sbxv1.ExecInput{Event: &sbxv1.ExecInput_Stdin{Stdin: data}}, nil
			}
			var ctl execWSControl
			if err := json.Unmarshal(data, &ctl); err != nil {
				return nil, fmt.Errorf("exec websocket: control message: %w", err)
			}
			if ctl.Resize != nil {
				return &sbxv1.ExecInput{Event: &sbxv1.ExecInput_Resize{Resize: &sbxv1.TerminalSize{
					Cols: max(ctl.Resize.Cols, 1), Rows: max(ctl.Resize.Rows, 1)}}}, nil
			}
		}
	}
	send := func(m *sbxv1.ExecOutput) error {
		switch ev := m.GetEvent().(type) {
		case *sbxv1.ExecOutput_Stdout:
			return c.Write(ctx, websocket.MessageBinary, ev.Stdout)
		case *sbxv1.ExecOutput_Stderr:
			return c.Write(ctx, websocket.MessageBinary, ev.Stderr)
		case *sbxv1.ExecOutput_Exited:
			return writeJSON(map[string]any{"exited": map[string]any{
				"exitCode": ev.Exited.GetExitCode(), "signal": ev.Exited.GetSignal(), "error": ev.Exited.GetError()}})
		}
		return nil
	}
	if err := relayExec(ctx, f.streams, start, recv, send, nil); err != nil {
		if ctx.Err() == nil {
			_ = writeJSON(map[string]string{"error": errorMessage(err)})
		}
		c.Close(websocket.StatusInternalError, "exec failed") //nolint:errcheck
		return
	}
	c.Close(websocket.StatusNormalClosure, "exited") //nolint:errcheck
}

// errorMessage is what a client is told of err.
func errorMessage(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}
