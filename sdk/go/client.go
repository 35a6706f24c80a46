// Package sbx is the Go SDK for the sbx daemon: create, find, stop, resume
// and destroy sandboxes, run commands in them with streamed output, stdin and
// PTYs, and move files in and out. It imports only sbx's api module, connect
// and the standard library.
//
//	c := sbx.NewClient("")                      // SBX_ADDR or 127.0.0.1:7777
//	sb, err := c.Create(ctx, sbx.CreateOptions{Name: "demo"})
//	res, err := sb.Run(ctx, "python3", "-c", "print(6*7)")
//	fmt.Print(string(res.Stdout))
//	sb.Close(ctx) // destroys it: this handle created it (a found one's Close leaves the box running)
package sbx

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
)

// DefaultAddr is where the daemon listens unless told otherwise.
const DefaultAddr = "127.0.0.1:7777"

// Client talks to one sbx daemon. Safe for concurrent use.
type Client struct {
	api sbxv1connect.SandboxServiceClient
	// files is api for file transfers: with WithFileCompression, a client
	// that compresses its requests (and so gets compressed answers).
	files   sbxv1connect.SandboxServiceClient
	images  sbxv1connect.ImageServiceClient
	code    sbxv1connect.CodeServiceClient
	volumes sbxv1connect.VolumeServiceClient
	session sbxv1connect.SessionServiceClient
	// codebases: see codebase.go.
	codebases sbxv1connect.CodebaseServiceClient
	ports     sbxv1connect.PortServiceClient
	tenants   sbxv1connect.TenantServiceClient
	observe   sbxv1connect.ObserveServiceClient
	procs     sbxv1connect.ProcessServiceClient // processes.go
	baseURL   string
	token     string
	tls       *tls.Config // for https:// base URLs
	// execs are the idle connections of the exec upgrade (execconn.go).
	execs     execPool
	transport *http.Transport
	// filesTransport carries file transfers (files): HTTP/1.1, where a
	// stream's bytes go from the handler to the socket without HTTP/2's
	// framing and hand-over between goroutines on both sides.
	filesTransport *http.Transport
	// filesHTTP is the raw file route's client (rawfiles.go), over
	// filesTransport.
	filesHTTP     *http.Client
	compressFiles bool
	// noRawFiles: the daemon has no raw file route.
	noRawFiles atomic.Bool
}

// Option configures a Client.
type Option func(*clientOptions)

type clientOptions struct {
	token         string
	tokenSet      bool
	noExecUpgrade bool
	tls           *tls.Config
	compressFiles bool
}

// WithFileCompression gzips file transfers (Upload, Download, the tar
// calls) in both directions. The daemon sends file data uncompressed
// unless a client asks for it this way: on loopback or a LAN gzip is
// several times slower than the link, so ask only over a slow link and for
// data that compresses (source trees, logs), never for binaries or
// archives.
func WithFileCompression() Option {
	return func(o *clientOptions) { o.compressFiles = true }
}

// WithTLS sets the TLS configuration for an https:// daemon address (for
// example RootCAs holding a private CA). Without it the client trusts the
// system's roots plus, if $SBX_CACERT names a PEM file, the CAs in it.
func WithTLS(cfg *tls.Config) Option {
	return func(o *clientOptions) { o.tls = cfg.Clone() }
}

// envTLS is the TLS configuration $SBX_CACERT asks for (nil: the system's
// roots). A file that cannot be read or holds no certificate leaves an
// empty pool: every https connection then fails verification rather than
// trusting less than the user asked for.
func envTLS() *tls.Config {
	path := os.Getenv("SBX_CACERT")
	if path == "" {
		return nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	pem, err := os.ReadFile(path)
	if err != nil || !pool.AppendCertsFromPEM(pem) {
		pool = x509.NewCertPool()
	}
	return &tls.Config{RootCAs: pool}
}

// WithToken sets the daemon's API token (sent as Authorization: Bearer).
// Without it the client uses $SBX_TOKEN, if set.
func WithToken(token string) Option {
	return func(o *clientOptions) { o.token, o.tokenSet = token, true }
}

// bearerTransport adds the token to every request.
type bearerTransport struct {
	base  http.RoundTripper
	token string
}

func (t *bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.token)
	return t.base.RoundTrip(r)
}

// NewClient returns a client of the daemon at addr ("host:port" or an
// http:// URL). An empty addr means $SBX_ADDR, else DefaultAddr. The API
// token is WithToken's, else $SBX_TOKEN (none: no token is sent).
func NewClient(addr string, opts ...Option) *Client {
	var o clientOptions
	for _, opt := range opts {
		opt(&o)
	}
	if !o.tokenSet {
		o.token = os.Getenv("SBX_TOKEN")
	}
	if addr == "" {
		addr = os.Getenv("SBX_ADDR")
	}
	if addr == "" {
		addr = DefaultAddr
	}
	base := addr
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	if o.tls == nil {
		o.tls = envTLS()
	}
	if o.tls == nil {
		o.tls = &tls.Config{}
	}
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	protos.SetHTTP2(true) // https:// addresses: gRPC over TLS needs HTTP/2
	tr := &http.Transport{
		Protocols:           &protos,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		TLSClientConfig:     o.tls.Clone(),
		MaxIdleConnsPerHost: 8,
	}
	var rt http.RoundTripper = tr
	if o.token != "" {
		rt = &bearerTransport{base: tr, token: o.token}
	}
	hc := &http.Client{Transport: rt}
	c := &Client{
		ports:   sbxv1connect.NewPortServiceClient(hc, base, connect.WithGRPC()),
		token:   o.token,
		api:     sbxv1connect.NewSandboxServiceClient(hc, base, connect.WithGRPC()),
		images:  sbxv1connect.NewImageServiceClient(hc, base, connect.WithGRPC()),
		code:    sbxv1connect.NewCodeServiceClient(hc, base, connect.WithGRPC()),
		volumes: sbxv1connect.NewVolumeServiceClient(hc, base, connect.WithGRPC()),
		session: sbxv1connect.NewSessionServiceClient(hc, base, connect.WithGRPC()),
		baseURL: base,
		tls:     o.tls,

		codebases: sbxv1connect.NewCodebaseServiceClient(hc, base, connect.WithGRPC()),
		tenants:   sbxv1connect.NewTenantServiceClient(hc, base, connect.WithGRPC()),
		observe:   sbxv1connect.NewObserveServiceClient(hc, base, connect.WithGRPC()),
		procs:     sbxv1connect.NewProcessServiceClient(hc, base, connect.WithGRPC()),
		transport: tr,
	}
	// File transfers: the Connect protocol over HTTP/1.1 connections of
	// their own (see filesTransport).
	var p1 http.Protocols
	p1.SetHTTP1(true)
	ftr := &http.Transport{
		Protocols:           &p1,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		TLSClientConfig:     o.tls.Clone(),
		MaxIdleConnsPerHost: 8,
		WriteBufferSize:     256 << 10,
		ReadBufferSize:      256 << 10,
		DisableCompression:  true,
		// Raw uploads ask for 100-continue (rawfiles.go); the daemon
		// answers once the agent opened the file.
		ExpectContinueTimeout: 5 * time.Second,
	}
	var frt http.RoundTripper = ftr
	if o.token != "" {
		frt = &bearerTransport{base: ftr, token: o.token}
	}
	fhc := &http.Client{Transport: frt}
	c.filesTransport = ftr
	c.filesHTTP = fhc
	c.compressFiles = o.compressFiles
	c.files = sbxv1connect.NewSandboxServiceClient(fhc, base)
	if o.compressFiles {
		c.files = sbxv1connect.NewSandboxServiceClient(fhc, base, connect.WithSendGzip())
	}
	c.execs.disabled = o.noExecUpgrade
	return c
}

// Close closes the client's idle connections. The client still works
// afterwards (it opens new ones).
func (c *Client) Close() {
	c.execs.close()
	c.transport.CloseIdleConnections()
	c.filesTransport.CloseIdleConnections()
}

// API exposes the generated client for calls the SDK does not wrap.
func (c *Client) API() sbxv1connect.SandboxServiceClient { return c.api }

// Version returns the daemon's version and runtimes.
func (c *Client) Version(ctx context.Context) (*sbxv1.VersionResponse, error) {
	resp, err := c.api.Version(ctx, connect.NewRequest(&sbxv1.VersionRequest{}))
	if err != nil {
		return nil, wrap("version", err)
	}
	return resp.Msg, nil
}

// CreateOptions describe a new sandbox. Zero values take the daemon's defaults.
type CreateOptions struct {
	Image   string
	Name    string
	Labels  map[string]string
	Env     map[string]string
	Secrets map[string]string
	// Command is an optional long-running process started with the
	// sandbox (after the image's ENTRYPOINT, as docker run has it); with
	// none the image's ENTRYPOINT and CMD run. Read it with Logs and Wait.
	// A command that cannot start fails the create.
	Command []string
	// NoEntrypoint starts neither the image's ENTRYPOINT nor its CMD.
	NoEntrypoint bool
	Workdir      string
	// MemoryBytes, CPUs (fractions allowed), Pids, DiskBytes limit resources.
	MemoryBytes int64
	CPUs        float64
	Pids        int64
	DiskBytes   int64
	// Timeout is the sandbox's lifetime; IdleTimeout destroys (or, with
	// StopWhenIdle, stops) it after that long without activity.
	Timeout      time.Duration
	IdleTimeout  time.Duration
	StopWhenIdle bool
	Runtime      string
	// User runs commands as this user by default ("name", "uid", "uid:gid").
	User string
	// Network is the network policy (nil: public).
	Network *NetworkPolicy
	// Volumes are named volumes to mount.
	Volumes []VolumeMount
	// DomainSecrets are kept out of the sandbox: it sees a placeholder in
	// env Name, and the daemon's egress proxy puts Value in its place in
	// HTTPS requests to Domains only (see DomainSecret).
	DomainSecrets []DomainSecret
	// PathPolicies guard directories with permission rules.
	PathPolicies []PathPolicy
	// Codebases are codebases to mount, each in a copy-on-write layer.
	Codebases []CodebaseMount
	// ScopedToken gives the sandbox an API token of its own (env SBX_TOKEN,
	// with SBX_ADDR the daemon as the box reaches it): code inside may
	// create and manage child sandboxes, which die with it, and nothing
	// else. NewClient("") inside the box picks both up.
	ScopedToken bool
	// AutoResume starts the sandbox again when it is used (exec, files)
	// while stopped, by Stop or by idling with StopWhenIdle.
	AutoResume bool
}

// DomainSecret is a secret only the listed hosts receive, over HTTPS (a
// verified certificate) and only where the user says: the Headers named
// (Authorization when none is) and, with AllowQuery, the URL query. A host
// that echoes those headers back hands the value to the sandbox: list only
// hosts you trust with it. Over plain HTTP the proxy refuses a request that
// carries the placeholder to these hosts.
type DomainSecret struct {
	Name  string
	Value string
	// Domains are host names, "*.example.com" wildcards allowed (they
	// match names below example.com, not example.com itself).
	Domains []string
	// Headers the value goes in (e.g. "X-Api-Key"); empty: Authorization.
	Headers []string
	// AllowQuery also puts the value in the URL query string.
	AllowQuery bool
}

// Request converts the options to the API request.
func (o CreateOptions) Request() *sbxv1.CreateSandboxRequest {
	req := &sbxv1.CreateSandboxRequest{
		Image: o.Image, Name: o.Name, Labels: o.Labels, Env: o.Env, Secrets: o.Secrets,
		Command: o.Command, Workdir: o.Workdir, Runtime: o.Runtime, User: o.User, ScopedToken: o.ScopedToken,
		NoEntrypoint: o.NoEntrypoint, AutoResume: o.AutoResume,
		Resources: &sbxv1.Resources{
			MemoryBytes: o.MemoryBytes, CpuMillis: int64(o.CPUs * 1000), Pids: o.Pids, DiskBytes: o.DiskBytes,
		},
		TimeoutMs:     o.Timeout.Milliseconds(),
		IdleTimeoutMs: o.IdleTimeout.Milliseconds(),
	}
	if o.StopWhenIdle {
		req.IdleAction = sbxv1.IdleAction_IDLE_ACTION_STOP
	}
	if o.Network != nil {
		req.Network = o.Network.Proto()
	}
	for _, v := range o.Volumes {
		req.Volumes = append(req.Volumes, v.Proto())
	}
	for _, d := range o.DomainSecrets {
		req.DomainSecrets = append(req.DomainSecrets, &sbxv1.DomainSecret{Name: d.Name, Value: d.Value, Domains: d.Domains,
			Headers: d.Headers, AllowQuery: d.AllowQuery})
	}
	for _, p := range o.PathPolicies {
		req.PathPolicies = append(req.PathPolicies, p.Proto())
	}
	for _, cb := range o.Codebases {
		req.Codebases = append(req.Codebases, cb.Proto())
	}
	return req
}

// Create starts a sandbox and returns once it is ready for Exec.
func (c *Client) Create(ctx context.Context, opts CreateOptions) (*Sandbox, error) {
	return c.CreateFromRequest(ctx, opts.Request())
}

// CreateFromRequest is Create with a raw API request.
func (c *Client) CreateFromRequest(ctx context.Context, req *sbxv1.CreateSandboxRequest) (*Sandbox, error) {
	resp, err := c.api.CreateSandbox(ctx, connect.NewRequest(req))
	if err != nil {
		return nil, wrap("create sandbox", err)
	}
	sb := c.sandbox(resp.Msg.GetSandbox())
	sb.owned = true
	return sb, nil
}

// Sandbox returns a handle on the sandbox ref (id or name) without asking
// the daemon: calls on it fail if there is no such sandbox. Info is nil
// until Refresh.
func (c *Client) Sandbox(ref string) *Sandbox { return &Sandbox{c: c, ID: ref} }

// Get finds a sandbox by id or name.
//
// Info carries live stats, which the daemon measures for the call; to act
// on a sandbox by name (Exec, files...) use Sandbox(ref), which makes no
// call, or Lookup, which checks it exists without measuring it.
func (c *Client) Get(ctx context.Context, ref string) (*Sandbox, error) {
	resp, err := c.api.GetSandbox(ctx, connect.NewRequest(&sbxv1.GetSandboxRequest{Sandbox: ref}))
	if err != nil {
		return nil, wrap("get sandbox "+ref, err)
	}
	return c.sandbox(resp.Msg.GetSandbox()), nil
}

// Lookup is Get without live stats (Info.Stats is nil): a map lookup on
// the daemon, for callers that only resolve a name or check it exists.
func (c *Client) Lookup(ctx context.Context, ref string) (*Sandbox, error) {
	resp, err := c.api.GetSandbox(ctx, connect.NewRequest(&sbxv1.GetSandboxRequest{Sandbox: ref, NoStats: true}))
	if err != nil {
		return nil, wrap("get sandbox "+ref, err)
	}
	return c.sandbox(resp.Msg.GetSandbox()), nil
}

// List returns sandboxes matching all label selectors ("k=v", "k!=v", "k", "!k").
func (c *Client) List(ctx context.Context, selectors ...string) ([]*Sandbox, error) {
	resp, err := c.api.ListSandboxes(ctx, connect.NewRequest(&sbxv1.ListSandboxesRequest{Selectors: selectors}))
	if err != nil {
		return nil, wrap("list sandboxes", err)
	}
	out := make([]*Sandbox, 0, len(resp.Msg.GetSandboxes()))
	for _, s := range resp.Msg.GetSandboxes() {
		out = append(out, c.sandbox(s))
	}
	return out, nil
}

func (c *Client) sandbox(info *sbxv1.Sandbox) *Sandbox {
	return &Sandbox{c: c, ID: info.GetId(), Name: info.GetName(), Info: info}
}

// Error is an API error with its code.
type Error struct {
	Op    string
	Code  connect.Code
	Msg   string
	cause error
}

// Error is "op: message", or the message alone when the daemon's message
// already begins with op (the daemon named what failed the same way).
func (e *Error) Error() string {
	if e.Op == "" || e.Msg == e.Op || strings.HasPrefix(e.Msg, e.Op+": ") {
		return e.Msg
	}
	return fmt.Sprintf("%s: %s", e.Op, e.Msg)
}

// Unwrap returns the transport's error.
func (e *Error) Unwrap() error { return e.cause }

// Is makes errors.Is(err, context.DeadlineExceeded) and context.Canceled hold
// whichever side noticed first: the caller's context or the daemon.
func (e *Error) Is(target error) bool {
	switch target {
	case context.DeadlineExceeded:
		return e.Code == connect.CodeDeadlineExceeded
	case context.Canceled:
		return e.Code == connect.CodeCanceled
	}
	return false
}

// IsNotFound reports whether err says a sandbox, file or image does not exist.
func IsNotFound(err error) bool { return codeOf(err) == connect.CodeNotFound }

// IsAlreadyExists reports whether err says a name or file is taken.
func IsAlreadyExists(err error) bool { return codeOf(err) == connect.CodeAlreadyExists }

// IsInvalidArgument reports whether the request was malformed.
func IsInvalidArgument(err error) bool { return codeOf(err) == connect.CodeInvalidArgument }

// IsFailedPrecondition reports whether the request cannot be served in the
// current state or by the sandbox's runtime (e.g. a capability its runtime
// lacks: the message names the runtime and the capability).
func IsFailedPrecondition(err error) bool { return codeOf(err) == connect.CodeFailedPrecondition }

func codeOf(err error) connect.Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return connect.CodeOf(err)
}

func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if ce, ok := err.(*connect.Error); ok {
		return &Error{Op: op, Code: ce.Code(), Msg: ce.Message(), cause: err}
	}
	return &Error{Op: op, Code: connect.CodeOf(err), Msg: err.Error(), cause: err}
}
