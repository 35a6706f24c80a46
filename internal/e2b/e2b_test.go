package e2b

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/api/gen/e2b/process"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

func TestHTTPStatus(t *testing.T) {
	for _, tc := range []struct {
		code connect.Code
		want int
	}{
		{connect.CodeNotFound, 404}, {connect.CodeInvalidArgument, 400}, {connect.CodeUnauthenticated, 401},
		{connect.CodePermissionDenied, 403}, {connect.CodeFailedPrecondition, 409}, {connect.CodeResourceExhausted, 429},
		{connect.CodeUnimplemented, 501}, {connect.CodeInternal, 500},
	} {
		err := errors.Join(errors.New("doing x"), connect.NewError(tc.code, errors.New("boom")))
		if got := httpStatus(err); got != tc.want {
			t.Errorf("%v: got %d, want %d", tc.code, got, tc.want)
		}
	}
}

func TestIsAPIPath(t *testing.T) {
	h := New(Config{BaseURL: "http://127.0.0.1:1"})
	for p, want := range map[string]bool{
		"/sandboxes": true, "/v2/sandboxes": true, "/sandboxes/sb-1/timeout": true, "/v2/sandboxes/sb-1/connect": true,
		"/sandboxesx": false, "/templates": false, "/sbx.v1.SandboxService/CreateSandbox": false, "/": false,
	} {
		if got := h.IsAPIPath(p); got != want {
			t.Errorf("IsAPIPath(%q): got %v, want %v", p, got, want)
		}
	}
}

// TestUnsupportedIsRefused: calls outside the supported set, and create
// options sbx cannot honour, get an E2B error naming them (never a silent
// success).
func TestUnsupportedIsRefused(t *testing.T) {
	h := New(Config{BaseURL: "http://127.0.0.1:1"})
	for _, tc := range []struct {
		method, path, body string
		want               int
		mention            string
	}{
		{"POST", "/sandboxes/sb-1/fork", "", 501, "/sandboxes/sb-1/fork"},
		{"POST", "/v2/sandboxes", `{"templateID":"base","autoPause":true}`, 400, "autoPause"},
		{"POST", "/v2/sandboxes", `{"templateID":"base","network":{"allowOut":["1.1.1.1"]}}`, 400, "network"},
		{"POST", "/v2/sandboxes", `{"templateID":"base","volumeMounts":[{"name":"v","path":"/v"}]}`, 400, "volumeMounts"},
		{"POST", "/v2/sandboxes", `{"templateID":"base","timeout":-1}`, 400, "timeout -1"},
		{"POST", "/v2/sandboxes", `{"templateID":"base","metadata":{"e2b.template":"x"}}`, 400, "reserved"},
		{"POST", "/v2/sandboxes", `{"templateID":`, 400, "request body"},
		{"POST", "/v2/sandboxes", `{"templateID":"` + strings.Repeat("a", maxBodyBytes) + `"}`, 413, "over"},
		{"POST", "/sandboxes/sb-1/timeout", `{}`, 400, "timeout: required"},
		{"GET", "/v2/sandboxes?limit=0", "", 400, "limit"},
		{"GET", "/v2/sandboxes?state=dead", "", 400, "state"},
		{"GET", "/sandboxes/sb-1/metrics?start=yesterday", "", 400, "start"},
	} {
		r := httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body))
		w := httptest.NewRecorder()
		h.ServeAPI(w, r, "tok")
		var e errorJSON
		_ = json.Unmarshal(w.Body.Bytes(), &e)
		if w.Code != tc.want || e.Code != tc.want || !strings.Contains(e.Message, tc.mention) {
			t.Errorf("%s %s %.60s: got %d %+v, want %d mentioning %q", tc.method, tc.path, tc.body, w.Code, e, tc.want, tc.mention)
		}
	}
}

func TestLanguage(t *testing.T) {
	for in, want := range map[string]string{"": "python", "Python": "python", "js": "javascript", "typescript": "typescript", "bash": "bash"} {
		if got, err := language(in); err != nil || got != want {
			t.Errorf("language(%q): got %q, %v, want %q", in, got, err, want)
		}
	}
	if _, err := language("cobol"); err == nil || !strings.Contains(err.Error(), "cobol") {
		t.Errorf("language(cobol): got %v, want an error naming it", err)
	}
}

func TestEndOf(t *testing.T) {
	for _, tc := range []struct {
		x                *sbxv1.ExecExited
		code             int32
		exited           bool
		status, errorMsg string
	}{
		{&sbxv1.ExecExited{ExitCode: 0}, 0, true, "exit status 0", ""},
		{&sbxv1.ExecExited{ExitCode: 3}, 3, true, "exit status 3", ""},
		{&sbxv1.ExecExited{Signal: 9}, -1, false, "signal: 9", ""},
		{&sbxv1.ExecExited{ExitCode: 137, Signal: 9, OomKilled: true}, 137, false, "signal: 9", "killed: out of memory"},
		{&sbxv1.ExecExited{ExitCode: 124, TimedOut: true}, 124, true, "exit status 124", "timed out"},
	} {
		got := endOf(tc.x)
		if got.GetExitCode() != tc.code || got.GetExited() != tc.exited || got.GetStatus() != tc.status || got.GetError() != tc.errorMsg {
			t.Errorf("endOf(%v): got %v, want code %d exited %v status %q error %q", tc.x, got, tc.code, tc.exited, tc.status, tc.errorMsg)
		}
	}
}

func TestUserAndSelector(t *testing.T) {
	for hdr, want := range map[string]string{"Basic cm9vdDo=": "root", "Basic dXNlcjo=": "", "Bearer x": "", "Basic !!": ""} {
		if got := userOf(hdr); got != want {
			t.Errorf("userOf(%q): got %q, want %q", hdr, got, want)
		}
	}
	for _, tc := range []struct {
		sel  *process.ProcessSelector
		want string
		err  bool
	}{
		{&process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 42}}, "42", false},
		{&process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "web"}}, "web", false},
		{&process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: ""}}, "", true},
		{nil, "", true},
	} {
		got, err := selector(tc.sel)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("selector(%v): got %q, %v, want %q (error %v)", tc.sel, got, err, tc.want, tc.err)
		}
	}
}

// TestWriteResult: a run's figures become display results, its value the
// main result and its error E2B's {name, value}, in that order.
func TestWriteResult(t *testing.T) {
	var lines []map[string]any
	writeResult(func(m map[string]any) { lines = append(lines, m) }, &sbxv1.RunCodeResult{
		Artifacts: []*sbxv1.Artifact{{Name: "figure-1.png", Format: "png", Content: []byte("\x89PNG")}},
		Value:     &sbxv1.CodeValue{Text: "42"},
		Error:     "NameError: name 'x' is not defined",
	})
	if len(lines) != 3 {
		t.Fatalf("got %d lines %v, want 3", len(lines), lines)
	}
	if lines[0]["type"] != "result" || lines[0]["png"] != "iVBORw==" || lines[0]["is_main_result"] != false {
		t.Errorf("got figure %v, want a png display result", lines[0])
	}
	if lines[1]["text"] != "42" || lines[1]["is_main_result"] != true {
		t.Errorf("got value %v, want the main result 42", lines[1])
	}
	if lines[2]["type"] != "error" || lines[2]["name"] != "NameError" || lines[2]["value"] != "name 'x' is not defined" {
		t.Errorf("got error %v, want NameError", lines[2])
	}
}

// TestDetailState: a stopped sbx sandbox is a paused E2B one; metadata
// hides the template label.
func TestDetailState(t *testing.T) {
	d := detailOf(&sbxv1.Sandbox{Id: "sb-1", State: sbxv1.SandboxState_SANDBOX_STATE_STOPPED,
		Labels: map[string]string{templateLabel: "code-interpreter-v1", "k": "v"}}, "")
	if d.State != "paused" || d.TemplateID != "code-interpreter-v1" || len(d.Metadata) != 1 || d.Metadata["k"] != "v" {
		t.Errorf("got %+v, want paused code-interpreter-v1 with metadata k=v only", d)
	}
	w := httptest.NewRecorder()
	writeError(w, http.StatusNotFound, "sandbox sb-1 not found")
	if want := `{"code":404,"message":"sandbox sb-1 not found"}` + "\n"; w.Body.String() != want {
		t.Errorf("got error body %q, want %q", w.Body.String(), want)
	}
}

func TestWatchCounter(t *testing.T) {
	var c watchCounter
	var releases []func()
	for i := 0; i < maxWatches; i++ {
		rel, err := c.acquire("sb-1\x00tok")
		if err != nil {
			t.Fatalf("watch %d: %v", i, err)
		}
		releases = append(releases, rel)
	}
	if _, err := c.acquire("sb-1\x00tok"); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("watch %d: got %v, want ResourceExhausted", maxWatches+1, err)
	}
	if rel, err := c.acquire("sb-2\x00tok"); err != nil {
		t.Errorf("another sandbox's watch: %v", err)
	} else {
		rel()
	}
	releases[0]()
	if _, err := c.acquire("sb-1\x00tok"); err != nil {
		t.Errorf("after a release: %v", err)
	}
}

// TestUploadRefusals: uploads envd's /files cannot take are refused before
// any byte reaches the sandbox.
func TestUploadRefusals(t *testing.T) {
	h := New(Config{BaseURL: "http://127.0.0.1:1"})
	for _, tc := range []struct {
		name, query, ctype, enc string
		want                    int
		mention                 string
	}{
		{"gzip", "?path=/a", "application/octet-stream", "gzip", 415, "gzip"},
		{"content type", "?path=/a", "text/plain", "", 415, "text/plain"},
		{"no path", "", "application/octet-stream", "", 400, "path"},
		{"no file part", "", "multipart/form-data; boundary=X", "", 400, "no file"},
	} {
		body := ""
		if strings.HasPrefix(tc.ctype, "multipart/") {
			body = "--X\r\nContent-Disposition: form-data; name=\"other\"\r\n\r\nv\r\n--X--\r\n"
		}
		r := httptest.NewRequest("POST", "/files"+tc.query, strings.NewReader(body))
		r.Header.Set("Content-Type", tc.ctype)
		if tc.enc != "" {
			r.Header.Set("Content-Encoding", tc.enc)
		}
		w := httptest.NewRecorder()
		h.ServeSandbox(w, r, "tok", "sb-1", EnvdPort)
		if w.Code != tc.want || !strings.Contains(w.Body.String(), tc.mention) {
			t.Errorf("%s: got %d %s, want %d mentioning %q", tc.name, w.Code, w.Body.String(), tc.want, tc.mention)
		}
	}
}
