package network

import (
	"net"
	"net/netip"
)

// Connections the egress proxy holds, per box. nftables re-checks every
// packet a box sends directly, but a connection redirected to the proxy is
// the box's connection to the gateway (accepted as established) plus the
// proxy's own connection upstream: a policy change would not touch it. So
// the proxy keeps, for each box connection, the name it is for and where it
// connected, and the manager calls recheck after every policy change and on
// detach: connections the new policy no longer permits are closed, both
// sides.

// proxyConn is one box connection and the upstream connections made for it.
type proxyConn struct {
	src netip.Addr
	// The fields below are guarded by egressProxy.mu.
	host   string         // the name being served ("": none)
	target netip.AddrPort // where the proxy connected (invalid: not yet)
	conns  map[net.Conn]struct{}
	cut    bool // closed by recheck: add no more connections
}

// errPolicyChanged is a route decided under a policy the box no longer has.
var errPolicyChanged = errBlocked{"the sandbox's network policy changed"}

// track registers a new box connection (serve has counted it against the
// box's limit).
func (p *egressProxy) track(pc *proxyConn, c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	box := p.boxes[pc.src]
	if box == nil {
		box = map[*proxyConn]struct{}{}
		p.boxes[pc.src] = box
	}
	pc.conns = map[net.Conn]struct{}{c: {}}
	box[pc] = struct{}{}
}

// untrack forgets a box connection that is done.
func (p *egressProxy) untrack(pc *proxyConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if box := p.boxes[pc.src]; box != nil {
		delete(box, pc)
		if len(box) == 0 {
			delete(p.boxes, pc.src)
		}
	}
}

// addUpstream registers an upstream connection of pc, so that a cut closes
// it too; it fails (and the caller closes c) if pc has been cut already.
func (p *egressProxy) addUpstream(pc *proxyConn, c net.Conn) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pc.cut {
		return errPolicyChanged
	}
	pc.conns[c] = struct{}{}
	return nil
}

func (p *egressProxy) removeUpstream(pc *proxyConn, c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(pc.conns, c)
}

// setRoute records that pc now serves host through target, after checking
// that the box's current policy still allows it: a policy change between
// route's decision and here is seen either by this check or by recheck,
// which run under the same lock.
func (p *egressProxy) setRoute(pc *proxyConn, host string, target netip.AddrPort) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	box, ok := p.lookup(pc.src)
	if pc.cut || !ok || !p.allows(box.policy, host, target) {
		return errPolicyChanged
	}
	pc.host, pc.target = host, target
	return nil
}

// allows reports whether pol lets a connection for host (SNI or Host; ""
// for none) go on to target, the address route chose. No name is resolved
// again: the check is on the name and the address already connected to.
func (p *egressProxy) allows(pol Policy, host string, target netip.AddrPort) bool {
	switch pol.Mode {
	case ModeNone:
		return false
	case ModeAllow:
		if _, err := netip.ParseAddr(host); host == "" || err == nil {
			if !inPrefixes(pol.AllowCIDRs, target.Addr()) {
				return false
			}
		} else if !MatchDomain(pol.AllowDomains, host) {
			return false
		}
	}
	return p.permitted(pol, target)
}

// recheck applies the current policy of the box at src to the connections
// the proxy holds for it and closes (both sides) those it no longer
// permits; all of them when the box is gone or its mode is none. The
// manager calls it after every policy change and on detach.
func (p *egressProxy) recheck(src netip.Addr) (closed int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	box, ok := p.lookup(src)
	for pc := range p.boxes[src] {
		if pc.cut {
			continue
		}
		keep := ok && box.policy.Mode != ModeNone
		if keep && pc.target.IsValid() {
			keep = p.allows(box.policy, pc.host, pc.target)
		}
		if keep {
			continue // no route yet: setRoute checks the new policy
		}
		pc.cut = true
		for c := range pc.conns {
			_ = c.Close()
		}
		closed++
	}
	if closed > 0 {
		p.log.Info("egress: connections cut by a policy change", "src", src, "closed", closed)
	}
	return closed
}

// closeAllLocked closes every connection (the proxy is stopping).
func (p *egressProxy) closeAllLocked() {
	for _, box := range p.boxes {
		for pc := range box {
			pc.cut = true
			for c := range pc.conns {
				_ = c.Close()
			}
		}
	}
}

// trackedConn is an upstream connection that leaves pc when closed.
type trackedConn struct {
	net.Conn
	p  *egressProxy
	pc *proxyConn
}

func (c *trackedConn) Close() error {
	c.p.removeUpstream(c.pc, c.Conn)
	return c.Conn.Close()
}

// dialUpstream connects to target for pc and tracks the connection.
func (p *egressProxy) dialUpstream(pc *proxyConn, dial func() (net.Conn, error)) (net.Conn, error) {
	up, err := dial()
	if err != nil {
		return nil, err
	}
	if err := p.addUpstream(pc, up); err != nil {
		up.Close()
		return nil, err
	}
	return &trackedConn{Conn: up, p: p, pc: pc}, nil
}
