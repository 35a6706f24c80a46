//go:build linux

package osthread

import (
	"fmt"
	"os"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRunNeverOnMainThread runs many functions that change their thread's
// UTS namespace and never restore it, from many goroutines: none may run
// on the main thread, whose namespace must stay the process's.
func TestRunNeverOnMainThread(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (unshare of a UTS namespace)")
	}
	orig, err := os.Readlink("/proc/self/ns/uts")
	if err != nil {
		t.Fatal(err)
	}
	const runs, workers = 400, 8
	var wg sync.WaitGroup
	errs := make(chan error, runs)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < runs; i += workers {
				err := Run(func() error {
					if unix.Gettid() == unix.Getpid() {
						return fmt.Errorf("run %d on the main thread", i)
					}
					return unix.Unshare(unix.CLONE_NEWUTS)
				})
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got, _ := os.Readlink(fmt.Sprintf("/proc/%d/task/%d/ns/uts", os.Getpid(), os.Getpid())); got != orig {
		t.Errorf("main thread's UTS namespace is %s, want %s", got, orig)
	}
}
