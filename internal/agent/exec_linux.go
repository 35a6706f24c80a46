package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"connectrpc.com/connect"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"golang.org/x/sys/unix"
)

// keepaliveIdle is how long an exec's output stream may be silent before a
// keepalive event is sent (a variable for tests).
var keepaliveIdle = 10 * time.Second

// startedDelay is how long the started event may wait for company: it goes
// out together with the first output or the exited event (one HTTP/2 write
// instead of two), or on its own once the command has been silent this long.
const startedDelay = 5 * time.Millisecond

const (
	chunkSize = 32 << 10
	// drainTimeout bounds how long output is still read after the process
	// exited, in case a background grandchild holds the pipes open.
	drainTimeout = 200 * time.Millisecond
)

// process is one running exec.
type process struct {
	pid     int // also its process group id
	done    <-chan exitStatus
	started time.Time
	tty     bool

	stdin     *os.File // pipe write end or pty master; nil for /dev/null
	stdinOnce sync.Once
	stdout    *os.File // pipe read end or pty master
	stderr    *os.File // nil with a tty
	exited    atomic.Bool
}

// startError is a command that could not be started; it is reported as an
// exited event with exit code 127 (not found) or 126 (not executable).
type startError struct {
	code int32
	err  error
}

func (e *startError) Error() string { return e.err.Error() }

// Exec runs one command. See sbx.v1.ExecInput and ExecOutput for the
// protocol. A command that cannot be started (not found, not executable, no
// such workdir) gets a single exited event with exit code 127 or 126 and an
// error, and no started event. An unknown user is an InvalidArgument error,
// before anything starts.
func (s *Server) Exec(ctx context.Context, stream *connect.BidiStream[sbxv1.ExecInput, sbxv1.ExecOutput]) error {
	first, err := stream.Receive()
	if errors.Is(err, io.EOF) {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("exec: stream ended before start"))
	}
	if err != nil {
		return fmt.Errorf("receiving exec start: %w", err)
	}
	req := first.GetStart()
	if req == nil {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("first exec message must be start"))
	}
	return s.runExec(ctx, stream, req)
}

// execStream is what an exec talks to after its start message: the Exec
// RPC's stream, or a framed exec connection (fastexec_linux.go).
type execStream interface {
	Receive() (*sbxv1.ExecInput, error)
	Send(*sbxv1.ExecOutput) error
}

// runExec runs the command req and serves it over stream until it exits.
func (s *Server) runExec(ctx context.Context, stream execStream, req *sbxv1.ExecRequest) error {
	if err := validateExec(req); err != nil {
		return err
	}
	p, err := s.start(req)
	if se, ok := errors.AsType[*startError](err); ok {
		return stream.Send(&sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Exited{Exited: &sbxv1.ExecExited{
			ExitCode: se.code,
			Error:    se.Error(),
		}}})
	}
	if ce := new(connect.Error); errors.As(err, &ce) {
		return err
	}
	if err != nil {
		return connect.NewError(connect.CodeInternal, err)
	}
	defer p.close()
	go p.input(stream, req)
	return s.wait(ctx, stream, req, p)
}

// validateExec checks an exec request before anything starts.
func validateExec(req *sbxv1.ExecRequest) error {
	switch {
	case len(req.GetArgv()) > 0 && req.GetShell() != "":
		return connect.NewError(connect.CodeInvalidArgument, errors.New("exec: set only one of argv and shell"))
	case len(req.GetArgv()) == 0 && req.GetShell() == "":
		return connect.NewError(connect.CodeInvalidArgument, errors.New("exec: one of argv and shell is required"))
	case len(req.GetArgv()) > 0 && req.GetArgv()[0] == "":
		return connect.NewError(connect.CodeInvalidArgument, errors.New("exec: argv[0] is empty"))
	}
	for k := range req.GetEnv() {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("exec: invalid env name %q", k))
		}
	}
	return nil
}

// start forks the command described by req.
func (s *Server) start(req *sbxv1.ExecRequest) (*process, error) {
	env, dir, userSpec := s.defaults()
	if req.GetUser() != "" {
		userSpec = req.GetUser()
	}
	user, err := s.lookupUser("exec", userSpec)
	if err != nil {
		return nil, err
	}
	if len(req.GetEnv()) > 0 {
		env = slices.Clone(env)
		for _, k := range slices.Sorted(maps.Keys(req.GetEnv())) {
			env = envSet(env, k, req.GetEnv()[k])
		}
	}
	env = userEnv(env, user)
	if req.GetTty() && envLookup(env, "TERM") == "" {
		env = append(slices.Clip(env), "TERM=xterm-256color")
	}
	if w := req.GetWorkdir(); w != "" {
		dir = resolveIn(dir, w)
	}
	argv := req.GetArgv()
	if req.GetShell() != "" {
		argv = []string{"/bin/sh", "-c", req.GetShell()}
	}
	name := argv[0]
	if !filepath.IsAbs(name) && strings.ContainsRune(name, '/') {
		name = filepath.Join(dir, name)
	}
	path, err := lookPath(name, envLookup(env, "PATH"))
	if err != nil {
		return nil, err
	}
	return s.spawn(path, argv, env, dir, user, req)
}

// spawn starts the resolved command path with argv, env and dir as user
// (nil: root), with the stdio req asks for: a pty, or pipes for stdout and
// stderr and stdin from req (a pipe) or /dev/null.
func (s *Server) spawn(path string, argv, env []string, dir string, user *userInfo, req *sbxv1.ExecRequest) (*process, error) {
	var err error
	p := &process{tty: req.GetTty()}
	var childFDs []int // the child's ends, closed in the parent once it has them
	defer func() {
		for _, fd := range childFDs {
			unix.Close(fd)
		}
	}()
	sys := &syscall.SysProcAttr{Setpgid: true}
	var files []uintptr
	if p.tty {
		master, slave, err := openPTY(req.GetSize())
		if err != nil {
			return nil, err
		}
		defer slave.Close()
		if user != nil {
			// The user owns its terminal, as after a login (programs such as
			// tty, script or ssh reopen it by name). Best effort: the
			// inherited descriptors work either way.
			slave.Chown(int(user.uid), int(user.gid))
			slave.Chmod(0o620)
		}
		p.stdin, p.stdout = master, master
		fd := slave.Fd()
		files = []uintptr{fd, fd, fd}
		sys = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	} else {
		files = make([]uintptr, 3)
		if len(req.GetStdin()) > 0 || req.GetStdinOpen() {
			w, r, err := pipe(false)
			if err != nil {
				return nil, fmt.Errorf("creating stdin pipe: %w", err)
			}
			p.stdin = w
			childFDs = append(childFDs, r)
			files[0] = uintptr(r)
		} else {
			fd, err := devNull()
			if err != nil {
				return nil, fmt.Errorf("opening %s: %w", os.DevNull, err)
			}
			files[0] = uintptr(fd)
		}
		for i, f := range []**os.File{&p.stdout, &p.stderr} {
			r, w, err := pipe(true)
			if err != nil {
				p.close()
				return nil, fmt.Errorf("creating output pipe: %w", err)
			}
			*f = r
			childFDs = append(childFDs, w)
			files[i+1] = uintptr(w)
		}
	}
	sys.Credential = user.credential()
	attr := &syscall.ProcAttr{Dir: dir, Env: env, Files: files, Sys: sys}
	if err := s.lockdown(); err != nil {
		p.close()
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("not starting processes: %w", err))
	}
	p.started = time.Now()
	p.pid, p.done, err = s.reaper.start(func() (int, error) {
		return s.spawner.fork(func() (int, error) { return syscall.ForkExec(path, argv, attr) })
	})
	if err != nil {
		p.close()
		if derr := checkWorkdir(dir, user); derr != nil {
			return nil, derr
		}
		return nil, execError(path, user, err)
	}
	return p, nil
}

// pipe returns a pipe whose end in the agent (the read end if parentReads)
// is a pollable *os.File and whose child's end is a plain blocking fd. Both
// are close-on-exec; ForkExec dup2s the child's end into place.
func pipe(parentReads bool) (parent *os.File, child int, err error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		return nil, -1, os.NewSyscallError("pipe2", err)
	}
	pfd, cfd, name := fds[0], fds[1], "|0"
	if !parentReads {
		pfd, cfd, name = fds[1], fds[0], "|1"
	}
	if err := unix.SetNonblock(pfd, true); err != nil {
		unix.Close(pfd)
		unix.Close(cfd)
		return nil, -1, os.NewSyscallError("fcntl", err)
	}
	// A non-blocking fd makes os.NewFile register it with the poller.
	return os.NewFile(uintptr(pfd), name), cfd, nil
}

// devNullFD is the agent's one /dev/null (close-on-exec), every exec's stdin
// when it has none: reads give EOF whatever the shared offset. 0: not open yet.
var devNullFD atomic.Int32

func devNull() (int, error) {
	if fd := devNullFD.Load(); fd > 0 {
		return int(fd), nil
	}
	fd, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if !devNullFD.CompareAndSwap(0, int32(fd)) {
		unix.Close(fd)
	}
	return int(devNullFD.Load()), nil
}

// rootCredential makes a child of the default user (root) set its uids to
// 0 again: the agent's saved uid is not 0 (see harden), and no user process
// should carry it. One setgid and one setuid in the child, no setgroups. Nil
// (inherit) when the agent is not root (its tests, run unprivileged).
var rootCredential = func() *syscall.Credential {
	if os.Geteuid() != 0 {
		return nil
	}
	return &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true}
}()

// credential is what the child runs as: root for the default user. It makes
// ForkExec call setgid and setuid (and setgroups, for other users) in the
// child; a non-zero uid loses every capability there.
func (u *userInfo) credential() *syscall.Credential {
	if u == nil {
		return rootCredential
	}
	return &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}
}

// checkWorkdir explains a failed start by a missing or unusable working
// directory; nil if dir is a directory the user may enter. It only runs after
// a failure, so the fast path does not stat the directory.
func checkWorkdir(dir string, user *userInfo) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return &startError{code: 127, err: fmt.Errorf("workdir %s: %w", dir, err)}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return &startError{code: 126, err: fmt.Errorf("workdir %s: not a directory", dir)}
	}
	if !canSearch(dir, user, statOwner) {
		return &startError{code: 126, err: fmt.Errorf("workdir %s: permission denied for user %q", dir, user.spec)}
	}
	return nil
}

// statOwner returns the owner and permission bits of path.
func statOwner(path string) (uid, gid, mode uint32, err error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, 0, 0, err
	}
	return st.Uid, st.Gid, st.Mode & 0o7777, nil
}

// execError classifies a fork/exec failure.
func execError(path string, user *userInfo, err error) error {
	switch {
	case errors.Is(err, unix.ENOENT):
		return &startError{code: 127, err: fmt.Errorf("%s: %w", path, err)}
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.ENOEXEC), errors.Is(err, unix.EPERM), errors.Is(err, unix.EISDIR):
		return &startError{code: 126, err: fmt.Errorf("%s: %w", path, err)}
	}
	if errors.Is(err, unix.EINVAL) { // e.g. a NUL byte in argv or env
		if user != nil {
			// Or setuid/setgid/setgroups with an id the sandbox's user
			// namespace does not map.
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("exec %s as user %q (uid %d, gid %d): %w (is the id mapped in the sandbox?)", path, user.spec, user.uid, user.gid, err))
		}
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("exec %s: %w", path, err))
	}
	return fmt.Errorf("starting %s: %w", path, err)
}

// lookPath finds name in the colon-separated path list, like a shell. A name
// with a slash is returned as is: execve itself reports a missing or
// non-executable file, classified by execError, which saves a stat.
func lookPath(name, pathList string) (string, error) {
	if strings.ContainsRune(name, '/') {
		return name, nil
	}
	var denied error
	var st unix.Stat_t
	for dir := range strings.SplitSeq(pathList, ":") {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if err := unix.Stat(p, &st); err != nil {
			if err != unix.ENOENT && err != unix.ENOTDIR && denied == nil {
				denied = &startError{code: 126, err: fmt.Errorf("%s: not executable: %w", p, err)}
			}
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR || st.Mode&0o111 == 0 {
			if denied == nil {
				denied = &startError{code: 126, err: fmt.Errorf("%s: not executable", p)}
			}
			continue
		}
		return p, nil
	}
	if denied != nil {
		return "", denied
	}
	return "", &startError{code: 127, err: fmt.Errorf("%s: command not found", name)}
}

// wait streams output until the process has exited and its output is
// drained, then sends the one exited event. The started event goes out with
// the first other event or after startedDelay, whichever is first.
func (s *Server) wait(ctx context.Context, stream execStream, req *sbxv1.ExecRequest, p *process) error {
	out := make(chan *sbxv1.ExecOutput, 4)
	quit := make(chan struct{})
	defer close(quit)
	readers := 1 // each sends nil on out when done
	go p.read(p.stdout, false, out, quit)
	if p.stderr != nil {
		readers++
		go p.read(p.stderr, true, out, quit)
	}

	// tick is first the started deadline, then the keepalive timer. It is
	// not reset on every send: when it fires early, it is re-armed for the rest.
	tick := time.NewTimer(startedDelay)
	defer tick.Stop()
	var lastSend time.Time
	var timeout <-chan time.Time
	if ms := req.GetTimeoutMs(); ms > 0 {
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	bw := holderFrom(ctx)
	startedSent, last := false, false
	// send sends m, preceded by started if that is still due; both leave in
	// one write. A nil m sends only started. The last message (exited) is
	// not flushed at all: the handler returns right away and net/http then
	// writes it together with the end of the stream.
	send := func(m *sbxv1.ExecOutput) error {
		if !startedSent {
			startedSent = true
			if bw != nil && m != nil {
				bw.setHold(true)
			}
			err := stream.Send(&sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Started{Started: &sbxv1.ExecStarted{Pid: int32(p.pid)}}})
			if bw != nil {
				bw.setHold(last)
			}
			lastSend = time.Now()
			if err != nil || m == nil {
				return err
			}
		}
		lastSend = time.Now()
		return stream.Send(m)
	}
	abort := func(err error) error {
		p.kill()
		if !p.exited.Load() {
			<-p.done
		}
		return err
	}

	done := p.done
	var status exitStatus
	exited, timedOut := false, false
	for !exited || readers > 0 {
		select {
		case m := <-out:
			if m != nil {
				if err := send(m); err != nil {
					return abort(err)
				}
				continue
			}
			if readers--; readers == 0 && !exited {
				// Output ends when the process exits: reap it now rather
				// than wait for SIGCHLD to make its way to the reaper.
				s.reaper.poll(p.pid)
			}
		case status = <-done:
			exited, done = true, nil
			p.exited.Store(true)
			if readers > 0 {
				p.drainSoon()
			}
		case <-timeout:
			timedOut, timeout = true, nil
			p.kill()
		case <-tick.C:
			if !startedSent {
				if err := send(nil); err != nil {
					return abort(err)
				}
				tick.Reset(keepaliveIdle)
				break
			}
			if idle := time.Since(lastSend); idle >= keepaliveIdle {
				if err := send(&sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Keepalive{Keepalive: &sbxv1.ExecKeepalive{}}}); err != nil {
					return abort(err)
				}
				tick.Reset(keepaliveIdle)
			} else {
				tick.Reset(keepaliveIdle - idle)
			}
		case <-ctx.Done():
			return abort(ctx.Err())
		}
	}
	code, sig := exitCode(status.ws)
	ex := &sbxv1.ExecExited{ExitCode: code, Signal: sig, DurationMs: time.Since(p.started).Milliseconds()}
	if timedOut {
		ex.TimedOut, ex.ExitCode = true, 137
	}
	if last = true; bw != nil {
		bw.setHold(true)
	}
	return send(&sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Exited{Exited: ex}})
}

// readBufs holds chunkSize buffers for process.read.
var readBufs = sync.Pool{New: func() any {
	b := make([]byte, chunkSize)
	return &b
}}

// read forwards f's data as stdout or stderr events until EOF, error or the
// drain deadline, then sends nil.
func (p *process) read(f *os.File, stderr bool, out chan<- *sbxv1.ExecOutput, quit <-chan struct{}) {
	bp := readBufs.Get().(*[]byte)
	defer readBufs.Put(bp)
	buf := *bp
	drained := 0
	for {
		n, err := readOrDrain(f, buf, &drained)
		if n > 0 {
			data := slices.Clone(buf[:n])
			var m *sbxv1.ExecOutput
			if stderr {
				m = &sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Stderr{Stderr: data}}
			} else {
				m = &sbxv1.ExecOutput{Event: &sbxv1.ExecOutput_Stdout{Stdout: data}}
			}
			select {
			case out <- m:
			case <-quit:
				return
			}
		}
		if err != nil {
			// io.EOF, EIO from a pty whose slave closed, or the deadline.
			select {
			case out <- nil:
			case <-quit:
			}
			return
		}
	}
}

// input applies the client's stdin, resize and signal events. It runs until
// the client's side of the stream ends (at the latest when Exec returns).
func (p *process) input(stream execStream, req *sbxv1.ExecRequest) {
	p.initialStdin(req)
	for {
		msg, err := stream.Receive()
		if err != nil {
			if errors.Is(err, io.EOF) && req.GetStdinOpen() {
				p.closeStdin()
			}
			return
		}
		p.apply(msg)
	}
}

// initialStdin writes the start request's stdin and closes stdin unless the
// request keeps it open.
func (p *process) initialStdin(req *sbxv1.ExecRequest) {
	if len(req.GetStdin()) > 0 && p.stdin != nil {
		p.stdin.Write(req.GetStdin())
		if !req.GetStdinOpen() {
			p.closeStdin()
		}
	} else if !req.GetStdinOpen() && !p.tty {
		p.closeStdin()
	}
}

// apply applies one stdin, stdin_close, resize or signal event; a start
// event is ignored.
func (p *process) apply(msg *sbxv1.ExecInput) {
	switch ev := msg.GetEvent().(type) {
	case *sbxv1.ExecInput_Stdin:
		if p.stdin != nil && len(ev.Stdin) > 0 {
			p.stdin.Write(ev.Stdin)
		}
	case *sbxv1.ExecInput_StdinClose:
		if ev.StdinClose {
			p.closeStdin()
		}
	case *sbxv1.ExecInput_Resize:
		if p.tty {
			setPTYSize(p.stdout, ev.Resize)
		}
	case *sbxv1.ExecInput_Signal:
		if !p.exited.Load() && ev.Signal > 0 {
			unix.Kill(-p.pid, unix.Signal(ev.Signal))
		}
	}
}

// closeStdin gives the process end-of-file on stdin: closes the pipe, or
// types ^D on a terminal (closing the master would hang the session up).
func (p *process) closeStdin() {
	p.stdinOnce.Do(func() {
		if p.stdin == nil {
			return
		}
		if p.tty {
			p.stdin.Write([]byte{4})
			return
		}
		p.stdin.Close()
	})
}

// kill SIGKILLs the whole process group.
func (p *process) kill() {
	if !p.exited.Load() {
		unix.Kill(-p.pid, unix.SIGKILL)
	}
}

// drainSoon bounds the reads of an exited process's output: a background
// grandchild may hold the pipes open, so what is there is read, but not for
// long.
func (p *process) drainSoon() {
	deadline := time.Now().Add(drainTimeout)
	p.stdout.SetReadDeadline(deadline)
	if p.stderr != nil {
		p.stderr.SetReadDeadline(deadline)
	}
}

// pastDeadline is a read deadline that has passed.
var pastDeadline = time.Unix(1, 0)

// drainMax bounds what one reader takes past its drain deadline: the most a
// pipe holds by default (/proc/sys/fs/pipe-max-size).
const drainMax = 1 << 20

// readOrDrain is f.Read, except that past f's drain deadline it still
// returns what is already in the pipe: Go's poller refuses a read past its
// deadline before trying the read, so a reader the scheduler ran late lost
// output the process had written before it exited (an exec of `echo 42`
// that exits 0 with empty stdout, seen under load). Past the deadline each
// call takes one read that never waits; once the pipe is empty, or
// drainMax bytes were taken past the deadline (a grandchild holding the pipe
// may keep writing), it returns os.ErrDeadlineExceeded. *drained counts
// those bytes for one reader.
func readOrDrain(f *os.File, buf []byte, drained *int) (int, error) {
	n, err := f.Read(buf)
	if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) || *drained >= drainMax {
		return n, err
	}
	rc, serr := f.SyscallConn()
	if serr != nil {
		return 0, err
	}
	// The raw read is refused past the deadline too: lift it for the one
	// read, which never waits (the fd is non-blocking under the poller).
	if f.SetReadDeadline(time.Time{}) != nil {
		return 0, err
	}
	defer f.SetReadDeadline(pastDeadline)
	var rn int
	var rerr error
	if cerr := rc.Read(func(fd uintptr) bool {
		rn, rerr = unix.Read(int(fd), buf)
		return true
	}); cerr != nil || rerr != nil || rn <= 0 {
		return 0, err
	}
	*drained += rn
	return rn, nil
}

// exitedDraining waits for the process to exit, marks it exited and bounds
// the reads of what it left in its pipes (drainSoon).
func (p *process) exitedDraining() exitStatus {
	st := <-p.done
	p.exited.Store(true)
	p.drainSoon()
	return st
}

// close releases the parent's ends of the child's stdio.
func (p *process) close() {
	for _, f := range []*os.File{p.stdin, p.stdout, p.stderr} {
		if f != nil {
			f.Close()
		}
	}
}

// exitCode returns the shell-style exit code and the killing signal.
func exitCode(ws unix.WaitStatus) (code, sig int32) {
	switch {
	case ws.Exited():
		return int32(ws.ExitStatus()), 0
	case ws.Signaled():
		return 128 + int32(ws.Signal()), int32(ws.Signal())
	}
	return -1, 0
}
