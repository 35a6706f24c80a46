package oci

import (
	"fmt"
	goruntime "runtime"

	"golang.org/x/sys/unix"
)

// sysfsDir is where a box that joins a host-owned network namespace gets
// its /sys: a sysfs mounted by the driver from inside that namespace, so it
// lists the box's own interfaces. The box cannot mount one itself: mounting
// sysfs needs CAP_SYS_ADMIN over the network namespace, which belongs to
// the host's user namespace precisely so the box cannot reconfigure it.
func sysfsDir(box string) string { return box + "/sys" }

// mountSysfsIn mounts a read-only sysfs at target from inside the network
// namespace at nsPath (this process's mount namespace is unchanged).
func mountSysfsIn(nsPath, target string) error {
	nsfd, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", nsPath, err)
	}
	defer unix.Close(nsfd)
	errc := make(chan error, 1)
	go func() {
		// A thread that cannot return to the host namespace stays locked
		// and dies with this goroutine.
		goruntime.LockOSThread()
		self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			goruntime.UnlockOSThread()
			errc <- fmt.Errorf("open own netns: %w", err)
			return
		}
		defer unix.Close(self)
		if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
			goruntime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns: %w", err)
			return
		}
		merr := unix.Mount("sysfs", target, "sysfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
		if unix.Setns(self, unix.CLONE_NEWNET) == nil {
			goruntime.UnlockOSThread()
		}
		if merr != nil {
			merr = fmt.Errorf("mount sysfs of the box's netns: %w", merr)
		}
		errc <- merr
	}()
	return <-errc
}
