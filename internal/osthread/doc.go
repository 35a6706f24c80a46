// Package osthread runs code that changes its OS thread's kernel state
// (namespaces, credentials, securebits) and does not restore it, on a
// thread of its own that is thrown away afterwards.
//
// Go ends a thread whose goroutine exits while locked to it, except the
// main thread, which it cannot end: it parks it for good, in whatever state
// the goroutine left. The main thread is the one /proc/self shows (its
// mountinfo, its ns links, its credentials in status), so code that reads
// /proc/self would from then on read another namespace's mounts. Go and Run
// never leave anything on the main thread. Any package may import it.
package osthread
