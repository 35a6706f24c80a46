package podfw

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	soSetReplace = 64 // IPT_SO_SET_REPLACE, IP6T_SO_SET_REPLACE
	soGetInfo    = 64 // IPT_SO_GET_INFO, IP6T_SO_GET_INFO
	soGetEntries = 65 // IPT_SO_GET_ENTRIES, IP6T_SO_GET_ENTRIES
)

// applyIPTables replaces the IPv4 and the IPv6 filter table with rules in
// front of policy (FORWARD drops everything) and reads each back: an
// error if either differs from what was written.
func applyIPTables(rules []Rule, policy Verdict) error {
	for _, v6 := range []bool{false, true} {
		t, err := buildTable(v6, rules, policy)
		if err != nil {
			return err
		}
		if err := t.apply(); err != nil {
			fam := "ipv4"
			if v6 {
				fam = "ipv6"
			}
			return fmt.Errorf("%s filter table: %w", fam, err)
		}
	}
	return nil
}

// apply writes t on a raw socket of its family and reads it back.
func (t *ipTable) apply() error {
	family, level := unix.AF_INET, unix.SOL_IP
	if t.v6 {
		family, level = unix.AF_INET6, unix.SOL_IPV6
	}
	fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		if errors.Is(err, unix.EPERM) {
			return fmt.Errorf("opening a raw socket (needs CAP_NET_RAW; under gVisor runsc also needs --net-raw, see docs/DRIVERS.md): %w", err)
		}
		return fmt.Errorf("opening a raw socket: %w", err)
	}
	defer unix.Close(fd)
	old, err := getInfo(fd, level)
	if err != nil {
		return err
	}
	counters := make([]byte, counterSize*(int(old.num)+1))
	blob := t.replace(old.num, uintptr(unsafe.Pointer(&counters[0])))
	err = unix.SetsockoptString(fd, level, soSetReplace, string(blob))
	runtime.KeepAlive(counters)
	if err != nil {
		return fmt.Errorf("replacing the filter table (needs CAP_NET_ADMIN): %w", err)
	}
	info, err := getInfo(fd, level)
	if err != nil {
		return err
	}
	got := make([]byte, getEntriesSize+int(info.size))
	copy(got, "filter")
	binary.NativeEndian.PutUint32(got[32:], info.size)
	if _, err := getsockopt(fd, level, soGetEntries, got); err != nil {
		return fmt.Errorf("reading the filter table back: %w", err)
	}
	if err := t.verify(info, got[getEntriesSize:]); err != nil {
		return fmt.Errorf("reading the filter table back: %w", err)
	}
	return nil
}

// getInfo is IPT_SO_GET_INFO for the filter table.
func getInfo(fd, level int) (tableInfo, error) {
	b := make([]byte, getinfoSize)
	copy(b, "filter")
	n, err := getsockopt(fd, level, soGetInfo, b)
	if err != nil {
		return tableInfo{}, fmt.Errorf("reading the filter table's info: %w", err)
	}
	if n != getinfoSize {
		return tableInfo{}, fmt.Errorf("reading the filter table's info: got %d bytes, want %d", n, getinfoSize)
	}
	return parseInfo(b), nil
}

// getsockopt passes b in and out (the x_tables getsockopts read their
// argument's head: the table's name and size).
func getsockopt(fd, level, opt int, b []byte) (int, error) {
	n := uint32(len(b))
	_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt),
		uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&n)), 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
