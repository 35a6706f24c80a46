//go:build linux

package osthread

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// Go starts f on an OS thread locked to it and thrown away when f returns,
// never the main thread: when the goroutine lands on the main thread it
// keeps it locked, so nothing else runs there, and starts f from a second
// goroutine, which the scheduler must then give another thread; it lets the
// main thread go, untouched, once f has returned.
func Go(f func()) {
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() != unix.Getpid() {
			f()
			return // still locked: the thread ends with this goroutine
		}
		done := make(chan struct{})
		go func() {
			runtime.LockOSThread() // never unlocked, as above
			defer close(done)
			f()
		}()
		<-done
		runtime.UnlockOSThread()
	}()
}

// Run runs f as Go does and returns its error.
func Run(f func() error) error {
	errc := make(chan error, 1)
	Go(func() { errc <- f() })
	return <-errc
}
