//go:build linux

package pidwatch

import (
	"context"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// start runs sh -c script as a child of the test and returns its pid and
// start time.
func start(t *testing.T, script string) (int, uint64) {
	t.Helper()
	cmd := exec.Command("sh", "-c", script)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	st := StartTime(pid)
	if st == 0 {
		t.Fatalf("start time of %d: 0", pid)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = Reap(pid, 5*time.Second) })
	return pid, st
}

func recv(t *testing.T, ch <-chan Status) Status {
	t.Helper()
	select {
	case st, ok := <-ch:
		if !ok {
			t.Fatal("channel closed without a status")
		}
		return st
	case <-time.After(10 * time.Second):
		t.Fatal("no status 10s after the exit")
	}
	return Status{}
}

func id(s Status) Status { return s }

func TestWatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		signal syscall.Signal // sent once the watch is parked (0: none)
		want   string
	}{
		{"exit status", "sleep 0.2; exit 3", 0, "exited with status 3"},
		{"SIGKILL", "exec sleep 60", syscall.SIGKILL, "killed by signal SIGKILL"},
		{"SIGTERM", "exec sleep 60", syscall.SIGTERM, "killed by signal SIGTERM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pid, st := start(t, tc.script)
			ch, err := Watch(context.Background(), pid, st, id)
			if err != nil {
				t.Fatal(err)
			}
			if tc.signal != 0 {
				select {
				case got := <-ch:
					t.Fatalf("status %v before the process was killed", got)
				default:
				}
				_ = syscall.Kill(pid, tc.signal)
			}
			if got := recv(t, ch); got.String() != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			// WNOWAIT left the zombie: its status is still ours to reap.
			if !GoneOrZombie(pid) {
				t.Errorf("pid %d not a zombie after its exit", pid)
			}
			if err := ReapIfOurs(pid, st, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			if StartTime(pid) == st {
				t.Errorf("pid %d still there after ReapIfOurs", pid)
			}
		})
	}
}

// TestWatchExitedAndReused: a process that exited before the watch is
// reported at once; a pid now held by another process (start time differs)
// is not mistaken for it, and ReapIfOurs leaves that process alone.
func TestWatchExitedAndReused(t *testing.T) {
	pid, st := start(t, "exit 7")
	for !GoneOrZombie(pid) {
		time.Sleep(time.Millisecond)
	}
	ch, err := Watch(context.Background(), pid, st, id)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-ch:
		if got.String() != "exited with status 7" {
			t.Errorf("got %q, want exited with status 7", got)
		}
	default:
		t.Fatal("no status in the channel when Watch returned for an exited process")
	}

	other, ost := start(t, "exec sleep 60")
	ch, err = Watch(context.Background(), other, ost+1, id)
	if err != nil {
		t.Fatal(err)
	}
	if got := recv(t, ch); got.Unknown == "" {
		t.Errorf("watch with a wrong start time: got %q, want it reported gone", got)
	}
	if err := ReapIfOurs(other, ost+1, time.Second); err != nil || GoneOrZombie(other) {
		t.Errorf("ReapIfOurs with a wrong start time touched pid %d (err %v)", other, err)
	}

	// A watch ends with its context, closing the channel without a status.
	ctx, cancel := context.WithCancel(context.Background())
	ch, err = Watch(ctx, other, ost, id)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case got, ok := <-ch:
		if ok {
			t.Errorf("got %q after cancel, want the channel closed", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("watch still running 10s after its context ended")
	}
}
