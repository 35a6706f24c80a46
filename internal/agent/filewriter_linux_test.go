package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestSpliceToFile checks the helper's copy from its data pipe: splice(2)
// into a file, and read/write into one opened O_APPEND (which splice
// refuses), each keeping what the file held and adding every byte once.
func TestSpliceToFile(t *testing.T) {
	for _, tc := range []struct {
		name   string
		flags  int
		before string
		size   int
	}{
		{"empty", os.O_WRONLY, "", 0},
		{"one byte", os.O_WRONLY, "", 1},
		{"past a pipe's worth", os.O_WRONLY, "", 3*bigPipeBytes + 17},
		{"append", os.O_WRONLY | os.O_APPEND, "old\n", 2*bigPipeBytes + 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "f")
			if err := os.WriteFile(p, []byte(tc.before), 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(p, tc.flags, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			data := make([]byte, tc.size)
			rand.Read(data)
			var fds [2]int
			if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
				t.Fatal(err)
			}
			go func() {
				defer unix.Close(fds[1])
				for off := 0; off < len(data); {
					k, err := unix.Write(fds[1], data[off:])
					if err != nil {
						return
					}
					off += k
				}
			}()
			n, err := spliceToFile(int(f.Fd()), fds[0])
			unix.Close(fds[0])
			if err != nil || n != int64(tc.size) {
				t.Fatalf("spliceToFile = %d, %v; want %d, nil", n, err, tc.size)
			}
			got, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if want := append([]byte(tc.before), data...); !bytes.Equal(got, want) {
				t.Fatalf("file holds %d bytes, want %d (the old content and the data)", len(got), len(want))
			}
		})
	}
}

// TestGrowPipeBudget checks that at most bigPipes data pipes are grown at
// once (their pages are the agent's) and that closing one frees its place.
func TestGrowPipeBudget(t *testing.T) {
	var pipes [][2]int
	defer func() {
		for _, p := range pipes {
			unix.Close(p[0])
			unix.Close(p[1])
		}
	}()
	var grown []int
	for i := range bigPipes + 2 {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		pipes = append(pipes, p)
		big := growPipe(p[1])
		size, err := unix.FcntlInt(uintptr(p[1]), unix.F_GETPIPE_SZ, 0)
		if err != nil {
			t.Fatal(err)
		}
		if want := i < bigPipes; big != want || (size == bigPipeBytes) != want {
			t.Fatalf("pipe %d: grown %v, size %d; want grown %v (%d big pipes at most)", i, big, size, want, bigPipes)
		}
		if big {
			grown = append(grown, i)
		}
	}
	bigPipesInUse.Add(-1) // what helperSink.close does for one of them
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	pipes = append(pipes, p)
	if !growPipe(p[1]) {
		t.Fatalf("a pipe after one was given back: not grown, want grown")
	}
	bigPipesInUse.Add(-int32(len(grown)))
}

// TestHelperSlowToTakeRequest: a helper that takes a request late but is
// not stopped (a loaded host) is waited for, and the write goes through;
// one found stopped is dropped (errHelperGone) so a new one can be started.
// Under 64 load clients at a load average of 100 the helper took more than
// fileWriterAck and every such write failed.
func TestHelperSlowToTakeRequest(t *testing.T) {
	old := fileWriterAck
	fileWriterAck = 20 * time.Millisecond
	defer func() { fileWriterAck = old }()
	for _, tc := range []struct {
		name    string
		stopped bool
		wantErr error
	}{
		{"slow, running", false, nil},
		{"stopped", true, errHelperGone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, 0)
			if err != nil {
				t.Fatal(err)
			}
			ctl := os.NewFile(uintptr(fds[0]), "ctl")
			defer ctl.Close()
			defer unix.Close(fds[1])
			unix.SetNonblock(fds[1], false)
			// The helper: takes the request only after ten ack periods.
			delay := 10 * fileWriterAck
			go func() {
				buf, oob := make([]byte, 1), make([]byte, unix.CmsgSpace(3*4))
				_, oobn, _, _, err := unix.Recvmsg(fds[1], buf, oob, unix.MSG_CMSG_CLOEXEC)
				if err != nil {
					return
				}
				msgs, _ := unix.ParseSocketControlMessage(oob[:oobn])
				got, _ := unix.ParseUnixRights(&msgs[0])
				time.Sleep(delay) // the slowness under test, not a wait for a condition
				copyForAgent(got[0], got[1], got[2])
			}()
			p := filepath.Join(t.TempDir(), "f")
			dst, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			s, err := newHelperSink(ctx, ctl, dst, func() bool { return tc.stopped })
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("newHelperSink: %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			s.done = func(bool) {}
			if _, err := s.Write([]byte("data")); err != nil {
				t.Fatal(err)
			}
			if n, err := s.finish(); err != nil || n != 4 {
				t.Fatalf("finish = %d, %v; want 4, nil", n, err)
			}
			if got, _ := os.ReadFile(p); string(got) != "data" {
				t.Fatalf("file holds %q, want \"data\"", got)
			}
		})
	}
}

// TestProcessStopped reads the state of a real process: running, stopped by
// SIGSTOP, and gone.
func TestProcessStopped(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer cmd.Process.Kill()
	if processStopped(pid) {
		t.Fatalf("sleeping process: stopped, want not")
	}
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The stop is delivered asynchronously: wait for the state to say so.
	deadline := time.Now().Add(10 * time.Second)
	for !processStopped(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("SIGSTOPped process: not stopped after 10s, want stopped")
		}
		time.Sleep(time.Millisecond)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if !processStopped(pid) {
		t.Fatalf("reaped process: not stopped, want stopped (gone)")
	}
}
