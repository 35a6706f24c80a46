//go:build linux

package permfs

import (
	"sync"

	"golang.org/x/sys/unix"
)

// Multiply linked files. Each name of a file with several links is its own
// node (and kernel inode), so that its permission is decided by that name.
// The kernel caches each one's data and attributes separately; so that a
// change through one name is seen through the others, the layer remembers
// which nodes share a backing file and drops the others' caches after a
// write or attribute change.

// fileID identifies a backing file.
type fileID struct{ dev, ino uint64 }

// linkSet tracks the nodes of multiply linked files.
type linkSet struct {
	mu sync.Mutex
	// byFile holds the live nodes of each multiply linked file.
	byFile map[fileID]map[*node]struct{}
}

// add records that n is a name of the file st describes, if that file has
// more than one link.
func (l *linkSet) add(n *node, st *unix.Stat_t) {
	if st.Nlink <= 1 || st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return
	}
	id := fileID{uint64(st.Dev), st.Ino}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byFile == nil {
		l.byFile = map[fileID]map[*node]struct{}{}
	}
	set := l.byFile[id]
	if set == nil {
		set = map[*node]struct{}{}
		l.byFile[id] = set
	}
	set[n] = struct{}{}
	n.mu.Lock()
	n.file = id
	n.mu.Unlock()
}

// remove forgets n (it was forgotten by the kernel).
func (l *linkSet) remove(n *node, id fileID) {
	if id == (fileID{}) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if set := l.byFile[id]; set != nil {
		delete(set, n)
		if len(set) == 0 {
			delete(l.byFile, id)
		}
	}
}

// changed drops the kernel's caches of the other names of n's file, after
// n's data or attributes changed. It does not wait: the kernel may need
// this server to drop them.
func (l *linkSet) changed(n *node) {
	n.mu.Lock()
	id := n.file
	n.mu.Unlock()
	if id == (fileID{}) {
		return
	}
	l.mu.Lock()
	var others []*node
	for o := range l.byFile[id] {
		if o != n {
			others = append(others, o)
		}
	}
	l.mu.Unlock()
	if len(others) == 0 {
		return
	}
	go func() {
		for _, o := range others {
			o.NotifyContent(0, 0)
		}
	}()
}
