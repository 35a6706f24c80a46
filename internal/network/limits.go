package network

import (
	"fmt"
	"time"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// Limits bound what one box may hold of, or ask from, the daemon's network
// services on its gateway (the DNS forwarder and the egress proxy): each
// costs the daemon descriptors, goroutines and upstream sockets, shared
// with every other box and with the API. A box over a limit has the excess
// dropped or refused (counted, logged once per burst); its neighbours do
// not notice. Zero fields take DefaultLimits.
type Limits struct {
	// DNSQueriesPerSec is the queries (UDP and TCP) a box may send a
	// second; bursts of twice as many pass. Excess UDP queries are
	// dropped (the resolver retries), excess TCP ones answered SERVFAIL.
	DNSQueriesPerSec int
	// DNSInFlight is the queries of one box the forwarder has upstream at
	// once (all boxes together: 256).
	DNSInFlight int
	// DNSTCPConns is the TCP connections a box may hold to the forwarder;
	// DNSTCPIdleTimeout how long one may sit without a complete query.
	DNSTCPConns       int
	DNSTCPIdleTimeout time.Duration
	// EgressConns is the connections a box may hold through the egress
	// proxy (each is two descriptors: the box's and the upstream one).
	EgressConns int
	// EgressIdleTimeout closes a connection passed through the proxy
	// when neither side has sent anything for that long.
	EgressIdleTimeout time.Duration
}

// DefaultLimits are generous for real programs (a resolver retries a
// dropped query; TCP DNS is only for truncated answers; a parallel
// download opens tens of connections) and small next to a daemon's
// descriptor limit.
var DefaultLimits = Limits{
	DNSQueriesPerSec:  200,
	DNSInFlight:       32,
	DNSTCPConns:       16,
	DNSTCPIdleTimeout: 5 * time.Second,
	EgressConns:       256,
	EgressIdleTimeout: 10 * time.Minute,
}

// setDefaults fills zero fields from DefaultLimits.
func (l *Limits) setDefaults() {
	d := DefaultLimits
	fillInt(&l.DNSQueriesPerSec, d.DNSQueriesPerSec)
	fillInt(&l.DNSInFlight, d.DNSInFlight)
	fillInt(&l.DNSTCPConns, d.DNSTCPConns)
	fillInt(&l.EgressConns, d.EgressConns)
	if l.DNSTCPIdleTimeout == 0 {
		l.DNSTCPIdleTimeout = d.DNSTCPIdleTimeout
	}
	if l.EgressIdleTimeout == 0 {
		l.EgressIdleTimeout = d.EgressIdleTimeout
	}
}

// validate refuses negative limits (there is no "unlimited").
func (l Limits) validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"DNS queries per second", int64(l.DNSQueriesPerSec)},
		{"DNS queries in flight", int64(l.DNSInFlight)},
		{"DNS TCP connections", int64(l.DNSTCPConns)},
		{"DNS TCP idle timeout", int64(l.DNSTCPIdleTimeout)},
		{"egress connections", int64(l.EgressConns)},
		{"egress idle timeout", int64(l.EgressIdleTimeout)},
	} {
		if f.v < 0 {
			return fmt.Errorf("per-sandbox limit on %s is %d: must not be negative: %w", f.name, f.v, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

func fillInt(v *int, def int) {
	if *v == 0 {
		*v = def
	}
}
