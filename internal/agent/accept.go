package agent

import (
	"log/slog"
	"net"

	"github.com/sbxdev/sbx/internal/connlimit"
)

// patientListener keeps accepting through errors that pass: EMFILE and
// ENFILE (its own fd limit, or the host's file table, exhausted by user
// code), ECONNABORTED, ENOMEM... It backs off between tries (5 ms doubling
// to 1 s, connlimit.Accept) and logs once per run of errors, instead of
// ending the accept loop while the socket keeps listening (every later
// connection would then hang) or spinning. Only a closed listener ends it.
// Accept is called from one goroutine at a time (http.Server, ServeExec).
type patientListener struct {
	net.Listener
	backoff connlimit.Backoff
}

func patient(ln net.Listener, log *slog.Logger) net.Listener {
	return &patientListener{Listener: ln, backoff: connlimit.Backoff{Log: log, What: "accept on " + ln.Addr().String()}}
}

func (l *patientListener) Accept() (net.Conn, error) {
	return connlimit.Accept(l.Listener, &l.backoff)
}
