package agent

import (
	"errors"
	"log/slog"
	"net"
	"time"
)

// patientListener keeps accepting through errors that pass: EMFILE and
// ENFILE (its own fd limit, or the host's file table, exhausted by user
// code), ECONNABORTED, ENOMEM... It waits between tries (5 ms doubling to
// 1 s) and logs once per run of errors, instead of ending the accept loop
// while the socket keeps listening (every later connection would then hang)
// or spinning. Only a closed listener ends it.
type patientListener struct {
	net.Listener
	log *slog.Logger
	// sleep is time.Sleep (tests shorten it).
	sleep func(time.Duration)
}

func patient(ln net.Listener, log *slog.Logger) net.Listener {
	return &patientListener{Listener: ln, log: log, sleep: time.Sleep}
}

func (l *patientListener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			if delay > 0 {
				l.log.Info("accepting again", "addr", l.Addr().String())
			}
			return c, nil
		}
		if errors.Is(err, net.ErrClosed) {
			return nil, err
		}
		if delay == 0 {
			delay = 5 * time.Millisecond
			l.log.Warn("accept failed; retrying", "addr", l.Addr().String(), "err", err)
		} else if delay *= 2; delay > time.Second {
			delay = time.Second
		}
		l.sleep(delay)
	}
}
