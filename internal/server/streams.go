package server

import (
	"context"
	"fmt"
	"log/slog"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/internal/agentconn"
	"github.com/sbxdev/sbx/internal/codeexec"
	"github.com/sbxdev/sbx/internal/connlimit"
	"github.com/sbxdev/sbx/internal/sandbox"
)

// StreamLimits bound the calls on one sandbox's agent that the API relays
// at once: each holds a goroutine or two, an HTTP/2 stream or a socket to
// the agent, and up to a flow-control window of buffered bytes in the
// daemon, so without a bound the clients of one sandbox (or code in it
// holding a scoped token) could spend the daemon's descriptors and memory
// for everyone. Zero fields take the defaults.
type StreamLimits struct {
	// ExecsPerSandbox bounds running commands relayed for one sandbox (the
	// Exec and ExecInteractive RPCs, the exec upgrade, and the Logs and
	// Wait calls on the sandbox's own command, and the ProcessService calls
	// together).
	ExecsPerSandbox int
	// FilesPerSandbox bounds file calls in flight on one sandbox (reads,
	// writes, tars, listings and the other file operations together).
	FilesPerSandbox int
	// BackgroundPerSandbox bounds the background processes (ProcessService)
	// running in one sandbox at once; the sandbox's agent enforces it, as
	// it holds them. Clients connected to or waiting for them count as
	// running commands.
	BackgroundPerSandbox int
	// RelayBytesPerSecond is one sandbox's output relay budget (see
	// relaybudget.go): the output of all its commands (code runs and
	// session commands included) and log followers together, each event
	// counted with RelayFrameCost.
	RelayBytesPerSecond int64
}

// The defaults of StreamLimits.
const (
	DefaultExecsPerSandbox      = 256
	DefaultFilesPerSandbox      = 64
	DefaultBackgroundPerSandbox = 64
	// MaxBackgroundPerSandbox is the agent's own bound on them.
	MaxBackgroundPerSandbox = 1024
)

// Streams opens the agent connections of the API's exec and file calls,
// counted against the sandbox's StreamLimits: the excess is refused with
// ResourceExhausted naming the limit, and neighbours do not notice. One
// Streams is shared by everything that relays such calls (the API handlers
// and the fronts' exec upgrade).
type Streams struct {
	mgr   *sandbox.Manager
	execs *connlimit.Counter[string]
	files *connlimit.Counter[string]
	// background is StreamLimits.BackgroundPerSandbox.
	background int
	relay      *relayBudgets
}

// NewStreams returns Streams over mgr with limits lim; refusals are logged
// on log (nil: slog.Default()) once per burst.
func NewStreams(mgr *sandbox.Manager, lim StreamLimits, log *slog.Logger) *Streams {
	if log == nil {
		log = slog.Default()
	}
	if lim.ExecsPerSandbox <= 0 {
		lim.ExecsPerSandbox = DefaultExecsPerSandbox
	}
	if lim.FilesPerSandbox <= 0 {
		lim.FilesPerSandbox = DefaultFilesPerSandbox
	}
	if lim.BackgroundPerSandbox <= 0 {
		lim.BackgroundPerSandbox = DefaultBackgroundPerSandbox
	}
	if lim.RelayBytesPerSecond <= 0 {
		lim.RelayBytesPerSecond = DefaultRelayBytesPerSecond
	}
	return &Streams{
		mgr:   mgr,
		execs: connlimit.NewCounter[string](lim.ExecsPerSandbox, log, "exec streams per sandbox"),
		files: connlimit.NewCounter[string](lim.FilesPerSandbox, log, "file calls per sandbox"),

		background: min(lim.BackgroundPerSandbox, MaxBackgroundPerSandbox),
		relay:      newRelayBudgets(lim.RelayBytesPerSecond),
	}
}

// exec returns the agent of sandbox ref for one command; release it when
// the command's relay ends.
func (s *Streams) exec(ctx context.Context, ref string) (*agentconn.Conn, func(), error) {
	return s.open(ctx, ref, s.execs, "running commands", "--exec-max-streams")
}

// execRelay is exec for a call that relays the sandbox's output: it also
// returns the sandbox's relay budget, let go with the rest by release.
func (s *Streams) execRelay(ctx context.Context, ref string) (*agentconn.Conn, *relayBudget, func(), error) {
	id, conn, release, err := s.openID(ctx, ref, s.execs, "running commands", "--exec-max-streams")
	if err != nil {
		return nil, nil, nil, err
	}
	rb, done := s.relay.acquire(id)
	return conn, rb, func() { done(); release() }, nil
}

// HoldExec counts one command relayed elsewhere (a code run, a session
// command: internal/codeexec's Limit) against sandbox id's running
// commands, exactly as exec does, and returns spend, which charges its
// output to the sandbox's relay budget as execRelay's relays are charged.
func (s *Streams) HoldExec(ctx context.Context, id string) (spend codeexec.Spend, release func(), err error) {
	done, ok := s.execs.Acquire(id)
	if !ok {
		return nil, nil, s.refused(id, s.execs, "running commands", "--exec-max-streams")
	}
	rb, let := s.relay.acquire(id)
	return rb.spend, func() { let(); done() }, nil
}

// file returns the agent of sandbox ref for one file call.
func (s *Streams) file(ctx context.Context, ref string) (*agentconn.Conn, func(), error) {
	return s.open(ctx, ref, s.files, "file calls in flight", "--file-max-streams")
}

func (s *Streams) open(ctx context.Context, ref string, c *connlimit.Counter[string], what, flag string) (*agentconn.Conn, func(), error) {
	_, conn, release, err := s.openID(ctx, ref, c, what, flag)
	return conn, release, err
}

// openID is open that also returns the sandbox's id.
func (s *Streams) openID(ctx context.Context, ref string, c *connlimit.Counter[string], what, flag string) (string, *agentconn.Conn, func(), error) {
	id, err := s.mgr.RunningID(ctx, ref)
	if err != nil {
		return "", nil, nil, toConnect(err)
	}
	done, ok := c.Acquire(id)
	if !ok {
		return "", nil, nil, s.refused(id, c, what, flag)
	}
	conn, release, err := s.mgr.Agent(ctx, id)
	if err != nil {
		done()
		return "", nil, nil, toConnect(err)
	}
	return id, conn, func() { release(); done() }, nil
}

func (s *Streams) refused(id string, c *connlimit.Counter[string], what, flag string) error {
	return connect.NewError(connect.CodeResourceExhausted,
		fmt.Errorf("sandbox %s has %d %s, the most allowed (sbx serve %s): try again when one ends", id, c.Max(), what, flag))
}
