package e2b

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// The code interpreter (@e2b/code-interpreter): POST /execute streams
// NDJSON lines (stdout, stderr, result, error, end_of_execution) from
// sbx's RunCode; /contexts maps onto sbx's code contexts.

// executeBody is /execute's request.
type executeBody struct {
	Code      string            `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// contextBody is POST /contexts's request.
type contextBody struct {
	Language string `json:"language"`
	CWD      string `json:"cwd"`
}

// contextJSON is the interpreter's Context.
type contextJSON struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	CWD      string `json:"cwd"`
}

// language maps E2B's language names to sbx's ("" is python).
func language(l string) (string, error) {
	switch strings.ToLower(l) {
	case "", "python", "python3":
		return "python", nil
	case "js", "javascript", "node", "nodejs":
		return "javascript", nil
	case "ts", "typescript":
		return "typescript", nil
	case "bash", "sh", "shell":
		return "bash", nil
	}
	return "", fmt.Errorf("language %q: want python, javascript, typescript or bash", l)
}

func (h *Handler) serveInterpreter(w http.ResponseWriter, r *http.Request) {
	cl := callOf(r.Context())
	p := r.URL.Path
	switch {
	case p == "/health" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	case p == "/execute" && r.Method == http.MethodPost:
		h.execute(w, r, cl)
	case p == "/contexts" && r.Method == http.MethodPost:
		var body contextBody
		if !readJSON(w, r, &body) {
			return
		}
		lang, err := language(body.Language)
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		resp, err := cl.c.code.CreateContext(r.Context(), connect.NewRequest(&sbxv1.CreateContextRequest{Sandbox: cl.sandbox, Language: lang, Cwd: body.CWD}))
		if err != nil {
			writeAPIError(w, fmt.Errorf("creating a context: %w", err))
			return
		}
		writeJSON(w, http.StatusOK, contextJSON{ID: resp.Msg.GetContext().GetId(), Language: lang, CWD: body.CWD})
	case p == "/contexts" && r.Method == http.MethodGet:
		resp, err := cl.c.code.ListContexts(r.Context(), connect.NewRequest(&sbxv1.ListContextsRequest{Sandbox: cl.sandbox}))
		if err != nil {
			writeAPIError(w, fmt.Errorf("listing contexts: %w", err))
			return
		}
		out := []contextJSON{}
		for _, c := range resp.Msg.GetContexts() {
			out = append(out, contextJSON{ID: c.GetId(), Language: c.GetLanguage()})
		}
		writeJSON(w, http.StatusOK, out)
	case strings.HasPrefix(p, "/contexts/") && r.Method == http.MethodDelete:
		id := strings.TrimPrefix(p, "/contexts/")
		if err := h.ownContext(r, cl, id); err != nil {
			writeAPIError(w, err)
			return
		}
		if _, err := cl.c.code.CloseContext(r.Context(), connect.NewRequest(&sbxv1.CloseContextRequest{Context: id})); err != nil {
			writeAPIError(w, fmt.Errorf("removing context %s: %w", id, err))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		writeError(w, http.StatusNotImplemented, fmt.Sprintf("code interpreter %s %s is not part of sbx's E2B-compatible API (docs/E2B.md lists what is)", r.Method, p))
	}
}

// ownContext checks that context id belongs to the routed sandbox (the
// request names the sandbox by header; sbx names contexts by id alone).
func (h *Handler) ownContext(r *http.Request, cl call, id string) error {
	resp, err := cl.c.code.ListContexts(r.Context(), connect.NewRequest(&sbxv1.ListContextsRequest{Sandbox: cl.sandbox}))
	if err != nil {
		return fmt.Errorf("finding context %s: %w", id, err)
	}
	for _, c := range resp.Msg.GetContexts() {
		if c.GetId() == id {
			return nil
		}
	}
	return connect.NewError(connect.CodeNotFound, fmt.Errorf("context %s not found in sandbox %s", id, cl.sandbox))
}

// ctxKey keys per-caller state of a sandbox: the sandbox as the caller
// named it and the caller's token, so two tenants never share an entry.
func ctxKey(cl call) string { return cl.sandbox + "\x00" + cl.c.token }

// maxDefaultContexts bounds the default contexts remembered (those of
// sandboxes that ended without a kill through this API stay until then).
const maxDefaultContexts = 10000

// defaultContexts are the contexts E2B's runCode without a context runs
// in: one per sandbox, caller and language, made on first use. They live
// in the daemon's memory only; after a restart a new one is made.
type defaultContexts struct {
	mu  sync.Mutex
	ids map[string]string // procKey + language -> context id
}

func (d *defaultContexts) get(ctx context.Context, cl call, lang string) (string, error) {
	key := ctxKey(cl) + "\x00" + lang
	d.mu.Lock()
	defer d.mu.Unlock()
	if id, ok := d.ids[key]; ok {
		return id, nil
	}
	resp, err := cl.c.code.CreateContext(ctx, connect.NewRequest(&sbxv1.CreateContextRequest{Sandbox: cl.sandbox, Language: lang}))
	if err != nil {
		return "", fmt.Errorf("creating the default %s context: %w", lang, err)
	}
	if d.ids == nil || len(d.ids) >= maxDefaultContexts {
		// Forgetting only costs the state of those sandboxes' default
		// contexts (their next run starts a fresh one); sbx reaps the
		// contexts themselves with their sandboxes.
		d.ids = map[string]string{}
	}
	d.ids[key] = resp.Msg.GetContext().GetId()
	return d.ids[key], nil
}

func (d *defaultContexts) drop(cl call, lang, id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if key := ctxKey(cl) + "\x00" + lang; d.ids[key] == id {
		delete(d.ids, key)
	}
}

// forget drops the default contexts of sandbox id (it was killed).
func (d *defaultContexts) forget(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k := range d.ids {
		if strings.HasPrefix(k, id+"\x00") {
			delete(d.ids, k)
		}
	}
}

// executeTimeout bounds one /execute (the SDK's own default is 5 minutes).
const executeTimeout = 10 * time.Minute

func (h *Handler) execute(w http.ResponseWriter, r *http.Request, cl call) {
	var body executeBody
	if !readJSON(w, r, &body) {
		return
	}
	if body.ContextID != "" && body.Language != "" {
		writeError(w, http.StatusBadRequest, "give context_id or language, not both")
		return
	}
	lang, err := language(body.Language)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	req := &sbxv1.RunCodeRequest{Sandbox: cl.sandbox, Code: body.Code, Env: body.EnvVars, TimeoutMs: executeTimeout.Milliseconds()}
	usedDefault := false
	if body.ContextID != "" {
		if err := h.ownContext(r, cl, body.ContextID); err != nil {
			writeAPIError(w, err)
			return
		}
		req.Context = body.ContextID
	} else {
		// E2B runs code without a context in the sandbox's default
		// context of its language: state carries over between runs.
		id, err := h.defaults.get(r.Context(), cl, lang)
		if err != nil {
			writeAPIError(w, err)
			return
		}
		req.Context, usedDefault = id, true
	}
	st, err := cl.c.code.RunCode(r.Context(), connect.NewRequest(req))
	more := err == nil && st.Receive()
	if err == nil && !more && st.Err() != nil {
		err = st.Err()
		st.Close()
	}
	if err != nil && usedDefault && connect.CodeOf(err) == connect.CodeNotFound {
		// The default context went away (closed, or the daemon
		// restarted and dropped it): start a fresh one, once.
		h.defaults.drop(cl, lang, req.Context)
		if req.Context, err = h.defaults.get(r.Context(), cl, lang); err == nil {
			st, err = cl.c.code.RunCode(r.Context(), connect.NewRequest(req))
			more = err == nil && st.Receive()
			if err == nil && !more && st.Err() != nil {
				err = st.Err()
				st.Close()
			}
		}
	}
	if err != nil {
		writeAPIError(w, fmt.Errorf("running code: %w", err))
		return
	}
	defer st.Close()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	line := func(v map[string]any) {
		_ = enc.Encode(v)
		_ = rc.Flush()
	}
	now := func() int64 { return time.Now().UnixMicro() }
	for ; more; more = st.Receive() {
		switch ev := st.Msg().GetEvent().(type) {
		case *sbxv1.RunCodeEvent_Stdout:
			line(map[string]any{"type": "stdout", "text": string(ev.Stdout), "timestamp": now()})
		case *sbxv1.RunCodeEvent_Stderr:
			line(map[string]any{"type": "stderr", "text": string(ev.Stderr), "timestamp": now()})
		case *sbxv1.RunCodeEvent_Result:
			writeResult(line, ev.Result)
		}
	}
	if err := st.Err(); err != nil {
		line(map[string]any{"type": "error", "name": "SbxError", "value": err.Error(), "traceback": ""})
	}
	line(map[string]any{"type": "end_of_execution"})
}

// writeResult writes a finished run: its figures (each a display result),
// the last expression's value (the main result) and its error.
func writeResult(line func(map[string]any), res *sbxv1.RunCodeResult) {
	for _, a := range res.GetArtifacts() {
		m := map[string]any{"type": "result", "is_main_result": false}
		switch a.GetFormat() {
		case "png", "jpeg":
			m[a.GetFormat()] = base64.StdEncoding.EncodeToString(a.GetContent())
		case "svg", "html":
			m[a.GetFormat()] = string(a.GetContent())
		case "json":
			var v any
			if json.Unmarshal(a.GetContent(), &v) == nil {
				m["json"] = v
			}
		default:
			m["extra"] = map[string]any{a.GetMime(): base64.StdEncoding.EncodeToString(a.GetContent())}
		}
		m["text"] = "<" + a.GetName() + ">"
		line(m)
	}
	if v := res.GetValue(); v != nil && (v.GetText() != "" || len(v.GetPng()) > 0 || v.GetHtml() != "") {
		m := map[string]any{"type": "result", "is_main_result": true, "text": v.GetText()}
		if len(v.GetPng()) > 0 {
			m["png"] = base64.StdEncoding.EncodeToString(v.GetPng())
		}
		if v.GetHtml() != "" {
			m["html"] = v.GetHtml()
		}
		line(m)
	}
	if e := res.GetError(); e != "" {
		name, value, ok := strings.Cut(e, ": ")
		if !ok || strings.ContainsAny(name, " \n") {
			name, value = "Error", e
		}
		line(map[string]any{"type": "error", "name": name, "value": value, "traceback": e})
	}
}
