package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/splice"
)

// FileWriterArg is argv[1] of the agent binary run as the file-writer helper
// (cmd/sbx-agent calls FileWriterHelper).
const FileWriterArg = "sbx-file-writer"

// fileWriterIdle is how long the helper is kept with no write under way.
const fileWriterIdle = 10 * time.Second

// fileWriterAck is how often a write waiting for the helper to take its
// request looks at the helper: user code can stop it (SIGSTOP, or a
// tracer's stop) as well as kill it, and a stopped helper never answers. A
// helper found stopped is dropped and the write goes to a new one; one that
// is only slow (a loaded host: seen under 64 clients at a load average of
// 100, where 5 s did not suffice) is waited for as long as the write's
// context allows.
var fileWriterAck = 5 * time.Second

// fileWriter writes the data of files written through the agent's file API
// (WriteFile, UploadTar) from a helper process that lives in the box's user
// cgroups, so the pages those files take (the box's disk is a tmpfs, charged
// to memory) are charged to user code's side, never to the agent's reserve.
// Memory is charged to the process whose mm allocates it, not to the thread:
// the spawner's thread, which sits in the user cgroups, would not do. An
// upload that fills the disk thus meets the user cgroup's limit, where the
// OOM killer chooses among user processes, and cannot push the box's own
// limit (where the agent is a candidate) over.
//
// The agent still resolves and opens every file itself (boxfs, no symlink
// followed); the helper only copies: per write it is sent, over a
// SOCK_SEQPACKET socket, the open file, the read end of a pipe the agent
// feeds and the write end of a pipe for its answer: one byte once it took
// the request (a helper killed with a request queued is found out there,
// before any data is sent, and the write goes to a new one), then 16 bytes
// (bytes written, errno). The helper is user code's peer (same uid, killable, traceable), so
// the agent trusts nothing from it but that answer, takes no fd from it and
// checks the count against what it sent. It is started on the first write,
// forked by the spawner, and told to exit (its socket closed) after
// fileWriterIdle with nothing under way. If it cannot start (the user pids
// are full) the write fails: writing from the agent would charge its side.
type fileWriter struct {
	// start forks the helper with its end of the socket as fd 3 and
	// returns its pid.
	start func(sock int) (int, error)

	mu sync.Mutex
	// The fields below are guarded by mu.
	ctl      *os.File // the agent's end of the helper's socket; nil: none
	pid      int      // the helper's
	inflight int
	idle     *time.Timer
}

// fileSink is where one file's data goes: straight into the file when the
// agent has no user cgroups (w is nil), else through the helper.
type fileSink interface {
	io.Writer
	// finish ends the data and returns how many bytes are in the file.
	finish() (int64, error)
	// abort gives up (the caller removes the file).
	abort()
	// copyFrom writes exactly n bytes of src, spliced when src is a
	// descriptor (a raw file connection).
	copyFrom(src io.Reader, n int64) (int64, error)
}

// sink returns where the data for dst goes. ctx bounds the helper's work.
func (w *fileWriter) sink(ctx context.Context, dst *os.File) (fileSink, error) {
	if w == nil {
		return &directSink{f: dst}, nil
	}
	// A helper that died while idle (user code killed it) is found out by
	// the hand-over failing: then once more with a new one.
	for attempt := 0; ; attempt++ {
		ctl, pid, err := w.acquire()
		if err != nil {
			return nil, err
		}
		s, err := newHelperSink(ctx, ctl, dst, func() bool { return processStopped(pid) })
		if err != nil {
			w.release(ctl, true)
			if attempt == 0 && errors.Is(err, errHelperGone) {
				continue
			}
			return nil, err
		}
		s.done = func(broken bool) { w.release(ctl, broken) }
		return s, nil
	}
}

// errHelperGone marks a hand-over to a helper that is no longer there.
var errHelperGone = errors.New("the file writer is gone")

// acquire returns the helper's socket and pid, starting the helper if none
// runs, and counts a write under way.
func (w *fileWriter) acquire() (*os.File, int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.idle != nil {
		w.idle.Stop()
		w.idle = nil
	}
	if w.ctl == nil {
		// Non-blocking: a helper that stopped reading fills the socket, and
		// a send must then fail rather than wait for it (newHelperSink).
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
		if err != nil {
			return nil, 0, fmt.Errorf("file writer: socketpair: %w", err)
		}
		// The helper's end blocks (its reads wait for requests).
		pid := 0
		err = unix.SetNonblock(fds[1], false)
		if err == nil {
			pid, err = w.start(fds[1])
		}
		unix.Close(fds[1])
		if err != nil {
			unix.Close(fds[0])
			return nil, 0, fmt.Errorf("starting the file writer in the box's user cgroup: %w", err)
		}
		w.ctl, w.pid = os.NewFile(uintptr(fds[0]), "file-writer"), pid
	}
	w.inflight++
	return w.ctl, w.pid, nil
}

// processStopped reports whether pid is stopped (by a signal or a tracer)
// or gone: a helper that will not take a request. One that runs, sleeps
// or waits on I/O is not.
func processStopped(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command name's closing parenthesis.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return true
	}
	switch b[i+2] {
	case 'T', 't', 'Z', 'X', 'x':
		return true
	}
	return false
}

// release ends a write on ctl; broken drops the helper (it died or lied),
// so the next write starts another. With nothing under way the helper is
// told to exit after fileWriterIdle.
func (w *fileWriter) release(ctl *os.File, broken bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.inflight--
	if broken && w.ctl == ctl {
		w.ctl.Close()
		w.ctl = nil
	}
	if w.inflight == 0 && w.ctl != nil {
		w.idle = time.AfterFunc(fileWriterIdle, func() {
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.inflight == 0 && w.ctl != nil && w.idle != nil {
				w.ctl.Close() // the helper reads EOF and exits
				w.ctl, w.idle = nil, nil
			}
		})
	}
}

// directSink writes into the file from the agent.
type directSink struct {
	f *os.File
	n int64
}

func (s *directSink) Write(p []byte) (int, error) {
	k, err := s.f.Write(p)
	s.n += int64(k)
	return k, err
}
func (s *directSink) finish() (int64, error) { return s.n, nil }

func (s *directSink) copyFrom(src io.Reader, n int64) (int64, error) {
	var k int64
	var err error
	// splice(2) refuses a file opened O_APPEND.
	if fl, ferr := unix.FcntlInt(s.f.Fd(), unix.F_GETFL, 0); ferr == nil && fl&unix.O_APPEND == 0 {
		size, done := bigPipeSize()
		k, err = splice.Copy(s.f, src, n, size)
		done()
	} else {
		k, err = io.CopyN(s.f, src, n)
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
	}
	s.n += k
	return k, err
}
func (s *directSink) abort() {}

// helperSink feeds one file's data to the helper.
type helperSink struct {
	data  *os.File // write end of the data pipe (pollable)
	reply *os.File // read end of the answer pipe (pollable)
	sent  int64
	stop  func() bool
	done  func(broken bool)
	// dead is set once a write found the helper gone: abort then drops it.
	dead bool
	// bigPipe says the data pipe holds one of the bigPipes (given back
	// at close).
	bigPipe bool
}

// Pipe sizes. The default pipe (64 KiB) wakes the helper 16 times per MiB,
// and on a busy machine each wake-up waits for a time slice: a 100 MiB
// upload ran at 83 MiB/s through it. A 1 MiB pipe takes the data in the
// messages' own size. Pipe pages are charged to the writer, the agent, so
// at most bigPipes of them are in use at once (the agent's reserve is 32
// MiB at most, and a sandbox may have 64 file calls in flight); the other
// uploads keep the default. A raw file transfer (rawfile_linux.go) also
// splices through a pipe of its own, which takes one of them too when one
// is free: four let two raw uploads at a time run with 1 MiB pipes.
const (
	bigPipeBytes = 1 << 20
	bigPipes     = 4
)

// bigPipesInUse counts the data pipes grown to bigPipeBytes.
var bigPipesInUse atomic.Int32

// bigPipeSize takes one of the bigPipes for a pipe splice.Copy makes (a
// raw file transfer's) and returns its size and how to give it back; 0
// (the default size) when all are taken.
func bigPipeSize() (int, func()) {
	if bigPipesInUse.Add(1) > bigPipes {
		bigPipesInUse.Add(-1)
		return 0, func() {}
	}
	return bigPipeBytes, func() { bigPipesInUse.Add(-1) }
}

// growPipe grows the pipe whose write end is fd to bigPipeBytes if fewer
// than bigPipes are, and reports whether it did.
func growPipe(fd int) bool {
	if bigPipesInUse.Add(1) > bigPipes {
		bigPipesInUse.Add(-1)
		return false
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETPIPE_SZ, bigPipeBytes); err != nil {
		bigPipesInUse.Add(-1)
		return false
	}
	return true
}

// stopped reports whether the helper is stopped or gone (processStopped).
func newHelperSink(ctx context.Context, ctl, dst *os.File, stopped func() bool) (*helperSink, error) {
	var data, reply [2]int
	if err := unix.Pipe2(data[:], unix.O_CLOEXEC); err != nil {
		return nil, os.NewSyscallError("pipe2", err)
	}
	if err := unix.Pipe2(reply[:], unix.O_CLOEXEC); err != nil {
		unix.Close(data[0])
		unix.Close(data[1])
		return nil, os.NewSyscallError("pipe2", err)
	}
	// The helper's ends go to it and are closed here once sent.
	defer unix.Close(data[0])
	defer unix.Close(reply[1])
	unix.SetNonblock(data[1], true)
	unix.SetNonblock(reply[0], true)
	s := &helperSink{data: os.NewFile(uintptr(data[1]), "file-data"), reply: os.NewFile(uintptr(reply[0]), "file-reply")}
	s.bigPipe = growPipe(data[1])
	dfd, err := dst.SyscallConn()
	if err != nil {
		s.close()
		return nil, err
	}
	// ctl.Fd() would make the socket blocking again: send through its
	// RawConn, which leaves it as it is.
	cc, err := ctl.SyscallConn()
	if err != nil {
		s.close()
		return nil, err
	}
	var serr error
	err = dfd.Control(func(fd uintptr) {
		rights := unix.UnixRights(int(fd), data[0], reply[1])
		if cerr := cc.Control(func(c uintptr) { serr = unix.Sendmsg(int(c), []byte{1}, rights, nil, 0) }); cerr != nil {
			serr = cerr
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		s.close()
		switch {
		case errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED):
			err = fmt.Errorf("%w (%w)", errHelperGone, err)
		case errors.Is(err, syscall.EAGAIN):
			err = fmt.Errorf("%w (it takes no more requests: stopped by user code?)", errHelperGone)
		}
		return nil, fmt.Errorf("handing a file to the file writer: %w", err)
	}
	s.stop = context.AfterFunc(ctx, func() {
		past := time.Unix(1, 0)
		_ = s.data.SetWriteDeadline(past)
		_ = s.reply.SetReadDeadline(past)
	})
	// The helper says it took the request before any data goes: one that
	// died before (killed a moment ago, the request still queued to its
	// socket) closes the answer pipe unread, and the caller retries with
	// a new helper instead of failing a write no data was lost to.
	// A helper that has not taken it after fileWriterAck and is found
	// stopped (by user code) is dropped the same way; a slow one is waited
	// for.
	var ack [1]byte
	for {
		_ = s.reply.SetReadDeadline(time.Now().Add(fileWriterAck))
		_, err := io.ReadFull(s.reply, ack[:])
		if err == nil {
			break
		}
		if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil && !stopped() {
			continue
		}
		s.close()
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			err = errHelperGone
		case errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil:
			err = fmt.Errorf("%w (it has not taken the request after %v and is stopped: by user code?)", errHelperGone, fileWriterAck)
		}
		return nil, fmt.Errorf("handing a file to the file writer: %w", err)
	}
	_ = s.reply.SetReadDeadline(time.Time{})
	if ctx.Err() != nil { // cancelled meanwhile: its deadline was just undone
		s.close()
		return nil, ctx.Err()
	}
	return s, nil
}

func (s *helperSink) Write(p []byte) (int, error) {
	k, err := s.data.Write(p)
	s.sent += int64(k)
	if err != nil {
		s.dead = errors.Is(err, syscall.EPIPE)
		return k, fmt.Errorf("file writer: %w", s.why(err))
	}
	return k, nil
}

// copyFrom splices n bytes of src into the helper's data pipe. A helper
// that stopped reading because its write failed (the disk is full) has
// answered with the errno by then: that is the error, not the pipe's.
func (s *helperSink) copyFrom(src io.Reader, n int64) (int64, error) {
	size, done := bigPipeSize()
	k, err := splice.Copy(s.data, src, n, size)
	done()
	s.sent += k
	if err == nil {
		return k, nil
	}
	if errors.Is(err, syscall.EPIPE) {
		_ = s.reply.SetReadDeadline(time.Now().Add(time.Second))
		var ans [16]byte
		if _, rerr := io.ReadFull(s.reply, ans[:]); rerr == nil {
			if errno := syscall.Errno(binary.LittleEndian.Uint64(ans[8:])); errno != 0 {
				return k, errno
			}
		}
		s.dead = true
		return k, fmt.Errorf("file writer: %w", s.why(err))
	}
	return k, err
}

// why explains a failed pipe write or read: the helper gone (user code
// killed it, or the user cgroup's OOM killer chose it) or its answer.
func (s *helperSink) why(err error) error {
	if errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return errors.New("the helper writing the file in the box's user cgroup died (killed by user code or by the OOM killer)")
	}
	return err
}

func (s *helperSink) finish() (int64, error) {
	defer s.close()
	if err := s.data.Close(); err != nil {
		s.done(true)
		return 0, err
	}
	var ans [16]byte
	if _, err := io.ReadFull(s.reply, ans[:]); err != nil {
		s.done(true)
		return 0, fmt.Errorf("file writer: %w", s.why(err))
	}
	n := int64(binary.LittleEndian.Uint64(ans[:8]))
	errno := syscall.Errno(binary.LittleEndian.Uint64(ans[8:]))
	if errno != 0 {
		s.done(false)
		return n, errno
	}
	if n != s.sent {
		s.done(true)
		return n, fmt.Errorf("file writer: wrote %d of %d bytes", n, s.sent)
	}
	s.done(false)
	return n, nil
}

func (s *helperSink) abort() {
	s.close()
	s.done(s.dead)
}

func (s *helperSink) close() {
	if s.stop != nil {
		s.stop()
	}
	s.data.Close()
	s.reply.Close()
	if s.bigPipe {
		s.bigPipe = false
		bigPipesInUse.Add(-1)
	}
}

// startFileWriter forks the file-writer helper (this binary, FileWriterArg)
// from the spawner's thread, so it is born in the user cgroups, with sock as
// its fd 3. The reaper collects it.
func (s *Server) startFileWriter(sock int) (int, error) {
	if err := s.lockdown(); err != nil {
		return 0, fmt.Errorf("not starting processes: %w", err)
	}
	null, err := devNull()
	if err != nil {
		return 0, err
	}
	attr := &syscall.ProcAttr{
		Dir:   "/",
		Env:   []string{},
		Files: []uintptr{uintptr(null), uintptr(null), uintptr(null), uintptr(sock)},
		Sys:   &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setsid: true},
	}
	pid, done, err := s.reaper.start(func() (int, error) {
		return s.spawner.fork(func() (int, error) {
			return syscall.ForkExec("/proc/self/exe", []string{"sbx-agent", FileWriterArg}, attr)
		})
	})
	if err != nil {
		return 0, err
	}
	go func() { <-done }() // reaped; the next write starts another
	return pid, nil
}

// FileWriterHelper is the helper's main: for each request on fd 3 it copies
// the data pipe into the file and answers on the answer pipe, until the
// agent closes the socket.
func FileWriterHelper() error {
	const ctl = 3
	// Forked from the agent, it inherits PID 1's oom_score_adj, which user
	// code may have raised to 1000: back to 0 (as low as it may go), so an
	// OOM in the user cgroup chooses by size, like for user processes.
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("0"), 0)
	buf := make([]byte, 1)
	oob := make([]byte, unix.CmsgSpace(3*4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(ctl, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("file writer: %w", err)
		}
		if n == 0 && oobn == 0 {
			return nil // the agent closed the socket
		}
		var fds []int
		if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for _, m := range msgs {
				if r, err := unix.ParseUnixRights(&m); err == nil {
					fds = append(fds, r...)
				}
			}
		}
		if len(fds) != 3 {
			for _, fd := range fds {
				unix.Close(fd)
			}
			continue
		}
		go copyForAgent(fds[0], fds[1], fds[2])
	}
}

// copyForAgent copies the pipe src into the file dst and writes the answer
// (bytes written, errno) on reply.
func copyForAgent(dst, src, reply int) {
	out, in, ans := os.NewFile(uintptr(dst), "file"), os.NewFile(uintptr(src), "data"), os.NewFile(uintptr(reply), "reply")
	defer in.Close()
	defer ans.Close()
	if _, err := ans.Write([]byte{'+'}); err != nil { // taken (see newHelperSink)
		out.Close()
		return
	}
	n, err := spliceToFile(dst, src)
	// The file is closed before the answer goes: the agent removes a
	// failed file once it has the answer, and the space it took comes
	// back only when no descriptor holds it (this helper, in the user
	// cgroups, may wait long for the CPU on a loaded host).
	out.Close()
	var errno syscall.Errno
	if err != nil && !errors.As(err, &errno) {
		errno = syscall.EIO
	}
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], uint64(n))
	binary.LittleEndian.PutUint64(b[8:], uint64(errno))
	_, _ = ans.Write(b[:])
}

// spliceToFile moves the pipe src into the file dst with splice(2): the
// pages go from the pipe into the file's page cache without a copy through
// this process (io.Copy would read them out and write them back, 32 KiB at a
// time). A file splice refuses (one opened O_APPEND: EINVAL) is copied with
// read and write instead.
func spliceToFile(dst, src int) (int64, error) {
	var n int64
	for {
		k, err := unix.Splice(src, nil, dst, nil, bigPipeBytes, unix.SPLICE_F_MOVE|unix.SPLICE_F_MORE)
		if k > 0 {
			n += k
		}
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EINVAL && n == 0:
			return copyFd(dst, src)
		case err != nil:
			return n, err
		case k == 0:
			return n, nil
		}
	}
}

// copyFd copies src into dst with read and write (1 MiB at a time).
func copyFd(dst, src int) (int64, error) {
	buf := make([]byte, bigPipeBytes)
	var n int64
	for {
		k, err := unix.Read(src, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return n, err
		}
		if k == 0 {
			return n, nil
		}
		for off := 0; off < k; {
			w, err := unix.Write(dst, buf[off:k])
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return n, err
			}
			off += w
			n += int64(w)
		}
	}
}
