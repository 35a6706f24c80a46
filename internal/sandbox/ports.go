package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
)

// ResolveID returns the id of the sandbox with id or name ref.
func (m *Manager) ResolveID(ctx context.Context, ref string) (string, error) {
	b, err := m.lookup(ctx, ref)
	if err != nil {
		return "", err
	}
	return b.id, nil
}

// RunningID returns the id of the sandbox with id or name ref if it is
// running: unknown is NotFound, stopped (or not running yet or any more)
// FailedPrecondition. The port proxy checks it before every request, as a
// pooled connection to a stopped (frozen) sandbox would hang. A stopped
// sandbox with auto_resume is started instead (see Manager.Agent).
func (m *Manager) RunningID(ctx context.Context, ref string) (string, error) {
	b, err := m.lookup(ctx, ref)
	if err != nil {
		return "", err
	}
	if err := m.running(ctx, b); err != nil {
		return "", err
	}
	return b.id, nil
}

// checkPort validates a port number.
func checkPort(port uint32) error {
	if port == 0 || port > 65535 {
		return invalid("port %d is not in 1-65535", port)
	}
	return nil
}

// DialPort opens a TCP connection to port on the loopback of the running
// sandbox ref, made by its agent inside the sandbox's network namespace (so
// it needs no network mode and reaches loopback-only servers). ctx bounds
// the connecting only. While the connection is open the sandbox counts as
// active. Errors: unknown sandbox NotFound; stopped or not running
// FailedPrecondition; bad port InvalidArgument; nothing listening (or the
// agent unreachable) Unavailable.
func (m *Manager) DialPort(ctx context.Context, ref string, port uint32) (net.Conn, error) {
	if err := checkPort(port); err != nil {
		return nil, err
	}
	conn, release, err := m.Agent(ctx, ref)
	if err != nil {
		return nil, err
	}
	c, err := conn.DialTCP(ctx, "", port)
	if err != nil {
		release()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connecting to port %d of sandbox %s: %w", port, ref, ctx.Err())
		}
		msg := err.Error()
		if ce := new(connect.Error); errors.As(err, &ce) {
			msg = ce.Message()
		}
		return nil, fmt.Errorf("connecting to port %d of sandbox %s: %s: %w", port, ref, msg, errdefs.ErrUnavailable)
	}
	c.OnClose(release)
	return c, nil
}

// ListeningPort is a TCP socket listening inside a sandbox.
type ListeningPort struct {
	Port uint32
	// Addr is the bound address ("0.0.0.0", "127.0.0.1", "::"...).
	Addr string
}

// ListeningPorts returns the TCP ports listening in the running sandbox
// ref, ascending, one entry per port (IPv4 wildcard binds first). It reads
// /proc/net/tcp and tcp6 through the agent, which sees its own (the
// sandbox's) network namespace.
func (m *Manager) ListeningPorts(ctx context.Context, ref string) ([]ListeningPort, error) {
	conn, release, err := m.Agent(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer release()
	var all []ListeningPort
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		st, err := conn.ReadFile(ctx, connect.NewRequest(&sbxv1.ReadFileRequest{Path: f}))
		if err != nil {
			return nil, fmt.Errorf("reading %s in sandbox %s: %w", f, ref, err)
		}
		var buf bytes.Buffer
		for st.Receive() {
			buf.Write(st.Msg().GetData())
			if buf.Len() > 64<<20 {
				st.Close()
				return nil, fmt.Errorf("reading %s in sandbox %s: larger than 64 MiB", f, ref)
			}
		}
		err = st.Err()
		st.Close()
		if err != nil {
			if connect.CodeOf(err) == connect.CodeNotFound && strings.HasSuffix(f, "6") {
				continue // IPv6 is off in the kernel
			}
			return nil, fmt.Errorf("reading %s in sandbox %s: %w", f, ref, err)
		}
		ports, err := ParseProcNetTCP(&buf)
		if err != nil {
			return nil, fmt.Errorf("parsing %s of sandbox %s: %w", f, ref, err)
		}
		all = append(all, ports...)
	}
	return dedupePorts(all), nil
}

// dedupePorts keeps one entry per port, preferring wildcard binds.
func dedupePorts(all []ListeningPort) []ListeningPort {
	rank := func(p ListeningPort) int {
		switch p.Addr {
		case "0.0.0.0":
			return 0
		case "::":
			return 1
		}
		return 2
	}
	slices.SortStableFunc(all, func(a, b ListeningPort) int {
		if a.Port != b.Port {
			return int(a.Port) - int(b.Port)
		}
		return rank(a) - rank(b)
	})
	return slices.CompactFunc(all, func(a, b ListeningPort) bool { return a.Port == b.Port })
}

// ParseProcNetTCP returns the listening sockets in the text of
// /proc/net/tcp or /proc/net/tcp6.
func ParseProcNetTCP(r io.Reader) ([]ListeningPort, error) {
	var out []ListeningPort
	sc := bufio.NewScanner(r)
	first := true
	for sc.Scan() {
		if first { // header
			first = false
			continue
		}
		f := strings.Fields(sc.Text())
		if len(f) < 4 {
			continue
		}
		if f[3] != "0A" { // TCP_LISTEN
			continue
		}
		hexIP, hexPort, ok := strings.Cut(f[1], ":")
		if !ok {
			return nil, fmt.Errorf("bad local address %q", f[1])
		}
		port, err := strconv.ParseUint(hexPort, 16, 16)
		if err != nil {
			return nil, fmt.Errorf("bad port in %q: %w", f[1], err)
		}
		ip, err := procIP(hexIP)
		if err != nil {
			return nil, fmt.Errorf("bad address in %q: %w", f[1], err)
		}
		out = append(out, ListeningPort{Port: uint32(port), Addr: ip.String()})
	}
	return out, sc.Err()
}

// procIP decodes /proc/net's address: 32-bit words in host (little-endian) order.
func procIP(h string) (netip.Addr, error) {
	b, err := hex.DecodeString(h)
	if err != nil {
		return netip.Addr{}, err
	}
	if len(b) != 4 && len(b) != 16 {
		return netip.Addr{}, fmt.Errorf("%d bytes", len(b))
	}
	for i := 0; i < len(b); i += 4 {
		b[i], b[i+1], b[i+2], b[i+3] = b[i+3], b[i+2], b[i+1], b[i]
	}
	a, _ := netip.AddrFromSlice(b)
	return a.Unmap(), nil
}
