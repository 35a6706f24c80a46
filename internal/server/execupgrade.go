package server

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	"github.com/sbxdev/sbx/api/execframe"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// The API's exec upgrade: GET ExecPath over HTTP/1.1 with "Connection:
// Upgrade" and "Upgrade: ExecUpgrade" (and the API token, as for every API
// call) turns the connection into a stream of commands in the framed exec
// protocol (api/execframe). It is the Exec RPC without HTTP/2: the client
// sends a FrameInput frame holding a start message, the daemon answers with
// the command's FrameOutput frames up to the exited event, or with one
// FrameError frame; then the connection takes the next command. Anything the
// client sends while a command runs, and the client closing the connection,
// cancels the command and ends the connection. Commands that need stdin
// after their start use the ExecInteractive RPC instead.
const (
	ExecPath    = "/exec"
	ExecUpgrade = "sbx-exec"
)

// execIdleTimeout is how long an upgraded connection may wait between
// commands before the daemon closes it. Clients keep idle connections for
// less (the Go SDK: 30 s), so that a command is never sent on a connection
// the daemon is closing.
const execIdleTimeout = 2 * time.Minute

// serveExec upgrades the connection of an (authenticated) GET ExecPath and
// serves commands on it until the client leaves, it idles out, or the front
// closes.
func (f *Front) serveExec(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet || !isUpgrade(r) || !headerHasToken(r.Header, "Upgrade", ExecUpgrade) {
		http.Error(w, "sbx: "+ExecPath+" needs GET with Connection: Upgrade and Upgrade: "+ExecUpgrade+" over HTTP/1.1", http.StatusBadRequest)
		return
	}
	if r.ProtoMajor != 1 {
		http.Error(w, "sbx: the exec upgrade needs HTTP/1.1", http.StatusHTTPVersionNotSupported)
		return
	}
	nc, br, ok := upgradeConn(w, ExecUpgrade)
	if !ok {
		return
	}
	// The request's context lasts as long as this handler; the front's ends
	// when the daemon stops (hijacked connections are not the server's to
	// close any more).
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	defer context.AfterFunc(f.done, cancel)()
	serveExecConn(ctx, f.streams, nc, br, execIdleTimeout)
}

// execConn is one upgraded connection.
type execConn struct {
	nc net.Conn
	w  *execframe.Writer

	mu sync.Mutex
	// busy is set by the reader when it hands over a frame and cleared
	// before the answer's last frame goes out: whatever the reader reads
	// while it is set came in the middle of a command.
	busy bool
	// gone: the reader read something in the middle of a command (the
	// client left or broke the protocol); the connection is done.
	gone bool
	// cancel ends the running command; nil between commands.
	cancel context.CancelFunc
}

// frame is what the connection's reader read.
type frame struct {
	typ     byte
	payload []byte
	err     error
}

// serveExecConn runs the commands of one connection, reading through br
// (which may hold bytes read with the upgrade request), and closes it.
func serveExecConn(ctx context.Context, streams *Streams, nc net.Conn, br *bufio.Reader, idle time.Duration) {
	defer nc.Close()
	c := &execConn{nc: nc, w: execframe.NewWriter(nc)}
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	defer stop()

	// The reader reads all the time, so that the client going away (or
	// breaking the protocol) in the middle of a command cancels it at once.
	frames := make(chan frame)
	done := make(chan struct{})
	defer close(done)
	go func() {
		r := execframe.NewReader(br)
		for {
			typ, payload, err := r.Next()
			if !c.received(err == nil) {
				nc.Close()
				return
			}
			select {
			case frames <- frame{typ, payload, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()

	for {
		_ = nc.SetReadDeadline(time.Now().Add(idle))
		var fr frame
		select {
		case fr = <-frames:
		case <-ctx.Done():
			return
		}
		if fr.err != nil {
			return // gone, idle, or not a frame
		}
		start, err := parseStart(fr)
		if err != nil {
			// Not the protocol: say why once, then hang up.
			c.writeError(err)
			return
		}
		if err := validateExec(start); err != nil {
			if !c.writeError(err) {
				return
			}
			continue
		}
		if start.GetStdinOpen() {
			if !c.writeError(connect.NewError(connect.CodeInvalidArgument, errors.New("exec: the exec upgrade takes no input after start (stdin_open); use the ExecInteractive RPC"))) {
				return
			}
			continue
		}
		_ = nc.SetReadDeadline(time.Time{})
		cctx, cancel := context.WithCancel(ctx)
		if !c.begin(cancel) {
			cancel()
			return
		}
		err = relayExec(cctx, streams, start, nil, c.send, c.sendData)
		interrupted := cctx.Err() != nil
		cancel()
		if interrupted {
			return // the reader or the daemon ended it and closed nc
		}
		if err != nil && !c.writeError(err) {
			return
		}
	}
}

// parseStart reads the start message of a command from fr.
func parseStart(fr frame) (*sbxv1.ExecRequest, error) {
	if fr.typ != execframe.FrameInput {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("exec upgrade: expected an input frame holding a start message"))
	}
	in := &sbxv1.ExecInput{}
	if err := proto.Unmarshal(fr.payload, in); err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("exec upgrade: input frame: "+err.Error()))
	}
	start := in.GetStart()
	if start == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("exec upgrade: a command's first frame must hold its start message"))
	}
	return start, nil
}

// received records that the reader read a frame (ok) or failed, and
// reports whether to hand that over: not if it came in the middle of a
// command, which it then cancels.
func (c *execConn) received(ok bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.busy {
		c.gone = true
		if c.cancel != nil {
			c.cancel()
		}
		return false
	}
	c.busy = ok
	return true
}

// begin makes cancel the running command's, unless the client is gone.
func (c *execConn) begin(cancel context.CancelFunc) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cancel = cancel
	return !c.gone
}

// idle marks the end of a command (or of a refused start), before its last
// frame goes out.
func (c *execConn) idle() {
	c.mu.Lock()
	c.busy, c.cancel = false, nil
	c.mu.Unlock()
}

// send writes one output event of the running command.
func (c *execConn) send(m *sbxv1.ExecOutput) error {
	if m.GetExited() != nil {
		c.idle()
	}
	if err := c.w.Write(execframe.FrameOutput, m); err != nil {
		return err
	}
	return c.w.Flush()
}

// sendData writes a stdout or stderr frame of the running command as the
// agent encoded it, and sends it unless the agent's next frame is already
// here (more): a flood then goes out in writes of the writer's whole
// buffer instead of one per frame.
func (c *execConn) sendData(payload []byte, more bool) error {
	if err := c.w.WriteFrame(execframe.FrameOutput, payload); err != nil {
		return err
	}
	if more {
		return nil
	}
	return c.w.Flush()
}

// writeError ends a command (or refuses a start) with err as the Connect
// path would (execframe.Writer.WriteErrorOf, else Unknown) and reports
// whether the connection still works.
func (c *execConn) writeError(err error) bool {
	c.idle()
	if c.w.WriteErrorOf(err, connect.CodeUnknown) != nil {
		return false
	}
	return c.w.Flush() == nil
}
