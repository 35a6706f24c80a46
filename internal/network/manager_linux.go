package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sbxdev/sbx/internal/errdefs"
)

// Manager attaches sandboxes to the network. All methods are safe for
// concurrent use; calls for one sandbox must be serialised by the caller.
type Manager struct {
	cfg         Config
	log         *slog.Logger
	subnet      netip.Prefix
	gw          netip.Addr
	bridgeIndex int
	fw          *firewall
	dns         *dnsForwarder
	egress      *egressProxy
	ca          *egressCA
	bundleDir   string // CA bundle for boxes with secrets
	lock        *hostLock

	mu sync.Mutex
	// The fields below are guarded by mu.
	ipam *ipam
	// pool holds ready slots (namespace, veth, address; no rules, no owner).
	pool []*slot
	// detaching marks slots whose host resources are being removed.
	detaching map[string]bool

	poolWake chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	wg       sync.WaitGroup // pool filler and background deletions
}

// New sets up the bridge, forwarding, the firewall table (rebuilt from the
// persisted state, so surviving sandboxes keep their rules) and the DNS
// forwarder. Call Cleanup once the caller knows which sandboxes live on,
// then Start.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	subnet, err := netip.ParsePrefix(cfg.Subnet)
	if err != nil {
		return nil, fmt.Errorf("network subnet %q: %w", cfg.Subnet, errdefs.ErrInvalidArgument)
	}
	// Before anything on the host is touched: another daemon on the same
	// bridge or table must not have its table rebuilt under it.
	lock, err := lockHost(cfg)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			lock.release()
		}
	}()
	if err := os.MkdirAll(filepath.Join(cfg.StateDir, "ns"), 0o711); err != nil {
		return nil, fmt.Errorf("create network state dir: %w", err)
	}
	st, err := loadIPAM(filepath.Join(cfg.StateDir, "state.json"), subnet)
	if err != nil {
		return nil, err
	}
	m := &Manager{
		cfg: cfg, log: cfg.Logger, subnet: st.subnet, gw: st.gw, ipam: st, lock: lock,
		detaching: map[string]bool{}, poolWake: make(chan struct{}, 1), stop: make(chan struct{}),
	}
	if m.bridgeIndex, err = ensureBridge(cfg.Bridge, m.gw, subnet.Bits()); err != nil {
		return nil, err
	}
	if m.ca, err = loadCA(cfg.EgressDir); err != nil {
		return nil, err
	}
	if m.bundleDir, err = m.ca.writeBundle(cfg.EgressDir); err != nil {
		return nil, err
	}
	roots, err := newEgressRoots(cfg.EgressRoots)
	if err != nil {
		return nil, err
	}
	m.egress = &egressProxy{subnet: m.subnet, lookup: m.egressBox, resolve: m.resolveA, ca: m.ca, roots: roots,
		log: m.log.With("component", "egress"), maxConns: cfg.Limits.EgressConns, idleTimeout: cfg.Limits.EgressIdleTimeout}
	if err := startEgress(netip.AddrPortFrom(m.gw, 0).String(), m.egress); err != nil {
		return nil, err
	}
	params := ruleParams{bridge: cfg.Bridge, subnet: m.subnet, gateway: m.gw,
		egressPorts: cfg.EgressPorts, proxyPort: m.egress.port, apiPort: cfg.APIPort}
	if m.fw, err = newFirewall(cfg.Table, params); err != nil {
		m.egress.close()
		return nil, err
	}
	if err := groupPorts(cfg.Bridge, m.bridgeIndex); err != nil {
		m.fw.close()
		m.egress.close()
		return nil, err
	}
	m.recordMACs()
	if err := m.fw.rebuild(m.ownedSlots()); err != nil {
		m.fw.close()
		m.egress.close()
		return nil, err
	}
	upstreams := cfg.DNSUpstreams
	if len(upstreams) == 0 {
		upstreams = hostResolvers("/etc/resolv.conf")
	}
	m.dns, err = startDNS(netip.AddrPortFrom(m.gw, 53).String(), upstreams,
		dnsClient{policy: m.dnsPolicy, allow: m.fw.allowAddrs}, cfg.Limits, m.log.With("component", "dns"))
	if err != nil {
		m.fw.close()
		m.egress.close()
		return nil, fmt.Errorf("start DNS forwarder on %s: %w", m.gw, err)
	}
	m.log.Info("network ready", "bridge", cfg.Bridge, "subnet", m.subnet, "table", cfg.Table, "dns_upstreams", upstreams)
	ok = true
	return m, nil
}

// recordMACs fills in the MAC of slots saved before it was recorded, from
// their namespaces, so that the port guard binds their ports to the MAC
// their boxes use. A slot whose namespace cannot tell keeps boxMAC (its
// box, if any, is cut off: the port guard fails closed).
func (m *Manager) recordMACs() {
	changed := false
	for _, sl := range m.ipam.slots {
		if !sl.IP.IsValid() || sl.MAC != "" {
			continue
		}
		mac, err := peerMAC(nsPath(m.cfg.StateDir, sl.Name))
		if err != nil {
			m.log.Warn("reading the MAC of a sandbox's eth0; binding its port to the default", "slot", sl.Name, "err", err)
			mac = boxMAC(sl.IP)
		}
		sl.MAC, changed = mac.String(), true
	}
	if changed {
		if err := m.ipam.save(); err != nil {
			m.log.Warn("saving the sandboxes' MACs", "err", err)
		}
	}
}

func (m *Manager) ownedSlots() []*slot {
	var out []*slot
	for _, sl := range m.ipam.slots {
		if sl.Owner != "" {
			out = append(out, sl)
		}
	}
	return out
}

// Start fills the pool in the background.
func (m *Manager) Start() {
	if m.cfg.PoolSize <= 0 {
		return
	}
	m.wg.Add(1)
	go m.fillPool()
	m.wakePool()
}

// Close stops the pool and the DNS forwarder and removes pooled slots.
// Attached sandboxes keep their networking: a restarted daemon recovers it.
func (m *Manager) Close() {
	m.closeLoops()
	m.fw.close()
	if err := unmountBundleFS(m.bundleDir); err != nil {
		m.log.Warn("close networking", "err", err)
	}
	m.lock.release()
}

func (m *Manager) closeLoops() {
	m.stopOnce.Do(func() {
		close(m.stop)
		m.wg.Wait()
		m.mu.Lock()
		pool := m.pool
		m.pool = nil
		m.mu.Unlock()
		for _, sl := range pool {
			m.destroySlot(sl)
		}
		m.dns.close()
		m.egress.close()
	})
}

// Gateway is the bridge address (the boxes' router and resolver).
func (m *Manager) Gateway() netip.Addr { return m.gw }

func (m *Manager) attachment(sl *slot) Attachment {
	a := Attachment{NetNS: nsPath(m.cfg.StateDir, sl.Name), IP: sl.IP, Policy: sl.Policy}
	if sl.IP.IsValid() {
		a.DNS = []string{m.gw.String()}
	}
	return a
}

// Attach gives sandbox id a network namespace configured for p: from the
// pool when it has one ready and p needs a veth, else made now.
func (m *Manager) Attach(ctx context.Context, id string, p Policy) (Attachment, error) {
	if p.Mode != ModeNone {
		if sl := m.takePooled(); sl != nil {
			m.mu.Lock()
			if m.ipam.byOwner(id) != nil {
				m.mu.Unlock()
				m.destroySlot(sl)
				return Attachment{}, fmt.Errorf("network of %s: %w", id, errdefs.ErrAlreadyExists)
			}
			m.ipam.setOwner(sl, id)
			sl.Policy = p
			err := m.ipam.save()
			m.mu.Unlock()
			if err == nil {
				err = m.fw.addBox(sl)
			}
			if err != nil {
				m.destroySlot(sl)
				return Attachment{}, err
			}
			return m.attachment(sl), nil
		}
	}
	m.mu.Lock()
	if m.ipam.byOwner(id) != nil {
		m.mu.Unlock()
		return Attachment{}, fmt.Errorf("network of %s: %w", id, errdefs.ErrAlreadyExists)
	}
	sl := m.ipam.newSlot(id, p)
	err := error(nil)
	if p.Mode != ModeNone {
		err = m.ipam.assign(sl)
	}
	if err == nil {
		err = m.ipam.save()
	}
	if err != nil {
		m.ipam.remove(sl)
		m.mu.Unlock()
		return Attachment{}, err
	}
	m.mu.Unlock()
	if err := m.configure(sl); err != nil {
		m.destroySlot(sl)
		return Attachment{}, err
	}
	if sl.IP.IsValid() {
		if err := m.fw.addBox(sl); err != nil {
			m.destroySlot(sl)
			return Attachment{}, err
		}
	}
	return m.attachment(sl), nil
}

// configure makes a slot's namespace and, if it has an address, its veth.
func (m *Manager) configure(sl *slot) error {
	if err := createNetNS(nsPath(m.cfg.StateDir, sl.Name)); err != nil {
		return err
	}
	if sl.IP.IsValid() {
		return addVeth(nsPath(m.cfg.StateDir, sl.Name), sl.Veth, m.bridgeIndex, portGroup(m.cfg.Bridge), sl.IP, m.gw, m.subnet.Bits())
	}
	return nil
}

// Recover returns the attachment of a sandbox that survived a daemon
// restart (its rules were restored by New). secrets are its domain
// secrets, values included (state.json does not keep values).
func (m *Manager) Recover(ctx context.Context, id string, secrets []Secret) (Attachment, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sl := m.ipam.byOwner(id)
	if sl == nil || m.detaching[sl.Name] {
		return Attachment{}, fmt.Errorf("network of %s: %w", id, errdefs.ErrNotFound)
	}
	if _, err := os.Stat(nsPath(m.cfg.StateDir, sl.Name)); err != nil {
		return Attachment{}, fmt.Errorf("network namespace of %s: %w", id, errdefs.ErrNotFound)
	}
	wasProxied := sl.Policy.proxied()
	sl.Policy.Secrets = secrets
	if sl.IP.IsValid() && sl.Policy.proxied() != wasProxied {
		// The rules (built from state.json) decide on "has secrets": make
		// them agree with the caller's spec.
		m.log.Warn("domain secrets of a recovered sandbox differ from the network state; fixing its rules", "sandbox", id)
		if err := m.fw.setPolicy(sl); err != nil {
			return Attachment{}, err
		}
		if err := m.ipam.save(); err != nil {
			return Attachment{}, err
		}
	}
	return m.attachment(sl), nil
}

// Placeholder is the value sandbox id sees in env var name instead of a
// domain secret (stable across daemon restarts).
func (m *Manager) Placeholder(id, name string) string { return m.ca.placeholder(id, name) }

// CABundleDir is a host directory holding ca-bundle.crt: the host's CA
// bundle plus the egress CA, for boxes whose TLS the proxy intercepts.
func (m *Manager) CABundleDir() string { return m.bundleDir }

// EgressCA returns the egress CA certificate (PEM).
func (m *Manager) EgressCA() []byte { return m.ca.certPEM }

// egressBox tells the egress proxy whose box src is.
func (m *Manager) egressBox(src netip.Addr) (egressBox, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sl := m.ipam.slots[m.ipam.used[src]]
	if sl == nil || sl.Owner == "" || m.detaching[sl.Name] {
		return egressBox{}, false
	}
	return egressBox{owner: sl.Owner, policy: sl.Policy}, true
}

// resolveA asks the upstream resolvers (not the box's view) for host's
// IPv4 addresses.
func (m *Manager) resolveA(ctx context.Context, host string) ([]netip.Addr, error) {
	return m.dns.resolveA(host)
}

// Update switches a sandbox to policy p. Rules change in one transaction;
// switching to none removes the veth, switching from none adds one.
func (m *Manager) Update(ctx context.Context, id string, p Policy) (Attachment, error) {
	m.mu.Lock()
	sl := m.ipam.byOwner(id)
	if sl == nil || m.detaching[sl.Name] {
		m.mu.Unlock()
		return Attachment{}, fmt.Errorf("network of %s: %w", id, errdefs.ErrNotFound)
	}
	hadIP, oldIP, old := sl.IP.IsValid(), sl.IP, sl.Policy
	m.mu.Unlock()
	if hadIP {
		// What the egress proxy holds for the box is re-checked against
		// the new policy, as nftables re-checks the box's direct packets
		// (after any return below: the policy in force is then settled).
		defer m.egress.recheck(oldIP)
	}
	switch {
	case hadIP && p.Mode != ModeNone:
		m.mu.Lock()
		sl.Policy = p
		err := m.ipam.save()
		m.mu.Unlock()
		if err == nil {
			err = m.fw.setPolicy(sl)
		}
		if err != nil {
			m.mu.Lock()
			sl.Policy = old
			_ = m.ipam.save()
			m.mu.Unlock()
			return Attachment{}, err
		}
	case hadIP: // → none: cut at once, unplug in the background
		if err := m.fw.removeBox(sl.Name); err != nil {
			return Attachment{}, err
		}
		m.mu.Lock()
		ip, veth := m.ipam.unassignLater(sl)
		sl.Policy = p
		err := m.ipam.save()
		m.mu.Unlock()
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			if err := deleteLink(veth); err != nil {
				m.log.Warn("removing veth; Cleanup retries", "veth", veth, "err", err)
				return // keep the address reserved
			}
			m.mu.Lock()
			m.ipam.release(ip)
			m.mu.Unlock()
		}()
		if err != nil {
			return Attachment{}, err
		}
	case p.Mode == ModeNone:
		m.mu.Lock()
		sl.Policy = p
		err := m.ipam.save()
		m.mu.Unlock()
		if err != nil {
			return Attachment{}, err
		}
	default: // none → connected
		m.mu.Lock()
		err := m.ipam.assign(sl)
		if err == nil {
			sl.Policy = p
			err = m.ipam.save()
		}
		m.mu.Unlock()
		if err == nil {
			if err = addVeth(nsPath(m.cfg.StateDir, sl.Name), sl.Veth, m.bridgeIndex, portGroup(m.cfg.Bridge), sl.IP, m.gw, m.subnet.Bits()); err == nil {
				if err = m.fw.addBox(sl); err != nil {
					_ = deleteLink(sl.Veth)
				}
			}
		}
		if err != nil {
			m.mu.Lock()
			m.ipam.unassign(sl)
			sl.Policy = old
			_ = m.ipam.save()
			m.mu.Unlock()
			return Attachment{}, err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.attachment(sl), nil
}

// Detach cuts a sandbox off at once and removes its veth, namespace and
// address in the background (deleting a veth takes tens of ms). Idempotent.
func (m *Manager) Detach(ctx context.Context, id string) error {
	m.mu.Lock()
	sl := m.ipam.byOwner(id)
	if sl == nil || m.detaching[sl.Name] {
		m.mu.Unlock()
		return nil
	}
	m.detaching[sl.Name] = true
	ip := sl.IP
	m.mu.Unlock()
	var err error
	if ip.IsValid() {
		if err = m.fw.removeBox(sl.Name); err != nil {
			err = fmt.Errorf("remove rules of %s: %w", id, err)
		}
		m.egress.recheck(ip) // the box is gone for the proxy: cuts all
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		m.destroySlot(sl)
	}()
	return err
}

// destroySlot removes a slot's host resources, then its state entry.
func (m *Manager) destroySlot(sl *slot) { m.destroySlots([]*slot{sl}) }

// destroySlots removes slots' host resources, a few at a time (deleting a
// veth takes tens of milliseconds, mostly waiting), then their state
// entries with one write of the state file.
func (m *Manager) destroySlots(slots []*slot) {
	if len(slots) == 0 {
		return
	}
	done := make([]bool, len(slots))
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(len(slots), 8) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				sl := slots[i]
				var errs []error
				if sl.Veth != "" {
					errs = append(errs, deleteLink(sl.Veth))
				}
				errs = append(errs, removeNetNS(nsPath(m.cfg.StateDir, sl.Name)))
				if err := errors.Join(errs...); err != nil {
					m.log.Warn("removing network slot; Cleanup retries", "slot", sl.Name, "owner", sl.Owner, "err", err)
					continue
				}
				done[i] = true
			}
		}()
	}
	for i := range slots {
		next <- i
	}
	close(next)
	wg.Wait()
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, sl := range slots {
		delete(m.detaching, sl.Name)
		if done[i] {
			m.ipam.remove(sl)
		}
	}
	if err := m.ipam.save(); err != nil {
		m.log.Warn("saving network state", "err", err)
	}
}

// Cleanup removes every slot whose owner is not in keep (crash leftovers,
// pooled slots of a previous run) from the table and the host, then
// namespace files and sbx veths on the bridge that no slot accounts for.
// The table itself was rebuilt from the state file by New.
func (m *Manager) Cleanup(ctx context.Context, keep map[string]bool) error {
	m.mu.Lock()
	pooled := map[*slot]bool{}
	for _, sl := range m.pool {
		pooled[sl] = true
	}
	var gone []*slot
	var goneNames []string
	for _, sl := range m.ipam.slots {
		owned := sl.Owner != "" && keep[sl.Owner] && m.ipam.byOwner(sl.Owner) == sl
		if !owned && !m.detaching[sl.Name] && !pooled[sl] {
			gone = append(gone, sl)
			goneNames = append(goneNames, sl.Name)
			m.detaching[sl.Name] = true
		}
	}
	m.mu.Unlock()
	var errs []error
	if err := m.fw.removeBoxes(goneNames); err != nil {
		errs = append(errs, err)
	}
	if len(gone) > 0 {
		m.log.Info("removing leftover network slots", "count", len(gone))
	}
	m.destroySlots(gone)
	m.mu.Lock()
	known, veths := map[string]bool{}, map[string]bool{}
	for _, sl := range m.ipam.slots {
		known[sl.Name] = true
		veths[sl.Veth] = true
	}
	m.mu.Unlock()
	if ents, err := os.ReadDir(filepath.Join(m.cfg.StateDir, "ns")); err == nil {
		for _, e := range ents {
			if !known[e.Name()] {
				errs = append(errs, removeNetNS(nsPath(m.cfg.StateDir, e.Name())))
			}
		}
	}
	if ports, err := bridgePorts(m.bridgeIndex); err == nil {
		for _, p := range ports {
			if strings.HasPrefix(p, "sbx") && !veths[p] {
				m.log.Info("removing leftover veth", "veth", p)
				errs = append(errs, deleteLink(p))
			}
		}
	}
	return errors.Join(errs...)
}

// Stats returns a sandbox's traffic counters.
// Counters returns the bytes box id received and sent: its veth's
// counters only, without Stats' conntrack walk (which costs O(every
// connection on the host) per call), for a sampler that reads every box.
func (m *Manager) Counters(id string) (rx, tx int64, err error) {
	m.mu.Lock()
	sl := m.ipam.byOwner(id)
	var veth string
	if sl != nil {
		veth = sl.Veth
	}
	m.mu.Unlock()
	if sl == nil {
		return 0, 0, fmt.Errorf("network of %s: %w", id, errdefs.ErrNotFound)
	}
	if veth == "" {
		return 0, 0, nil
	}
	// The host end's receive is the box's transmit.
	tx, rx, _, _, err = linkCounters(veth)
	if err != nil {
		return 0, 0, fmt.Errorf("counters of %s: %w", id, err)
	}
	return rx, tx, nil
}

func (m *Manager) Stats(id string) (Stats, error) {
	m.mu.Lock()
	sl := m.ipam.byOwner(id)
	var veth string
	var ip netip.Addr
	if sl != nil {
		veth, ip = sl.Veth, sl.IP
	}
	m.mu.Unlock()
	if sl == nil {
		return Stats{}, fmt.Errorf("network of %s: %w", id, errdefs.ErrNotFound)
	}
	if veth == "" {
		return Stats{}, nil
	}
	var s Stats
	var err error
	// The host end's receive is the box's transmit.
	s.TxBytes, s.RxBytes, s.TxPackets, s.RxPackets, err = linkCounters(veth)
	if err != nil {
		return Stats{}, fmt.Errorf("counters of %s: %w", id, err)
	}
	if flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET); err == nil {
		for _, f := range flows {
			if f.Forward.SrcIP.Equal(ip.AsSlice()) {
				s.Connections++
			}
		}
	}
	return s, nil
}

// dnsPolicy tells the DNS forwarder who asks.
func (m *Manager) dnsPolicy(src netip.Addr) (Policy, string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sl := m.ipam.slots[m.ipam.used[src]]
	if sl == nil || sl.Owner == "" || m.detaching[sl.Name] {
		return Policy{}, "", false
	}
	return sl.Policy, sl.Name, true
}

func (m *Manager) takePooled() *slot {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.pool) == 0 {
		return nil
	}
	sl := m.pool[0]
	m.pool = m.pool[1:]
	m.wakePool()
	return sl
}

func (m *Manager) wakePool() {
	select {
	case m.poolWake <- struct{}{}:
	default:
	}
}

// fillPool keeps PoolSize public-ready slots until Close.
func (m *Manager) fillPool() {
	defer m.wg.Done()
	backoff := time.Second
	for {
		select {
		case <-m.stop:
			return
		case <-m.poolWake:
		}
		for {
			m.mu.Lock()
			full := len(m.pool) >= m.cfg.PoolSize
			m.mu.Unlock()
			if full {
				break
			}
			sl, err := m.newPooled()
			if err != nil {
				m.log.Warn("network pool: preparing a namespace failed", "err", err, "retry_in", backoff)
				select {
				case <-m.stop:
					return
				case <-time.After(backoff):
				}
				backoff = min(2*backoff, 30*time.Second)
				continue
			}
			backoff = time.Second
			m.mu.Lock()
			m.pool = append(m.pool, sl)
			m.mu.Unlock()
			select {
			case <-m.stop:
				return
			default:
			}
		}
	}
}

func (m *Manager) newPooled() (*slot, error) {
	m.mu.Lock()
	sl := m.ipam.newSlot("", Policy{Mode: ModePublic})
	err := m.ipam.assign(sl)
	if err == nil {
		err = m.ipam.save()
	}
	if err != nil {
		m.ipam.remove(sl)
		m.mu.Unlock()
		return nil, err
	}
	m.mu.Unlock()
	if err := m.configure(sl); err != nil {
		m.destroySlot(sl)
		return nil, err
	}
	return sl, nil
}

// Remove destroys every slot, the firewall table and the bridge: for tests
// and for uninstalling. Sandboxes still attached lose their network.
func (m *Manager) Remove() error {
	m.closeLoops()
	defer m.lock.release() // after the table and the bridge are gone
	defer m.fw.close()
	m.mu.Lock()
	slots := make([]*slot, 0, len(m.ipam.slots))
	for _, sl := range m.ipam.slots {
		slots = append(slots, sl)
	}
	m.mu.Unlock()
	for _, sl := range slots {
		m.destroySlot(sl)
	}
	errs := []error{m.fw.remove(), unmountBundleFS(m.bundleDir)}
	errs = append(errs, deleteLink(m.cfg.Bridge))
	return errors.Join(errs...)
}
