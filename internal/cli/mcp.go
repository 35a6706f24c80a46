package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/sbxdev/sbx/internal/mcp"
	sbx "github.com/sbxdev/sbx/sdk/go"
)

func newMCP(a *app) *cobra.Command {
	var keep bool
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve sbx to an MCP client (agent) on stdin/stdout",
		Long: `Serve the Model Context Protocol on stdin/stdout: tools to create sandboxes, run
commands and code (figures come back as images), read, write and list files,
expose ports and destroy sandboxes. It talks to the daemon at --addr ($SBX_ADDR)
with $SBX_TOKEN, so it sees only what that token may. The sandboxes it created
are destroyed when the client disconnects, unless --keep.

Claude Desktop style configuration:
  {"mcpServers": {"sbx": {"command": "sbx", "args": ["mcp"],
    "env": {"SBX_ADDR": "127.0.0.1:7777", "SBX_TOKEN": "..."}}}}`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			b, err := a.mcpBackend()
			if err != nil {
				return err
			}
			s := mcp.NewSession(b, mcp.DefaultLimits)
			// A client that stops the server with a signal still gets its
			// sandboxes cleaned up.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			runErr := s.Run(ctx, &mcpsdk.IOTransport{Reader: readNopCloser{a.stdin}, Writer: writeNopCloser{a.stdout}})
			if !keep {
				// The client is gone (or ctx ended): clean up with a fresh deadline.
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				defer cancel()
				ids, err := s.Cleanup(ctx)
				if len(ids) > 0 {
					fmt.Fprintf(a.stderr, "sbx mcp: destroyed the session's sandboxes: %s\n", strings.Join(ids, " "))
				}
				if err != nil {
					fmt.Fprintf(a.stderr, "sbx mcp: destroying the session's sandboxes: %v\n", err)
				}
			}
			if runErr != nil && ctx.Err() == nil {
				return fmt.Errorf("serving mcp: %w", runErr)
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&keep, "keep", false, "keep the sandboxes the session created when it ends")
	return cmd
}

// mcpBackend is the daemon's API as --addr, $SBX_TOKEN and $SBX_CACERT say.
func (a *app) mcpBackend() (*mcp.Backend, error) {
	addr := a.addr
	if addr == "" {
		addr = os.Getenv("SBX_ADDR")
	}
	if addr == "" {
		addr = sbx.DefaultAddr
	}
	base := addr
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	tcfg := &tls.Config{}
	if path := os.Getenv("SBX_CACERT"); path != "" {
		pem, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("reading $SBX_CACERT: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("$SBX_CACERT %s holds no PEM certificate", path)
		}
		tcfg.RootCAs = pool
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetHTTP2(true)
	tr := &http.Transport{Protocols: &protos, TLSClientConfig: tcfg, MaxIdleConnsPerHost: 4}
	hc := &http.Client{Transport: &mcp.BearerTransport{Base: tr, Token: os.Getenv("SBX_TOKEN")}}
	return mcp.NewBackend(hc, base), nil
}

// The transport closes what it was given when the session ends; the CLI's
// stdin and stdout are not its to close.
type readNopCloser struct {
	r interface{ Read([]byte) (int, error) }
}

func (r readNopCloser) Read(p []byte) (int, error) { return r.r.Read(p) }
func (readNopCloser) Close() error                 { return nil }

type writeNopCloser struct {
	w interface{ Write([]byte) (int, error) }
}

func (w writeNopCloser) Write(p []byte) (int, error) { return w.w.Write(p) }
func (writeNopCloser) Close() error                  { return nil }
