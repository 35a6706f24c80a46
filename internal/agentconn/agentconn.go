// Package agentconn is the daemon side of the daemon↔agent link: it turns a
// dial function (a Unix socket, vsock, a forwarded port) into an
// agentv1connect.AgentServiceClient speaking Connect over unencrypted
// HTTP/2, and negotiates the protocol version. It imports only api/ and
// internal/splice (raw file connections).
package agentconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	agentv1 "github.com/sbxdev/sbx/api/gen/agent/v1"
	"github.com/sbxdev/sbx/api/gen/agent/v1/agentv1connect"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// ProtocolVersion is the highest daemon↔agent protocol version this build speaks.
// Version 2 added detached processes (Attach, ListDetached, RemoveDetached);
// 3 added the entrypoint's Logs and Wait; 4 added background processes
// (StartProcess, ProcessLogs, ProcessInput, WaitProcess); 5 has the agent
// take framed execs on its API endpoint too (a connection whose first
// byte is execframe.FrameInput), which the daemon uses for a box whose
// driver gives it no exec socket of its own; 6 has it take raw file
// connections there too (a connection whose first byte is
// execframe.FrameFileWrite or FrameFileRead: rawfile.go).
const ProtocolVersion = 6

// protocolFramedOnAPI is the first protocol version whose agent takes
// framed execs on its API endpoint.
const protocolFramedOnAPI = 5

// protocolRawFiles is the first protocol version whose agent takes raw
// file connections on its API endpoint.
const protocolRawFiles = 6

// ReadyByte is what an agent started with --ready-fd writes on that fd once it
// serves; drivers wait for it instead of polling with Hello.
const ReadyByte = 'R'

// AwaitReady waits at most timeout for an agent started with --ready-fd to
// write ReadyByte on the pipe whose read end is ready. An agent that exits
// first (and so closes the pipe) fails it at once.
func AwaitReady(ctx context.Context, ready *os.File, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if dl, ok := ctx.Deadline(); ok {
		if err := ready.SetReadDeadline(dl); err != nil {
			return fmt.Errorf("agent ready pipe: %w", err)
		}
	}
	stop := context.AfterFunc(ctx, func() { _ = ready.SetReadDeadline(time.Now()) })
	defer stop()
	var b [1]byte
	n, err := ready.Read(b[:])
	switch {
	case n == 1 && b[0] == ReadyByte:
		return nil
	case n == 1:
		return fmt.Errorf("agent said %q on its ready pipe", b[0])
	case errors.Is(err, io.EOF):
		return errors.New("agent exited before it served")
	case ctx.Err() != nil:
		return fmt.Errorf("waiting for the agent to serve: %w", ctx.Err())
	case errors.Is(err, os.ErrDeadlineExceeded): // the pipe's deadline fired before ctx's timer
		return fmt.Errorf("waiting for the agent to serve: %w", context.DeadlineExceeded)
	default:
		return fmt.Errorf("agent ready pipe: %w", err)
	}
}

// The agent is on the sandbox's side of the boundary, so what the daemon
// buffers of its answers is bounded: each stream holds at most StreamWindow
// bytes the daemon has not passed on yet (a slow client of a file read stops
// the agent there, through HTTP/2 flow control), a connection at most
// ConnWindow, and no message may be larger than MaxMessageBytes (one huge
// message would otherwise be read whole into memory). A stream whose client
// stopped reading keeps its window's bytes counted against the connection's
// until it ends, so ConnWindow leaves room for every file call a sandbox may
// have in flight (internal/server's DefaultFilesPerSandbox) each holding a
// full StreamWindow, plus ReservedWindow for everything else: otherwise the
// stalled calls take the whole connection window and the box's next calls
// (its Hello, another client's read) wait for data that never comes.
const (
	StreamWindow   = 512 << 10
	ReservedWindow = 16 << 20
	// MaxStalledStreams is how many streams may stall with a full window
	// and leave the reserve alone: the most file calls in flight per
	// sandbox `sbx serve --file-max-streams` accepts.
	MaxStalledStreams = 64
	ConnWindow        = MaxStalledStreams*StreamWindow + ReservedWindow
	// MaxMessageBytes bounds one message from the agent: file data comes
	// in 256 KiB chunks, the largest answers are recursive listings.
	MaxMessageBytes = 64 << 20
)

// DialFunc opens a new connection to an agent.
type DialFunc func(ctx context.Context) (net.Conn, error)

// Conn is a client of one agent. Close releases its idle connections.
type Conn struct {
	agentv1connect.AgentServiceClient
	transport *http.Transport
	// dial connects to the agent's API endpoint.
	dial DialFunc
	// execDial, if set, connects to the agent's framed exec socket.
	execDial DialFunc
	// version is the protocol version the agent's Hello answered; 0 until
	// then.
	version atomic.Uint32
	// execOnce calls the agent's Exec (a bidi stream) as a server stream:
	// one start message, then the request ends (see ExecOnce).
	execOnce *connect.Client[sbxv1.ExecInput, sbxv1.ExecOutput]

	// spare is an exec connection dialled ahead, on which the agent
	// already waits for a start message: a command then costs no dial and
	// no accept (see framed.go).
	// maxProtocol caps the version Hello settles on (WithMaxProtocol).
	maxProtocol uint32

	spareMu   sync.Mutex
	spare     net.Conn
	refilling bool
	closed    bool
}

// Option configures a Conn.
type Option func(*Conn)

// WithExecDial has ExecOnce use the agent's framed exec protocol
// (api/execframe) over connections from dial. A dial error wrapping
// errors.ErrUnsupported (a box whose agent has no exec socket) falls back
// to the Exec RPC.
func WithExecDial(dial DialFunc) Option { return func(c *Conn) { c.execDial = dial } }

// WithMaxProtocol has the daemon speak at most protocol v with this agent,
// whatever the agent could (0: all this build speaks): the paths kept for
// older agents are driven with it in tests.
func WithMaxProtocol(v uint32) Option { return func(c *Conn) { c.maxProtocol = v } }

// New returns a client that dials with dial. It does not connect yet.
func New(dial DialFunc, opts ...Option) *Conn {
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	tr := &http.Transport{
		Protocols: &protos,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial(ctx)
		},
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     90 * time.Second,
		HTTP2: &http.HTTP2Config{
			MaxReceiveBufferPerStream:     StreamWindow,
			MaxReceiveBufferPerConnection: ConnWindow,
		},
	}
	hc := &http.Client{Transport: tr}
	client := agentv1connect.NewAgentServiceClient(hc, "http://agent", connect.WithReadMaxBytes(MaxMessageBytes))
	execOnce := connect.NewClient[sbxv1.ExecInput, sbxv1.ExecOutput](hc, "http://agent"+agentv1connect.AgentServiceExecProcedure,
		connect.WithReadMaxBytes(MaxMessageBytes))
	c := &Conn{AgentServiceClient: client, transport: tr, dial: dial, execOnce: execOnce}
	for _, o := range opts {
		o(c)
	}
	return c
}

// ExecStream is the output of a command started with ExecOnce.
type ExecStream interface {
	Receive() bool
	Msg() *sbxv1.ExecOutput
	Err() error
	Close() error
}

// DataStream is an ExecStream that can hand over the command's output
// undecoded: the framed transport's. A relay whose client speaks the
// framed protocol too passes the data on as it came (see
// execframe.IsData) and decodes only the other events.
type DataStream interface {
	ExecStream
	// ReceiveData is Receive, except that a stdout or stderr event is
	// not decoded: data is its frame's payload, valid until the next
	// call, and Msg is left alone. more reports that (part of) the next
	// frame has already arrived, so a relay may hold its write back.
	ReceiveData() (data []byte, more, ok bool)
}

// ExecConn is a command started with ExecInteractive: its output, and its
// input after the start message.
type ExecConn interface {
	ExecStream
	// Send sends an input event: stdin, its end, a resize or a signal.
	Send(*sbxv1.ExecInput) error
	// CloseSend says no more input comes (it does not close stdin).
	CloseSend() error
}

// ExecOnce runs a command that takes no input after its start message
// (stdin given up front or none, no signals or resizes). With an exec
// dialer it takes the agent's framed exec protocol, one Unix connection per
// command: a fraction of an HTTP/2 round trip. Otherwise it calls the Exec
// RPC as a server stream: on the wire that is what a bidi call that sends
// start and closes its side looks like, but the request is sent from one
// buffer instead of through a pipe and a writer goroutine. Either way,
// cancelling ctx (or closing the stream early) makes the agent kill the
// command.
func (c *Conn) ExecOnce(ctx context.Context, start *sbxv1.ExecRequest) (ExecStream, error) {
	st, err := c.execFramed(ctx, start)
	if !errors.Is(err, errors.ErrUnsupported) {
		return st, err
	}
	return c.execOnce.CallServerStream(ctx, connect.NewRequest(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: start}}))
}

// ExecInteractive starts a command that takes input after its start
// message (stdin, resizes, signals). It takes the same framed transport as
// ExecOnce, on which the agent has always read input frames after the
// start; only a box whose agent has no exec socket falls back to the Exec
// RPC as a bidi stream. Cancelling ctx (or closing the stream) makes the
// agent kill the command.
func (c *Conn) ExecInteractive(ctx context.Context, start *sbxv1.ExecRequest) (ExecConn, error) {
	st, err := c.execFramed(ctx, start)
	if !errors.Is(err, errors.ErrUnsupported) {
		if err != nil {
			return nil, err
		}
		return st, nil
	}
	bs := &bidiStream{s: c.AgentServiceClient.Exec(ctx)}
	if err := bs.s.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: start}}); err != nil && !errors.Is(err, io.EOF) {
		_ = bs.Close()
		return nil, fmt.Errorf("sending exec start to agent: %w", err)
	}
	return bs, nil
}

// bidiStream is the Exec RPC as an ExecConn, for agents without an exec
// socket. A send that finds the agent gone (io.EOF) succeeds: Receive then
// says why.
type bidiStream struct {
	s    *connect.BidiStreamForClient[sbxv1.ExecInput, sbxv1.ExecOutput]
	msg  *sbxv1.ExecOutput
	err  error
	done bool
}

func (b *bidiStream) Receive() bool {
	if b.done {
		return false
	}
	m, err := b.s.Receive()
	if err != nil {
		b.done = true
		if !errors.Is(err, io.EOF) {
			b.err = err
		}
		return false
	}
	b.msg = m
	return true
}

func (b *bidiStream) Msg() *sbxv1.ExecOutput { return b.msg }
func (b *bidiStream) Err() error             { return b.err }

// Close tells the agent (over HTTP/2) that the daemon is gone, so that it
// kills a command that is still running.
func (b *bidiStream) Close() error { return b.s.CloseResponse() }

func (b *bidiStream) Send(in *sbxv1.ExecInput) error {
	if err := b.s.Send(in); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

// CloseSend closes the request side: until it is closed the HTTP/2
// transport is busy sending its body and does not watch the call's
// context.
func (b *bidiStream) CloseSend() error { return b.s.CloseRequest() }

// Close drops idle connections to the agent.
func (c *Conn) Close() {
	c.spareMu.Lock()
	c.closed = true
	spare := c.spare
	c.spare = nil
	c.spareMu.Unlock()
	if spare != nil {
		spare.Close()
	}
	c.transport.CloseIdleConnections()
}

// Hello checks the agent answers and speaks a protocol this daemon knows.
func (c *Conn) Hello(ctx context.Context) (*agentv1.HelloResponse, error) {
	ours := uint32(ProtocolVersion)
	if c.maxProtocol != 0 {
		ours = min(ours, c.maxProtocol)
	}
	resp, err := c.AgentServiceClient.Hello(ctx, connect.NewRequest(&agentv1.HelloRequest{ProtocolVersion: ours}))
	if err != nil {
		return nil, fmt.Errorf("agent hello: %w", err)
	}
	v := resp.Msg.GetProtocolVersion()
	if v == 0 || v > ours {
		return nil, fmt.Errorf("agent speaks protocol %d, daemon speaks up to %d", v, ours)
	}
	c.version.Store(v)
	return resp.Msg, nil
}
