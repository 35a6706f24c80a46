package podfw

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"
)

// TestBuildTableLayout checks the lowered ModeNone filter table's shape:
// per family, INPUT holds lo and one rule per agent port, then its drop
// policy; FORWARD only its drop policy; OUTPUT lo and one reply rule per
// port, then drop; the ERROR entry last; hook entries and underflows point
// at those entries.
func TestBuildTableLayout(t *testing.T) {
	rules := NoneRules([]uint16{7700, 7701})
	for _, v6 := range []bool{false, true} {
		tb, err := buildTable(v6, rules, Drop)
		if err != nil {
			t.Fatal(err)
		}
		es := iptEntrySize
		if v6 {
			es = ip6tEntrySize
		}
		// Entry sizes: lo = header + standard target; port = + tcp match.
		lo, port, pol, errEntry := es+standardSize, es+tcpMatchSize+standardSize, es+standardSize, es+errorSize
		in := lo + 2*port + pol
		fwd := pol
		out := lo + 2*port + pol
		if got, want := len(tb.entries), in+fwd+out+errEntry; got != want {
			t.Errorf("v6=%v: table size %d, want %d", v6, got, want)
		}
		if got, want := tb.num, uint32(3+1+1+3+1+1); got != want {
			t.Errorf("v6=%v: %d entries, want %d", v6, got, want)
		}
		want := struct{ entry, underflow [5]uint32 }{}
		want.entry[hookIn], want.underflow[hookIn] = 0, uint32(in-pol)
		want.entry[hookForward], want.underflow[hookForward] = uint32(in), uint32(in)
		want.entry[hookOut], want.underflow[hookOut] = uint32(in+fwd), uint32(in+fwd+out-pol)
		if tb.hookEntry != want.entry || tb.underflow != want.underflow {
			t.Errorf("v6=%v: hooks %v underflows %v, want %v %v", v6, tb.hookEntry, tb.underflow, want.entry, want.underflow)
		}
		// The table reads back as itself, and a changed verdict does not.
		info := tableInfo{validHooks: filterHooks, hookEntry: tb.hookEntry, underflow: tb.underflow, num: tb.num, size: uint32(len(tb.entries))}
		if err := tb.verify(info, tb.entries); err != nil {
			t.Errorf("v6=%v: verify of the table itself: %v", v6, err)
		}
		bad := append([]byte(nil), tb.entries...)
		// The INPUT policy's verdict: drop (-1) becomes accept (-2).
		binary.NativeEndian.PutUint32(bad[in-pol+es+targetHdrSize:], uint32(0xfffffffe))
		if err := tb.verify(info, bad); err == nil || !strings.Contains(err.Error(), "differ") {
			t.Errorf("v6=%v: verify of a table whose INPUT policy accepts: got %v, want an error", v6, err)
		}
		counted := append([]byte(nil), tb.entries...)
		binary.NativeEndian.PutUint64(counted[es-16:], 42) // the first entry's packet counter
		if err := tb.verify(info, counted); err != nil {
			t.Errorf("v6=%v: verify ignores counters: got %v", v6, err)
		}
		info.num++
		if err := tb.verify(info, tb.entries); err == nil {
			t.Errorf("v6=%v: verify with a wrong entry count: got nil, want an error", v6)
		}
	}
}

// TestBuildTableFamilies: a rule with an IPv4 remote lands only in the
// IPv4 table, an IPv6 one only in the IPv6 table, one without in both.
func TestBuildTableFamilies(t *testing.T) {
	rules := []Rule{
		{Dir: Out, Proto: ProtoTCP, Remote: netip.MustParsePrefix("10.0.0.0/8"), RemotePort: 443, Verdict: Accept},
		{Dir: Out, Proto: ProtoUDP, Remote: netip.MustParsePrefix("fd00::/8"), RemotePort: 53, Verdict: Accept},
		{Dir: In, Proto: ProtoTCP, Remote: netip.MustParsePrefix("192.168.0.0/16"), Verdict: Drop},
		{Dir: Out, Verdict: Drop},
	}
	for _, tc := range []struct {
		v6   bool
		want uint32
	}{{false, 3 + 4}, {true, 2 + 4}} { // rules + 3 policies + ERROR
		tb, err := buildTable(tc.v6, rules, Accept)
		if err != nil {
			t.Fatal(err)
		}
		if tb.num != tc.want {
			t.Errorf("v6=%v: %d entries, want %d", tc.v6, tb.num, tc.want)
		}
	}
}

func TestRuleCheck(t *testing.T) {
	for _, tc := range []struct {
		r    Rule
		want string
	}{
		{Rule{Verdict: Accept}, "direction"},
		{Rule{Dir: In}, "verdict"},
		{Rule{Dir: In, Verdict: Accept, Proto: 9}, "protocol"},
		{Rule{Dir: In, Verdict: Accept, Iface: "a-very-long-interface"}, "longer than 15"},
		{Rule{Dir: In, Verdict: Accept, LocalPort: 80}, "ports need tcp or udp"},
		{Rule{Dir: In, Verdict: Accept, Proto: ProtoUDP, Established: true}, "established needs tcp"},
		{Rule{Dir: In, Verdict: Accept, Remote: netip.MustParsePrefix("10.1.2.3/8")}, "not a masked prefix"},
	} {
		_, err := buildTable(false, []Rule{tc.r}, Drop)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("rule %+v: got %v, want an error with %q", tc.r, err, tc.want)
		}
	}
}
