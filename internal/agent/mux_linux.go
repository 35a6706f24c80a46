package agent

import (
	"bufio"
	"context"
	"net"

	"github.com/sbxdev/sbx/api/execframe"
)

// The agent serves both of its protocols on whatever endpoint the driver
// gives it (protocol 5): a connection whose first byte is
// execframe.FrameInput carries one framed exec (as on the exec socket), one
// whose first byte is execframe.FrameFileWrite or FrameFileRead one raw file
// transfer (protocol 6, rawfile_linux.go), any
// other (an HTTP/2 preface starts with 'P') goes to the AgentService. So a
// driver that can hand the agent one endpoint only (a vsock port, a TCP
// port, a single Unix socket) gets the same exec transport as one that
// also hands it an exec socket.

// muxListener is a listener whose Accept returns the connections that do
// not speak the framed exec protocol; the others it serves itself.
type muxListener struct {
	net.Listener
	conns chan net.Conn
	done  chan struct{}
	// err is the inner listener's error, set before done is closed.
	err error
}

// muxExec returns ln as a listener for the AgentService, serving framed
// execs on it until ctx ends. The accepting and sniffing happen in
// goroutines of its own, so a connection that says nothing holds up no
// other.
func (s *Server) muxExec(ctx context.Context, ln net.Listener) net.Listener {
	m := &muxListener{Listener: ln, conns: make(chan net.Conn), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				m.err = err
				return
			}
			go s.sniff(ctx, m, c)
		}
	}()
	return m
}

// sniff reads c's first byte and serves c as what it says it is. It waits
// for that byte as long as it takes, as the exec socket waits for a start
// frame: the daemon keeps a spare connection ready for its next command
// (agentconn), and only the daemon reaches the endpoint.
func (s *Server) sniff(ctx context.Context, m *muxListener, c net.Conn) {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	br := bufio.NewReaderSize(c, 16)
	first, err := br.Peek(1)
	stop()
	if err != nil {
		c.Close()
		return
	}
	pc := &peekedConn{Conn: c, r: br}
	switch first[0] {
	case execframe.FrameInput:
		s.serveExecConn(ctx, pc)
		return
	case execframe.FrameFileWrite, execframe.FrameFileRead:
		s.serveRawFile(ctx, pc)
		return
	}
	select {
	case m.conns <- pc:
	case <-m.done:
		c.Close()
	}
}

func (m *muxListener) Accept() (net.Conn, error) {
	select {
	case c := <-m.conns:
		return c, nil
	case <-m.done:
		if m.err == nil {
			return nil, net.ErrClosed
		}
		return nil, m.err
	}
}

// peekedConn is a connection whose first bytes were read into r.
type peekedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *peekedConn) Read(p []byte) (int, error) {
	if c.r.Buffered() > 0 {
		return c.r.Read(p)
	}
	return c.Conn.Read(p)
}
