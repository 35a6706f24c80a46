package agent

import (
	"cmp"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// pumped is a started process whose output is read by one pump per stream
// (stdout, and stderr unless a pty merges them) into a store of its
// owner's, and whose exit is recorded once the process has exited and the
// pumps have read its last bytes. The processes that outlive their client
// embed it: entryProc (the entrypoint, background processes: a logRing)
// and detachedProc (sessions and contexts: an outBuf with back-pressure).
type pumped struct {
	p *process
	// timedOut is set before a timeout kills the process (background
	// processes); the exit records it.
	timedOut atomic.Bool
	// readSize is each pump's read buffer; 0: chunkSize.
	readSize int

	// mu guards the fields below and the embedder's store; cond (on mu)
	// is broadcast on every change.
	mu      sync.Mutex
	cond    *sync.Cond
	readers int               // output pumps still reading
	exit    *sbxv1.ExecExited // set once the process exited and its output is all read
}

// init readies u for process p, before any pump runs.
func (u *pumped) init(p *process, readSize int) {
	u.p, u.readSize = p, readSize
	u.cond = sync.NewCond(&u.mu)
	u.readers = 1
	if p.stderr != nil {
		u.readers++
	}
}

// startPumps starts the pumps; put stores one read's data (which it now
// owns) with u.mu held, and may wait on u.cond for room.
func (u *pumped) startPumps(s *Server, put func(stderr bool, data []byte)) {
	go u.pump(s, u.p.stdout, false, put)
	if u.p.stderr != nil {
		go u.pump(s, u.p.stderr, true, put)
	}
}

// pump moves f's output to put until EOF, error or the drain deadline;
// the last pump to end has the reaper look at the process at once.
func (u *pumped) pump(s *Server, f *os.File, stderr bool, put func(stderr bool, data []byte)) {
	buf := make([]byte, cmp.Or(u.readSize, chunkSize))
	drained := 0
	for {
		n, err := readOrDrain(f, buf, &drained)
		if n > 0 {
			data := slices.Clone(buf[:n])
			u.mu.Lock()
			put(stderr, data)
			u.cond.Broadcast()
			u.mu.Unlock()
		}
		if err != nil {
			u.mu.Lock()
			u.readers--
			last := u.readers == 0
			u.cond.Broadcast()
			u.mu.Unlock()
			if last && !u.p.exited.Load() {
				s.reaper.poll(u.p.pid)
			}
			return
		}
	}
}

// watch waits for the process to exit and its output to be read, then
// records the exit status and releases the stdio.
func (u *pumped) watch() {
	st := u.p.exitedDraining()
	u.mu.Lock()
	for u.readers > 0 {
		u.cond.Wait()
	}
	code, sig := exitCode(st.ws)
	u.exit = &sbxv1.ExecExited{ExitCode: code, Signal: sig, DurationMs: time.Since(u.p.started).Milliseconds(), TimedOut: u.timedOut.Load()}
	u.cond.Broadcast()
	u.mu.Unlock()
	u.p.close()
}
