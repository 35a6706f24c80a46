package agentconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"time"

	"connectrpc.com/connect"
	agentv1 "github.com/sbxdev/sbx/api/gen/agent/v1"
)

// dialChunk is the largest data message a StreamConn sends.
const dialChunk = 32 << 10

// DialTCP opens a TCP connection from inside the sandbox to host:port
// ("" = 127.0.0.1, the sandbox's own loopback) through the agent's Dial
// call. ctx bounds the connecting only, like net.Dialer.DialContext. A
// refused or unreachable target is a *connect.Error with CodeUnavailable.
func (c *Conn) DialTCP(ctx context.Context, host string, port uint32) (*StreamConn, error) {
	// The call outlives ctx: it is the connection.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stopWatch := context.AfterFunc(ctx, cancel)
	stream := c.AgentServiceClient.Dial(sctx)
	fail := func(err error) (*StreamConn, error) {
		stopWatch()
		cancel()
		_ = stream.CloseRequest()
		_ = stream.CloseResponse()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("dialing port %d: %w", port, ctx.Err())
		}
		return nil, err
	}
	if err := stream.Send(&agentv1.DialInput{Event: &agentv1.DialInput_Start{Start: &agentv1.DialStart{Host: host, Port: port}}}); err != nil && !errors.Is(err, io.EOF) {
		return fail(err)
	}
	first, err := stream.Receive()
	if err != nil {
		return fail(err)
	}
	if first.GetConnected() == nil {
		return fail(errors.New("agent dial: the first answer is not connected"))
	}
	if !stopWatch() {
		// ctx ended just now and cancelled the call.
		return fail(ctx.Err())
	}
	if host == "" {
		host = "127.0.0.1"
	}
	sc := &StreamConn{
		stream: stream,
		cancel: cancel,
		remote: streamAddr(net.JoinHostPort(host, strconv.FormatUint(uint64(port), 10))),
		msgs:   make(chan []byte),
		closed: make(chan struct{}),
	}
	go sc.receive()
	return sc, nil
}

// StreamConn is a net.Conn carried by an agent Dial call. CloseWrite
// half-closes. Read deadlines are honoured; write deadlines are accepted
// but not enforced (writes block only on the call's flow control).
type StreamConn struct {
	stream *connect.BidiStreamForClient[agentv1.DialInput, agentv1.DialOutput]
	cancel context.CancelFunc
	remote streamAddr

	// msgs carries received data; receive closes it at the end of the
	// target's data, after setting rerr.
	msgs chan []byte
	rerr error // read error after msgs is closed: io.EOF or the call's error

	closed    chan struct{}
	closeOnce sync.Once
	onClose   []func()

	// readMu serialises readers and guards pending.
	readMu  sync.Mutex
	pending []byte

	// dlMu guards readDeadline.
	dlMu         sync.Mutex
	readDeadline time.Time

	// writeMu serialises writers and guards wclosed.
	writeMu sync.Mutex
	wclosed bool
}

var _ net.Conn = (*StreamConn)(nil)

// OnClose registers f to run once when the connection is closed. Not safe
// to call concurrently with Close.
func (c *StreamConn) OnClose(f func()) { c.onClose = append(c.onClose, f) }

// receive moves the target's data to msgs until the EOF mark (an empty data
// message), the end of the call or Close.
func (c *StreamConn) receive() {
	defer close(c.msgs)
	for {
		msg, err := c.stream.Receive()
		if err != nil {
			if errors.Is(err, io.EOF) {
				c.rerr = io.EOF
			} else {
				c.rerr = fmt.Errorf("port %s: %w", c.remote, err)
			}
			return
		}
		d := msg.GetData()
		if d == nil {
			continue
		}
		if len(d) == 0 {
			c.rerr = io.EOF
			return
		}
		select {
		case c.msgs <- d:
		case <-c.closed:
			c.rerr = net.ErrClosed
			return
		}
	}
}

func (c *StreamConn) Read(p []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	if len(c.pending) == 0 {
		c.dlMu.Lock()
		dl := c.readDeadline
		c.dlMu.Unlock()
		var timeout <-chan time.Time
		if !dl.IsZero() {
			d := time.Until(dl)
			if d <= 0 {
				return 0, os.ErrDeadlineExceeded
			}
			t := time.NewTimer(d)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case d, ok := <-c.msgs:
			if !ok {
				select {
				case <-c.closed:
					return 0, net.ErrClosed
				default:
				}
				return 0, c.rerr
			}
			c.pending = d
		case <-c.closed:
			return 0, net.ErrClosed
		case <-timeout:
			return 0, os.ErrDeadlineExceeded
		}
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

func (c *StreamConn) Write(p []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	select {
	case <-c.closed:
		return 0, net.ErrClosed
	default:
	}
	if c.wclosed {
		return 0, fmt.Errorf("write to port %s after CloseWrite: %w", c.remote, net.ErrClosed)
	}
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), dialChunk)]
		if err := c.stream.Send(&agentv1.DialInput{Event: &agentv1.DialInput_Data{Data: chunk}}); err != nil {
			return n, fmt.Errorf("write to port %s: %w", c.remote, err)
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

// CloseWrite tells the target no more data comes (TCP half-close).
func (c *StreamConn) CloseWrite() error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if c.wclosed {
		return nil
	}
	c.wclosed = true
	err := c.stream.Send(&agentv1.DialInput{Event: &agentv1.DialInput_CloseWrite{CloseWrite: true}})
	if cerr := c.stream.CloseRequest(); err == nil {
		err = cerr
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("half-closing port %s: %w", c.remote, err)
	}
	return nil
}

// Close tears the call down (the agent closes its connection at once).
func (c *StreamConn) Close() error {
	c.closeOnce.Do(func() {
		close(c.closed)
		c.cancel()
		// The receive goroutine ends with the cancelled call.
		go func() {
			c.writeMu.Lock()
			_ = c.stream.CloseRequest()
			c.writeMu.Unlock()
			_ = c.stream.CloseResponse()
		}()
		for _, f := range c.onClose {
			f()
		}
	})
	return nil
}

func (c *StreamConn) LocalAddr() net.Addr  { return streamAddr("agent") }
func (c *StreamConn) RemoteAddr() net.Addr { return c.remote }

func (c *StreamConn) SetDeadline(t time.Time) error {
	return c.SetReadDeadline(t)
}

func (c *StreamConn) SetReadDeadline(t time.Time) error {
	c.dlMu.Lock()
	c.readDeadline = t
	c.dlMu.Unlock()
	return nil
}

func (c *StreamConn) SetWriteDeadline(time.Time) error { return nil }

type streamAddr string

func (a streamAddr) Network() string { return "sbx-agent" }
func (a streamAddr) String() string  { return string(a) }
