// Package pidwatch watches host processes named by pid and start time, so a
// reused pid is never mistaken for the process that had it: it tells when
// one exits and how (a pidfd parked in Go's netpoller, no thread held, no
// polling of /proc), and reaps it when it is this process's child. The
// runtime drivers use it for their boxes' init and sandbox processes; it
// imports nothing else of sbx.
package pidwatch

import (
	"fmt"
	"strconv"
	"syscall"
)

// Status says how a watched process ended.
type Status struct {
	// Signal is the signal that killed it (0 if it exited or is unknown).
	Signal int
	// Code is its exit status when it exited (Signal 0 and Unknown "").
	Code int
	// Unknown says why the status could not be read ("" if it could).
	Unknown string
}

// String describes s: "killed by signal SIGKILL", "exited with status 2",
// or why it is not known.
func (s Status) String() string {
	switch {
	case s.Unknown != "":
		return s.Unknown
	case s.Signal != 0:
		return "killed by signal " + SignalName(s.Signal)
	default:
		return fmt.Sprintf("exited with status %d", s.Code)
	}
}

// SignalName is the conventional name of signal sig ("SIGKILL"), or
// "signal N" for one without a name.
func SignalName(sig int) string {
	if n := signalName(syscall.Signal(sig)); n != "" {
		return n
	}
	return "signal " + strconv.Itoa(sig)
}
