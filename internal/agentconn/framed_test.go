package agentconn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sbxdev/sbx/api/execframe"
	agentv1 "github.com/sbxdev/sbx/api/gen/agent/v1"
	"github.com/sbxdev/sbx/api/gen/agent/v1/agentv1connect"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// scriptedAgent answers one framed exec: it reads the start frame and
// inputs frames, hands them to got, and writes the frames of answer.
func scriptedAgent(t *testing.T, answer func(w *execframe.Writer), inputs int, got chan<- *sbxv1.ExecInput) DialFunc {
	return func(context.Context) (net.Conn, error) {
		daemon, agent := net.Pipe()
		go func() {
			defer agent.Close()
			r := execframe.NewReader(agent)
			for i := range 1 + inputs {
				in, err := r.ReadInput()
				if i == 0 && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrClosedPipe)) {
					return // a spare connection (Conn.refill), closed unused
				}
				if err != nil {
					t.Errorf("agent: reading input: %v", err)
					return
				}
				got <- in
			}
			w := execframe.NewWriter(agent)
			answer(w)
			if err := w.Flush(); err != nil {
				t.Errorf("agent: writing output: %v", err)
			}
			// Wait for the daemon's end to close.
			_, _ = agent.Read(make([]byte, 1))
		}()
		return daemon, nil
	}
}

func marshal(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReceiveDataUndecoded: a stdout or stderr frame reaches the relay as
// the agent encoded it (here with an overlong length varint, which a
// decode and re-encode would have made canonical); every other event,
// and a data field followed by an exited one, is decoded, so that the
// daemon sees each exit.
func TestReceiveDataUndecoded(t *testing.T) {
	overlong := append(protowire.AppendTag(nil, 2, protowire.BytesType), 0x85, 0x00) // length 5 in two bytes
	overlong = append(overlong, "hello"...)
	stderr := marshal(t, &sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Stderr{Stderr: []byte("oops")}})
	started := marshal(t, &sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Started{Started: &sbxv1.ExecStarted{Pid: 9}}})
	smuggled := append(marshal(t, &sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Stdout{Stdout: []byte("x")}}),
		marshal(t, &sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Exited{Exited: &sbxv1.ExecExited{ExitCode: 4}}})...)
	answer := func(w *execframe.Writer) {
		for _, p := range [][]byte{started, overlong, stderr, smuggled} {
			if err := w.WriteFrame(execframe.FrameOutput, p); err != nil {
				t.Error(err)
			}
		}
	}
	got := make(chan *sbxv1.ExecInput, 1)
	c := New(nil, WithExecDial(scriptedAgent(t, answer, 0, got)))
	defer c.Close()
	st, err := c.ExecOnce(context.Background(), &sbxv1.ExecRequest{Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ds, ok := st.(DataStream)
	if !ok {
		t.Fatalf("the framed stream (%T) is not a DataStream", st)
	}
	type event struct {
		data []byte
		msg  *sbxv1.ExecOutput
	}
	var events []event
	for {
		data, _, ok := ds.ReceiveData()
		if !ok {
			break
		}
		if data != nil {
			events = append(events, event{data: bytes.Clone(data)})
			continue
		}
		events = append(events, event{msg: st.Msg()})
	}
	if err := st.Err(); err != nil {
		t.Fatalf("stream ended with %v, want nil after exited", err)
	}
	if len(events) != 4 {
		t.Fatalf("got %d events, want 4 (started, two data, exited)", len(events))
	}
	if m := events[0].msg; m.GetStarted().GetPid() != 9 {
		t.Errorf("event 0: got %v, want started pid 9, decoded", m)
	}
	for i, want := range [][]byte{overlong, stderr} {
		if !bytes.Equal(events[i+1].data, want) {
			t.Errorf("event %d: got payload %x, want %x as the agent sent it", i+1, events[i+1].data, want)
		}
	}
	if m := events[3].msg; m.GetExited().GetExitCode() != 4 {
		t.Errorf("event 3: got %v, want the smuggled exited (code 4) decoded", m)
	}
}

// TestExecInteractiveFramed: an interactive command's input goes to the
// agent as frames on the same transport, after the start frame.
func TestExecInteractiveFramed(t *testing.T) {
	answer := func(w *execframe.Writer) {
		_ = w.Write(execframe.FrameOutput, &sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Exited{Exited: &sbxv1.ExecExited{}}})
	}
	got := make(chan *sbxv1.ExecInput, 3)
	c := New(nil, WithExecDial(scriptedAgent(t, answer, 2, got)))
	defer c.Close()
	ic, err := c.ExecInteractive(context.Background(), &sbxv1.ExecRequest{Argv: []string{"cat"}, StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ic.Close()
	for _, in := range []*sbxv1.ExecInput{
		{Event: &sbxv1.ExecInput_Stdin{Stdin: []byte("abc")}},
		{Event: &sbxv1.ExecInput_StdinClose{StdinClose: true}},
	} {
		if err := ic.Send(in); err != nil {
			t.Fatal(err)
		}
	}
	if err := ic.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if first := <-got; first.GetStart().GetArgv()[0] != "cat" {
		t.Errorf("first frame: got %v, want the start", first)
	}
	if in := <-got; string(in.GetStdin()) != "abc" {
		t.Errorf("second frame: got %v, want stdin abc", in)
	}
	if in := <-got; !in.GetStdinClose() {
		t.Errorf("third frame: got %v, want stdin_close", in)
	}
	if !ic.Receive() || ic.Msg().GetExited() == nil {
		t.Fatalf("got %v, %v; want exited", ic.Msg(), ic.Err())
	}
}

// TestFramedErrorFrame: the agent's error frame ends the stream with its
// code, on both receive paths.
func TestFramedErrorFrame(t *testing.T) {
	for _, undecoded := range []bool{false, true} {
		answer := func(w *execframe.Writer) { _ = w.WriteError(uint32(connect.CodeInvalidArgument), "no such user") }
		got := make(chan *sbxv1.ExecInput, 1)
		c := New(nil, WithExecDial(scriptedAgent(t, answer, 0, got)))
		defer c.Close()
		st, err := c.ExecOnce(context.Background(), &sbxv1.ExecRequest{Argv: []string{"true"}})
		if err != nil {
			t.Fatal(err)
		}
		var ok bool
		if undecoded {
			_, _, ok = st.(DataStream).ReceiveData()
		} else {
			ok = st.Receive()
		}
		var ce *connect.Error
		if ok || !errors.As(st.Err(), &ce) || ce.Code() != connect.CodeInvalidArgument {
			t.Errorf("undecoded=%v: got ok=%v, %v; want an InvalidArgument error", undecoded, ok, st.Err())
		}
		st.Close()
	}
}

// oldAgent answers Hello with protocol 4 (an agent from before framed
// execs on the API endpoint) and refuses Exec with a code of its own.
type oldAgent struct {
	agentv1connect.UnimplementedAgentServiceHandler
}

func (oldAgent) Hello(context.Context, *connect.Request[agentv1.HelloRequest]) (*connect.Response[agentv1.HelloResponse], error) {
	return connect.NewResponse(&agentv1.HelloResponse{ProtocolVersion: 4}), nil
}

func (oldAgent) Exec(context.Context, *connect.BidiStream[sbxv1.ExecInput, sbxv1.ExecOutput]) error {
	return connect.NewError(connect.CodeDataLoss, errors.New("old agent's Exec RPC"))
}

// TestOldAgentGetsExecRPC: a box without an exec socket whose agent says
// protocol 4 at Hello is driven through the Exec RPC (both ways of
// starting a command); nothing framed is sent to its API endpoint, which
// would not understand it.
func TestOldAgentGetsExecRPC(t *testing.T) {
	path := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	_, h := agentv1connect.NewAgentServiceHandler(oldAgent{})
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{Handler: h, Protocols: &protos}
	go srv.Serve(ln) //nolint:errcheck
	defer srv.Close()
	var framed atomic.Int32
	c := New(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "unix", path)
		if err != nil {
			return nil, err
		}
		return &firstByte{Conn: nc, framed: &framed}, nil
	}, WithExecDial(func(context.Context) (net.Conn, error) {
		return nil, fmt.Errorf("no exec socket: %w", errors.ErrUnsupported)
	}))
	defer c.Close()
	ctx := context.Background()
	start := &sbxv1.ExecRequest{Argv: []string{"true"}}
	st, err := c.ExecOnce(ctx, start)
	if err == nil {
		if st.Receive() {
			t.Errorf("ExecOnce: got %v, want the RPC's error", st.Msg())
		}
		err = st.Err()
		st.Close()
	}
	if connect.CodeOf(err) != connect.CodeDataLoss {
		t.Errorf("ExecOnce: got %v, want the old agent's Exec RPC answer (data_loss)", err)
	}
	ic, err := c.ExecInteractive(ctx, start)
	if err == nil {
		if ic.Receive() {
			t.Errorf("ExecInteractive: got %v, want the RPC's error", ic.Msg())
		}
		err = ic.Err()
		ic.Close()
	}
	if connect.CodeOf(err) != connect.CodeDataLoss {
		t.Errorf("ExecInteractive: got %v, want the old agent's Exec RPC answer (data_loss)", err)
	}
	if n := framed.Load(); n != 0 {
		t.Errorf("%d framed connections to an agent of protocol 4, want 0", n)
	}
}

// firstByte counts connections whose first byte written starts a framed
// exec.
type firstByte struct {
	net.Conn
	once   sync.Once
	framed *atomic.Int32
}

func (c *firstByte) Write(p []byte) (int, error) {
	if len(p) > 0 {
		c.once.Do(func() {
			if p[0] == execframe.FrameInput {
				c.framed.Add(1)
			}
		})
	}
	return c.Conn.Write(p)
}
