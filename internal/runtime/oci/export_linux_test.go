package oci

// ShareFileTable makes d act as on a host whose file table it could not make
// a per-box cost (nokmem, a read-only /proc/sys) with fs.file-max max, so
// that boxes get the fallback RLIMIT_NOFILE (boxNoFile).
func ShareFileTable(d *Driver, max int64) {
	d.files = fileTable{max: max, reason: "test"}
}

// BoxNoFile is the RLIMIT_NOFILE d gives a box with the given pids limit.
func BoxNoFile(d *Driver, pids int64) uint64 { return d.boxNoFile(pids) }

// OnStarted makes Create call f once the runtime has started a box, before
// its agent is ready; the returned func removes it.
func OnStarted(f func(id string)) (restore func()) {
	testHookStarted = f
	return func() { testHookStarted = nil }
}

// NSHelper is the binary d runs to make boxes' user namespaces.
func NSHelper(d *Driver) string { return d.nsHelper }
