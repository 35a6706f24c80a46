//go:build !linux

package osthread

import "runtime"

// Go starts f on an OS thread locked to it (off Linux nothing here changes
// thread state, so the thread's fate does not matter).
func Go(f func()) {
	go func() {
		runtime.LockOSThread()
		f()
	}()
}

// Run runs f as Go does and returns its error.
func Run(f func() error) error {
	errc := make(chan error, 1)
	Go(func() { errc <- f() })
	return <-errc
}
