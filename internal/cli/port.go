package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/spf13/cobra"

	sbx "github.com/sbxdev/sbx/sdk/go"
)

func newPort(a *app) *cobra.Command {
	var verbose bool
	var lf listFlags
	cmd := &cobra.Command{
		Use:               "port SANDBOX [PORT]",
		ValidArgsFunction: a.completeSandboxes(1),
		Short:             "Print the URL of a sandbox port (or list the ports listening in it)",
		Long: `Print the URL at which the daemon proxies a port of a sandbox (HTTP and
WebSocket; with -v also the host-name URL, the routing headers and the raw TCP
endpoint). Without PORT, list the TCP ports listening inside the sandbox.
When the daemon has a token, requests to these URLs need it too
(Authorization: Bearer, or ?sbx_token=TOKEN once in a browser).`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			sb, err := a.client().Get(ctx, args[0])
			if err != nil {
				return err
			}
			var ports []sbx.Port
			if len(args) == 2 {
				n, err := strconv.ParseUint(args[1], 10, 16)
				if err != nil || n == 0 {
					return fmt.Errorf("bad port %q: want a number in 1-65535", args[1])
				}
				p, err := sb.Port(ctx, uint32(n))
				if err != nil {
					return err
				}
				ports = []sbx.Port{p}
			} else if ports, err = sb.Ports(ctx); err != nil {
				return err
			}
			switch {
			case lf.json && len(args) == 2:
				return writeJSON(a.stdout, ports[0])
			case lf.json:
				return writeJSON(a.stdout, ports)
			case lf.quiet:
				for _, p := range ports {
					fmt.Fprintln(a.stdout, p.Port)
				}
				return nil
			}
			for _, p := range ports {
				switch {
				case verbose:
					fmt.Fprintf(a.stdout, "port:      %d\n", p.Port)
					if p.BindAddress != "" {
						fmt.Fprintf(a.stdout, "bound:     %s\n", p.BindAddress)
					}
					fmt.Fprintf(a.stdout, "url:       %s\nwebsocket: %s\n", p.URL, p.WebSocketURL)
					if p.HostURL != "" {
						fmt.Fprintf(a.stdout, "host url:  %s\n", p.HostURL)
					}
					keys := make([]string, 0, len(p.Headers))
					for k := range p.Headers {
						keys = append(keys, k)
					}
					sort.Strings(keys)
					for _, k := range keys {
						fmt.Fprintf(a.stdout, "header:    %s: %s\n", k, p.Headers[k])
					}
					fmt.Fprintf(a.stdout, "tcp:       %s\n\n", p.TCPURL)
				case len(args) == 2:
					fmt.Fprintln(a.stdout, p.URL)
				default:
					fmt.Fprintf(a.stdout, "%d\t%s\t%s\n", p.Port, p.BindAddress, p.URL)
				}
			}
			return nil
		},
	}
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "print every form of the address")
	lf.add(cmd, "print port numbers only")
	return cmd
}

func newPortForward(a *app) *cobra.Command {
	return &cobra.Command{
		Use:               "port-forward SANDBOX [LOCAL_ADDR:]LOCAL_PORT:REMOTE_PORT",
		ValidArgsFunction: a.completeSandboxes(1),
		Short:             "Forward a local TCP port to a port inside a sandbox",
		Long: `Listen on LOCAL_ADDR:LOCAL_PORT (default address 127.0.0.1; port 0 picks a free
one) and tunnel each connection through the daemon to REMOTE_PORT on the
sandbox's loopback, like kubectl port-forward. Runs until interrupted.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			local, remote, err := parseForward(args[1])
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			c := a.client()
			sb, err := c.Get(ctx, args[0])
			if err != nil {
				return err
			}
			var lc net.ListenConfig
			ln, err := lc.Listen(ctx, "tcp", local)
			if err != nil {
				return fmt.Errorf("listening on %s: %w", local, err)
			}
			defer ln.Close()
			context.AfterFunc(ctx, func() { ln.Close() })
			fmt.Fprintf(a.stdout, "Forwarding from %s -> %s:%d\n", ln.Addr(), sb.ID, remote)
			var wg sync.WaitGroup
			defer wg.Wait()
			for {
				conn, err := ln.Accept()
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return fmt.Errorf("accepting: %w", err)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer conn.Close()
					up, err := c.DialPort(ctx, sb.ID, remote)
					if err != nil {
						fmt.Fprintf(a.stderr, "sbx: %v\n", err)
						return
					}
					defer up.Close()
					stop := context.AfterFunc(ctx, func() { conn.Close(); up.Close() })
					defer stop()
					relay(conn, up)
				}()
			}
		},
	}
}

// parseForward parses [LOCAL_ADDR:]LOCAL_PORT:REMOTE_PORT.
func parseForward(spec string) (local string, remote uint32, err error) {
	i := strings.LastIndex(spec, ":")
	if i < 0 {
		return "", 0, fmt.Errorf("bad forward %q: want [LOCAL_ADDR:]LOCAL_PORT:REMOTE_PORT", spec)
	}
	r, err := strconv.ParseUint(spec[i+1:], 10, 16)
	if err != nil || r == 0 {
		return "", 0, fmt.Errorf("bad remote port in %q: want a number in 1-65535", spec)
	}
	head := spec[:i]
	addr, lport := "127.0.0.1", head
	if j := strings.LastIndex(head, ":"); j >= 0 {
		addr, lport = strings.Trim(head[:j], "[]"), head[j+1:]
	}
	if _, err := strconv.ParseUint(lport, 10, 16); err != nil {
		return "", 0, fmt.Errorf("bad local port in %q: want a number in 0-65535", spec)
	}
	return net.JoinHostPort(addr, lport), uint32(r), nil
}

// relay copies both ways, passing half-closes on.
func relay(a, b net.Conn) {
	var wg sync.WaitGroup
	cp := func(dst, src net.Conn) {
		defer wg.Done()
		if _, err := io.Copy(dst, src); err != nil {
			a.Close()
			b.Close()
			return
		}
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		} else {
			dst.Close()
		}
	}
	wg.Add(2)
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
}
