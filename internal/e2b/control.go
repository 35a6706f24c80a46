package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// templateLabel records the E2B template a sandbox was created from.
const templateLabel = "e2b.template"

// defaultTimeout is E2B's sandbox timeout when a create names none.
const defaultTimeout = 300 * time.Second

// stockTemplates are E2B's template ids that mean "the configured image".
var stockTemplates = map[string]bool{"": true, "base": true, "code-interpreter-v1": true, "code-interpreter": true, "desktop": true}

// IsAPIPath reports whether path is one of the control-plane paths served
// by ServeAPI.
func (h *Handler) IsAPIPath(path string) bool {
	for _, p := range []string{"/sandboxes", "/v2/sandboxes"} {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

// ServeAPI serves E2B's control plane as the holder of token.
func (h *Handler) ServeAPI(w http.ResponseWriter, r *http.Request, token string) {
	c := h.clientsFor(token)
	path := r.URL.Path
	v2 := strings.HasPrefix(path, "/v2/")
	path = strings.TrimPrefix(path, "/v2")
	rest, _ := strings.CutPrefix(path, "/sandboxes")
	rest = strings.TrimPrefix(rest, "/")
	id, action, _ := strings.Cut(rest, "/")
	switch {
	case id == "" && r.Method == http.MethodPost:
		h.create(w, r, c)
	case id == "" && r.Method == http.MethodGet:
		h.list(w, r, c, v2)
	case id != "" && action == "" && r.Method == http.MethodGet && !v2:
		h.get(w, r, c, id)
	case id != "" && action == "" && r.Method == http.MethodDelete && !v2:
		h.kill(w, r, c, id)
	case action == "timeout" && r.Method == http.MethodPost && !v2:
		h.setTimeout(w, r, c, id)
	case action == "pause" && r.Method == http.MethodPost && !v2:
		h.pause(w, r, c, id)
	case (action == "connect" || action == "resume") && r.Method == http.MethodPost:
		h.connect(w, r, c, id)
	case action == "metrics" && r.Method == http.MethodGet && !v2:
		h.metrics(w, r, c, id)
	default:
		writeError(w, http.StatusNotImplemented, fmt.Sprintf("%s %s is not part of sbx's E2B-compatible API (docs/E2B.md lists what is)", r.Method, r.URL.Path))
	}
}

// newSandbox is E2B's NewSandbox body (the fields sbx maps; others are
// refused when set, not ignored).
type newSandbox struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	AutoPause           *bool             `json:"autoPause"`
	AutoResume          *struct {
		Enabled bool `json:"enabled"`
	} `json:"autoResume"`
	Network      json.RawMessage   `json:"network"`
	VolumeMounts []json.RawMessage `json:"volumeMounts"`
	MCP          json.RawMessage   `json:"mcp"`
	IAM          json.RawMessage   `json:"iam"`
}

// sandboxJSON is E2B's Sandbox (create and connect responses).
type sandboxJSON struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// detailJSON is E2B's ListedSandbox / SandboxDetail.
type detailJSON struct {
	SandboxID           string            `json:"sandboxID"`
	TemplateID          string            `json:"templateID"`
	Alias               string            `json:"alias,omitempty"`
	ClientID            string            `json:"clientID"`
	StartedAt           string            `json:"startedAt"`
	EndAt               string            `json:"endAt"`
	State               string            `json:"state"`
	CPUCount            int64             `json:"cpuCount"`
	MemoryMB            int64             `json:"memoryMB"`
	DiskSizeMB          int64             `json:"diskSizeMB"`
	EnvdVersion         string            `json:"envdVersion"`
	Metadata            map[string]string `json:"metadata"`
	EnvdAccessToken     string            `json:"envdAccessToken,omitempty"`
	AllowInternetAccess *bool             `json:"allowInternetAccess,omitempty"`
	Domain              *string           `json:"domain"`
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request, c *clients) {
	var body newSandbox
	if !readJSON(w, r, &body) {
		return
	}
	switch {
	case body.AutoPause != nil && *body.AutoPause:
		writeError(w, http.StatusBadRequest, "autoPause (lifecycle.onTimeout \"pause\") is not supported by sbx: a sandbox is killed at its timeout")
		return
	case len(body.Network) > 0 && string(body.Network) != "null" && string(body.Network) != "{}":
		writeError(w, http.StatusBadRequest, "network (allowOut/denyOut rules) is not supported by sbx's E2B API; use allow_internet_access or sbx's own network policy")
		return
	case len(body.VolumeMounts) > 0:
		writeError(w, http.StatusBadRequest, "volumeMounts are not supported by sbx's E2B API; use sbx volumes")
		return
	case len(body.MCP) > 0 && string(body.MCP) != "null":
		writeError(w, http.StatusBadRequest, "mcp gateways are not supported by sbx's E2B API")
		return
	case len(body.IAM) > 0 && string(body.IAM) != "null" && string(body.IAM) != "{}":
		writeError(w, http.StatusBadRequest, "iam tokens are not supported by sbx's E2B API")
		return
	}
	timeout := defaultTimeout
	if body.Timeout != nil {
		if *body.Timeout <= 0 || *body.Timeout > 366*24*3600 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("timeout %d: want 1 to %d seconds", *body.Timeout, 366*24*3600))
			return
		}
		timeout = time.Duration(*body.Timeout) * time.Second
	}
	image := body.TemplateID
	if stockTemplates[image] {
		image = h.cfg.DefaultImage
	}
	labels := map[string]string{}
	for k, v := range body.Metadata {
		if k == templateLabel {
			writeError(w, http.StatusBadRequest, "metadata key "+templateLabel+" is reserved")
			return
		}
		labels[k] = v
	}
	if body.TemplateID != "" {
		labels[templateLabel] = body.TemplateID
	}
	req := &sbxv1.CreateSandboxRequest{Image: image, Labels: labels, Env: body.EnvVars, TimeoutMs: timeout.Milliseconds()}
	if body.AllowInternetAccess != nil && !*body.AllowInternetAccess {
		req.Network = &sbxv1.NetworkPolicy{Mode: sbxv1.NetworkMode_NETWORK_MODE_NONE}
	}
	if body.AutoResume != nil && body.AutoResume.Enabled {
		req.AutoResume = true
	}
	resp, err := c.sandboxes.CreateSandbox(r.Context(), connect.NewRequest(req))
	if err != nil {
		writeAPIError(w, fmt.Errorf("creating sandbox: %w", err))
		return
	}
	writeJSON(w, http.StatusCreated, sandboxOf(resp.Msg.GetSandbox(), h.envdToken(resp.Msg.GetSandbox().GetId(), c)))
}

// envdToken is sandbox id's envd access token for a caller with c's
// credentials: none when the daemon takes no tokens (nothing to send).
func (h *Handler) envdToken(id string, c *clients) string {
	if c.token == "" || h.cfg.EnvdToken == nil {
		return ""
	}
	return h.cfg.EnvdToken(id)
}

func sandboxOf(sb *sbxv1.Sandbox, token string) sandboxJSON {
	out := sandboxJSON{SandboxID: sb.GetId(), TemplateID: templateOf(sb), ClientID: "sbx", EnvdVersion: EnvdVersion}
	if token != "" {
		// The SDK sends envdAccessToken as X-Access-Token to envd and
		// trafficAccessToken to the code interpreter: the sandbox's own
		// envd token (Config.EnvdToken), which opens nothing else.
		out.EnvdAccessToken = token
		out.TrafficAccessToken = &token
	}
	return out
}

func templateOf(sb *sbxv1.Sandbox) string {
	if t := sb.GetLabels()[templateLabel]; t != "" {
		return t
	}
	if sb.GetImage() != "" {
		return sb.GetImage()
	}
	return "base"
}

func detailOf(sb *sbxv1.Sandbox, token string) detailJSON {
	meta := map[string]string{}
	for k, v := range sb.GetLabels() {
		if k != templateLabel {
			meta[k] = v
		}
	}
	state := "running"
	if sb.GetState() == sbxv1.SandboxState_SANDBOX_STATE_STOPPED {
		state = "paused"
	}
	res := sb.GetResources()
	cpus := (res.GetCpuMillis() + 999) / 1000
	allow := sb.GetNetwork().GetMode() != sbxv1.NetworkMode_NETWORK_MODE_NONE
	d := detailJSON{
		SandboxID: sb.GetId(), TemplateID: templateOf(sb), Alias: sb.GetName(), ClientID: "sbx",
		StartedAt: msTime(sb.GetCreatedAtMs()), EndAt: msTime(sb.GetExpiresAtMs()), State: state,
		CPUCount: cpus, MemoryMB: res.GetMemoryBytes() >> 20, DiskSizeMB: res.GetDiskBytes() >> 20,
		EnvdVersion: EnvdVersion, Metadata: meta, AllowInternetAccess: &allow, EnvdAccessToken: token,
	}
	return d
}

func msTime(ms int64) string {
	if ms <= 0 {
		return time.Time{}.UTC().Format(time.RFC3339Nano)
	}
	return time.UnixMilli(ms).UTC().Format(time.RFC3339Nano)
}

// live reports whether sb counts as an E2B sandbox (running or paused).
func live(sb *sbxv1.Sandbox) bool {
	switch sb.GetState() {
	case sbxv1.SandboxState_SANDBOX_STATE_CREATING, sbxv1.SandboxState_SANDBOX_STATE_RUNNING, sbxv1.SandboxState_SANDBOX_STATE_STOPPED:
		return true
	}
	return false
}

// maxListLimit bounds one page of GET /v2/sandboxes.
const maxListLimit = 1000

func (h *Handler) list(w http.ResponseWriter, r *http.Request, c *clients, v2 bool) {
	q := r.URL.Query()
	var selectors []string
	if m := q.Get("metadata"); m != "" {
		pairs, err := url.ParseQuery(m)
		if err != nil {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("metadata query %q: %v", m, err))
			return
		}
		for k, vs := range pairs {
			// The SDK encodes each key and value once more.
			key, err1 := url.QueryUnescape(k)
			if err1 != nil {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("metadata key %q: %v", k, err1))
				return
			}
			for _, v := range vs {
				val, err := url.QueryUnescape(v)
				if err != nil {
					writeError(w, http.StatusBadRequest, fmt.Sprintf("metadata value %q: %v", v, err))
					return
				}
				selectors = append(selectors, key+"="+val)
			}
		}
	}
	states := q["state"]
	for _, s := range states {
		if s != "running" && s != "paused" {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("state %q: want running or paused", s))
			return
		}
	}
	limit := maxListLimit
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxListLimit {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("limit %q: want 1 to %d", l, maxListLimit))
			return
		}
		limit = n
	}
	offset := 0
	if t := q.Get("nextToken"); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("nextToken %q is not one this API returned", t))
			return
		}
		offset = n
	}
	resp, err := c.sandboxes.ListSandboxes(r.Context(), connect.NewRequest(&sbxv1.ListSandboxesRequest{Selectors: selectors}))
	if err != nil {
		writeAPIError(w, fmt.Errorf("listing sandboxes: %w", err))
		return
	}
	var out []detailJSON
	for _, sb := range resp.Msg.GetSandboxes() {
		if !live(sb) {
			continue
		}
		d := detailOf(sb, "")
		if len(states) > 0 && !slices.Contains(states, d.State) {
			continue
		}
		if v2 || d.State == "running" { // v1 lists running sandboxes only
			out = append(out, d)
		}
	}
	slices.SortFunc(out, func(a, b detailJSON) int { return strings.Compare(a.StartedAt+a.SandboxID, b.StartedAt+b.SandboxID) })
	if offset > len(out) {
		offset = len(out)
	}
	out = out[offset:]
	if len(out) > limit {
		out = out[:limit]
		w.Header().Set("X-Next-Token", strconv.Itoa(offset+limit))
	}
	if out == nil {
		out = []detailJSON{}
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) getSandbox(r *http.Request, c *clients, id string) (*sbxv1.Sandbox, error) {
	resp, err := c.sandboxes.GetSandbox(r.Context(), connect.NewRequest(&sbxv1.GetSandboxRequest{Sandbox: id}))
	if err != nil {
		return nil, fmt.Errorf("getting sandbox %s: %w", id, err)
	}
	sb := resp.Msg.GetSandbox()
	if !live(sb) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("sandbox %s is %s", id, strings.ToLower(strings.TrimPrefix(sb.GetState().String(), "SANDBOX_STATE_"))))
	}
	return sb, nil
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request, c *clients, id string) {
	sb, err := h.getSandbox(r, c, id)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, detailOf(sb, h.envdToken(sb.GetId(), c)))
}

func (h *Handler) kill(w http.ResponseWriter, r *http.Request, c *clients, id string) {
	if _, err := c.sandboxes.DestroySandbox(r.Context(), connect.NewRequest(&sbxv1.DestroySandboxRequest{Sandbox: id})); err != nil {
		writeAPIError(w, fmt.Errorf("killing sandbox %s: %w", id, err))
		return
	}
	h.defaults.forget(id)
	w.WriteHeader(http.StatusNoContent)
}

// timeoutBody is E2B's timeout request (seconds from now).
type timeoutBody struct {
	Timeout *int64 `json:"timeout"`
}

func (b timeoutBody) duration(def time.Duration) (time.Duration, error) {
	if b.Timeout == nil {
		return def, nil
	}
	if *b.Timeout < 0 || *b.Timeout > 366*24*3600 {
		return 0, fmt.Errorf("timeout %d: want 0 to %d seconds", *b.Timeout, 366*24*3600)
	}
	return time.Duration(*b.Timeout) * time.Second, nil
}

func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request, c *clients, id string) {
	var body timeoutBody
	if !readJSON(w, r, &body) {
		return
	}
	if body.Timeout == nil {
		writeError(w, http.StatusBadRequest, "timeout: required (seconds from now)")
		return
	}
	d, err := body.duration(0)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := h.updateTimeout(r, c, id, d); err != nil {
		writeAPIError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// updateTimeout makes id expire d from now (sbx's UpdateSandbox counts a
// new timeout from the call, as E2B's setTimeout does).
func (h *Handler) updateTimeout(r *http.Request, c *clients, id string, d time.Duration) error {
	ms := d.Milliseconds()
	if ms == 0 {
		ms = 1 // E2B's 0 means "now"; sbx's 0 means "no timeout"
	}
	if _, err := c.sandboxes.UpdateSandbox(r.Context(), connect.NewRequest(&sbxv1.UpdateSandboxRequest{Sandbox: id, TimeoutMs: &ms})); err != nil {
		return fmt.Errorf("setting the timeout of sandbox %s: %w", id, err)
	}
	return nil
}

func (h *Handler) pause(w http.ResponseWriter, r *http.Request, c *clients, id string) {
	sb, err := h.getSandbox(r, c, id)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	if sb.GetState() == sbxv1.SandboxState_SANDBOX_STATE_STOPPED {
		writeError(w, http.StatusConflict, "sandbox "+id+" is already paused")
		return
	}
	if _, err := c.sandboxes.StopSandbox(r.Context(), connect.NewRequest(&sbxv1.StopSandboxRequest{Sandbox: id})); err != nil {
		writeAPIError(w, fmt.Errorf("pausing sandbox %s: %w", id, err))
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// connect resumes a paused sandbox (sbx: start a stopped one) and sets its
// timeout; E2B answers 201 when it resumed, 200 when it was running.
func (h *Handler) connect(w http.ResponseWriter, r *http.Request, c *clients, id string) {
	var body timeoutBody
	if !readJSON(w, r, &body) {
		return
	}
	d, err := body.duration(defaultTimeout)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	sb, err := h.getSandbox(r, c, id)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	status := http.StatusOK
	if sb.GetState() == sbxv1.SandboxState_SANDBOX_STATE_STOPPED {
		resp, err := c.sandboxes.StartSandbox(r.Context(), connect.NewRequest(&sbxv1.StartSandboxRequest{Sandbox: id}))
		if err != nil {
			writeAPIError(w, fmt.Errorf("resuming sandbox %s: %w", id, err))
			return
		}
		sb, status = resp.Msg.GetSandbox(), http.StatusCreated
	}
	if err := h.updateTimeout(r, c, id, d); err != nil {
		writeAPIError(w, err)
		return
	}
	writeJSON(w, status, sandboxOf(sb, h.envdToken(sb.GetId(), c)))
}

// metricJSON is E2B's SandboxMetric.
type metricJSON struct {
	Timestamp     string  `json:"timestamp"`
	TimestampUnix int64   `json:"timestampUnix"`
	CPUCount      int64   `json:"cpuCount"`
	CPUUsedPct    float64 `json:"cpuUsedPct"`
	MemUsed       int64   `json:"memUsed"`
	MemTotal      int64   `json:"memTotal"`
	MemCache      int64   `json:"memCache"`
	DiskUsed      int64   `json:"diskUsed"`
	DiskTotal     int64   `json:"diskTotal"`
}

func (h *Handler) metrics(w http.ResponseWriter, r *http.Request, c *clients, id string) {
	q := r.URL.Query()
	var start, end int64 = 0, 1<<62 - 1
	for name, dst := range map[string]*int64{"start": &start, "end": &end} {
		if v := q.Get(name); v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				writeError(w, http.StatusBadRequest, fmt.Sprintf("%s %q: want unix seconds", name, v))
				return
			}
			*dst = n
		}
	}
	resp, err := c.observe.Stats(r.Context(), connect.NewRequest(&sbxv1.StatsRequest{Sandboxes: []string{id}, History: true}))
	if err != nil {
		writeAPIError(w, fmt.Errorf("reading the metrics of sandbox %s: %w", id, err))
		return
	}
	out := []metricJSON{}
	for _, e := range resp.Msg.GetSandboxes() {
		cpus := max((e.GetCpuLimitMillis()+999)/1000, 1)
		samples := e.GetHistory()
		if len(samples) == 0 && e.GetCurrent() != nil {
			samples = []*sbxv1.StatsSample{e.GetCurrent()}
		}
		for _, s := range samples {
			sec := s.GetTimeMs() / 1000
			if sec < start || sec > end {
				continue
			}
			out = append(out, metricJSON{
				Timestamp: msTime(s.GetTimeMs()), TimestampUnix: sec, CPUCount: cpus,
				CPUUsedPct: float64(s.GetCpuMillis()) / float64(cpus*1000) * 100,
				MemUsed:    s.GetMemoryBytes(), MemTotal: e.GetMemoryLimitBytes(),
				DiskUsed: s.GetDiskUsedBytes(), DiskTotal: e.GetDiskLimitBytes(),
			})
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// readJSON decodes r's body (at most maxBodyBytes; an empty body is {}).
func readJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", maxBodyBytes))
			return false
		}
		writeError(w, http.StatusBadRequest, "reading the request body: "+err.Error())
		return false
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return true
	}
	if err := json.Unmarshal(b, v); err != nil {
		writeError(w, http.StatusBadRequest, "request body: "+err.Error())
		return false
	}
	return true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// errorJSON is E2B's Error.
type errorJSON struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorJSON{Code: status, Message: msg})
}

// WriteError writes an error in E2B's shape (for the front's refusals).
func (h *Handler) WriteError(w http.ResponseWriter, status int, msg string) {
	writeError(w, status, msg)
}

// httpStatus maps an sbx API error to E2B's HTTP status.
func httpStatus(err error) int {
	switch connect.CodeOf(err) {
	case connect.CodeNotFound:
		return http.StatusNotFound
	case connect.CodeInvalidArgument, connect.CodeOutOfRange:
		return http.StatusBadRequest
	case connect.CodeUnauthenticated:
		return http.StatusUnauthorized
	case connect.CodePermissionDenied:
		return http.StatusForbidden
	case connect.CodeAlreadyExists, connect.CodeFailedPrecondition, connect.CodeAborted:
		return http.StatusConflict
	case connect.CodeResourceExhausted:
		return http.StatusTooManyRequests
	case connect.CodeUnimplemented:
		return http.StatusNotImplemented
	case connect.CodeUnavailable:
		return http.StatusServiceUnavailable
	case connect.CodeDeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

func writeAPIError(w http.ResponseWriter, err error) {
	writeError(w, httpStatus(err), err.Error())
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
