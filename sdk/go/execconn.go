package sbx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/api/execframe"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Exec without stdin after its start goes over the daemon's exec upgrade
// (GET /exec, "Upgrade: sbx-exec"): an HTTP/1.1 connection that carries the
// Exec RPC's messages in api/execframe frames, one command after another.
// On this path a command costs one write and the reads of its output; over
// gRPC it also costs HTTP/2's stream set-up, which took about as long as
// spawning a short command. Connections are pooled; a daemon that refuses
// the upgrade (an older one, or a proxy in between that speaks only HTTP/2)
// turns it off for the client, which then uses the Exec RPC.

// execIdleKeep is how long an idle upgraded connection is kept: less than
// the daemon's 2 minutes, so that a command is never sent on a connection
// the daemon is closing.
const execIdleKeep = 30 * time.Second

// execMaxIdle bounds the idle upgraded connections a client keeps.
const execMaxIdle = 4

// execPool holds a client's idle upgraded connections.
type execPool struct {
	mu       sync.Mutex
	idle     []*execConn // the most recently used last
	disabled bool        // WithoutExecUpgrade, or the daemon refused it
}

// execConn is one upgraded connection between commands.
type execConn struct {
	nc   net.Conn
	r    *execframe.Reader
	w    *execframe.Writer
	used time.Time
}

// WithoutExecUpgrade makes Exec use the Exec RPC (gRPC) even where the
// daemon offers the faster exec upgrade.
func WithoutExecUpgrade() Option {
	return func(o *clientOptions) { o.noExecUpgrade = true }
}

// take returns an idle connection that is still open, or nil.
func (p *execPool) take() *execConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.idle) > 0 {
		ec := p.idle[len(p.idle)-1]
		p.idle = p.idle[:len(p.idle)-1]
		if time.Since(ec.used) < execIdleKeep && quiet(ec.nc) {
			return ec
		}
		ec.nc.Close()
	}
	return nil
}

// put keeps ec for the next command, dropping expired and surplus ones.
func (p *execPool) put(ec *execConn) {
	ec.used = time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	keep := p.idle[:0]
	for _, old := range p.idle {
		if time.Since(old.used) < execIdleKeep {
			keep = append(keep, old)
		} else {
			old.nc.Close()
		}
	}
	p.idle = append(keep, ec)
	if len(p.idle) > execMaxIdle {
		p.idle[0].nc.Close()
		p.idle = append(p.idle[:0], p.idle[1:]...)
	}
}

func (p *execPool) off() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.disabled
}

func (p *execPool) disable() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.disabled = true
}

// close drops the idle connections.
func (p *execPool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ec := range p.idle {
		ec.nc.Close()
	}
	p.idle = nil
}

// errNoUpgrade: the daemon refused the exec upgrade; use the RPC.
var errNoUpgrade = errors.New("exec upgrade refused")

// execConn returns an idle upgraded connection or opens one. errNoUpgrade
// means the daemon (or a proxy) refused the upgrade.
func (c *Client) execConn(ctx context.Context) (*execConn, error) {
	if ec := c.execs.take(); ec != nil {
		return ec, nil
	}
	nc, br, status, err := c.upgrade(ctx, "exec", "/exec", "sbx-exec")
	if err != nil {
		// 401 and 403 are the daemon's answer about the token, and an
		// unreachable daemon will not do better over gRPC: only a refusal
		// of the upgrade itself means "not here".
		if status != 0 && status != http.StatusUnauthorized && status != http.StatusForbidden {
			c.execs.disable()
			return nil, errNoUpgrade
		}
		return nil, err
	}
	return &execConn{nc: nc, r: execframe.NewReader(br), w: execframe.NewWriter(nc)}, nil
}

// execUpgraded runs req over an upgraded connection, writing its output to
// stdout and stderr. errNoUpgrade means nothing ran: use the RPC.
func (c *Client) execUpgraded(ctx context.Context, req *sbxv1.ExecRequest, stdout, stderr io.Writer) (*ExitStatus, error) {
	ec, err := c.execConn(ctx)
	if err != nil {
		return nil, err
	}
	// Closing the connection is what cancels the command in the daemon.
	stop := context.AfterFunc(ctx, func() { ec.nc.Close() })
	fail := func(err error) (*ExitStatus, error) {
		ec.nc.Close()
		if !stop() || ctx.Err() != nil {
			return nil, wrap("exec", connect.NewError(connect.CodeOf(ctx.Err()), ctx.Err()))
		}
		return nil, wrap("exec", err)
	}
	err = ec.w.Write(execframe.FrameInput, &sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: req}})
	if err == nil {
		err = ec.w.Flush()
	}
	if err != nil {
		return fail(connect.NewError(connect.CodeUnavailable, err))
	}
	for {
		// Output data is written from the frame as it came (no decoding,
		// no allocation per frame); other events are decoded.
		typ, payload, err := ec.r.NextShared()
		if err == nil && typ == execframe.FrameOutput {
			if data, isStderr, ok := execframe.DataOf(payload); ok {
				if err := writeData(data, isStderr, stdout, stderr); err != nil {
					// As on the RPC path: the command goes with the connection.
					stop()
					ec.nc.Close()
					return nil, err
				}
				continue
			}
		}
		var m *sbxv1.ExecOutput
		if err == nil {
			m, err = execframe.DecodeOutput(typ, payload)
		}
		if err != nil {
			if fe := (*execframe.Error)(nil); errors.As(err, &fe) {
				// The daemon refused or failed the command; the
				// connection takes the next one.
				if stop() {
					c.execs.put(ec)
				}
				return nil, wrap("exec", fe.ConnectError())
			}
			if errors.Is(err, io.EOF) {
				err = errors.New("the daemon closed the exec connection before the command exited")
			}
			return fail(connect.NewError(connect.CodeUnavailable, err))
		}
		st, done, err := handleOutput(m, stdout, stderr)
		if err != nil {
			// As on the RPC path: the command goes with the connection.
			stop()
			ec.nc.Close()
			return nil, err
		}
		if done {
			if stop() {
				c.execs.put(ec)
			}
			return st, nil
		}
	}
}

// writeData writes a command's output to stdout or stderr (nil: dropped).
func writeData(data []byte, isStderr bool, stdout, stderr io.Writer) error {
	w, name := stdout, "stdout"
	if isStderr {
		w, name = stderr, "stderr"
	}
	if w == nil {
		return nil
	}
	if _, err := w.Write(data); err != nil {
		return fmt.Errorf("writing %s: %w", name, err)
	}
	return nil
}
