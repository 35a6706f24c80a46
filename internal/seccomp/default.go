package seccomp

import "slices"

// socketFamilies are the address families socket(2) may create: AF_UNIX,
// AF_INET, AF_INET6, AF_NETLINK (getaddrinfo, ip) and AF_PACKET (with
// CAP_NET_RAW, as in Docker). Everything else (AF_VSOCK, AF_ALG, AF_KEY,
// AF_XDP, AF_TIPC, AF_RDS, AF_CAN, Bluetooth...) fails with EPERM.
var socketFamilies = []uint64{1, 2, 10, 16, 17}

// Linux errno values (this file builds on every OS; x/sys/unix's values
// are the host's).
const (
	eperm  = 1
	enosys = 38
)

// Default returns the box's default profile: an allowlist in the spirit of
// Docker's default profile. Anything not listed fails with EPERM.
// Deliberately left out (so denied) among others:
//
//   - pivot_root, the new mount API (fsopen, fsmount, fsconfig,
//     fspick, open_tree, move_mount, mount_setattr), chroot-free escapes via
//     open_by_handle_at / name_to_handle_at;
//   - setns; unshare and clone with any namespace flag (argument rules
//     below); clone3 fails with ENOSYS so libc falls back to clone, whose flags
//     we can inspect;
//   - kernel attack surface: bpf, perf_event_open, userfaultfd, io_uring_*,
//     keyctl, add_key, request_key, kexec_*, init/finit/delete_module,
//     lookup_dcookie, iopl, ioperm, vm86, modify_ldt;
//   - host-global state: reboot, swapon/off, syslog, acct, settimeofday,
//     clock_settime, clock_adjtime, stime, quotactl, fanotify_init, sethostname,
//     vhangup, sysfs, _sysctl, ustat, NUMA policy calls;
//   - ptrace, process_vm_readv/writev, kcmp and pidfd_getfd. Docker allows
//     ptrace on kernels >= 4.8 (where it can no longer bypass seccomp) and
//     that would be safe for the host, but inside a box user code runs with
//     the agent's uid, so ptrace would let it subvert the agent that enforces
//     path permissions. Debuggers need a relaxed profile (future option).
//
// mount and umount2 are allowed for the agent, which mounts the FUSE
// permission layers of path policies with CAP_SYS_ADMIN before any user
// process exists; it then drops CAP_SYS_ADMIN everywhere (without it the
// kernel refuses both calls) and stacks a filter of its own that denies
// them (internal/agent/guards_linux.go).
//
// personality is limited to the harmless personas Docker allows.
//
// socket is limited to the address families sandboxed programs use (see
// socketFamilies). AF_VSOCK in particular ignores network namespaces: a box
// could bind vsock ports that collide with the host's and other boxes'
// (Docker's profile refuses it too). The check compares all 64 bits, so
// garbage in the upper half of the argument cannot smuggle a family past it.
//
// Each call returns a new Profile; callers may modify it.
func Default() Profile {
	p := Profile{
		DefaultErrno: eperm,
		Allow:        slices.Clone(allowedSyscalls),
		Rules: []Rule{
			{Name: "clone", Op: OpMaskedZero, Index: 0, Value: cloneNSFlags},
			{Name: "unshare", Op: OpMaskedZero, Index: 0, Value: cloneNSFlags | cloneNewTime},
			{Name: "clone3", Op: OpErrno, Errno: enosys},
		},
	}
	for _, f := range socketFamilies {
		p.Rules = append(p.Rules, Rule{Name: "socket", Op: OpEqual, Index: 0, Value: f})
	}
	// As Docker: PER_LINUX (0), PER_LINUX32 (0x8), UNAME26 (0x20000),
	// UNAME26|PER_LINUX32, and 0xffffffff, which only queries the persona.
	for _, persona := range []uint64{0x0, 0x8, 0x20000, 0x20008, 0xffffffff} {
		p.Rules = append(p.Rules, Rule{Name: "personality", Op: OpEqual, Index: 0, Value: persona})
	}
	return p
}

// cloneNSFlags are CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET:
// clone and unshare are allowed only without them. unshare refuses
// CLONE_NEWTIME (cloneNewTime) too; in clone's flags that bit is part of
// CSIGNAL (the exit signal), so clone cannot ask for a time namespace.
const (
	cloneNSFlags = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
	cloneNewTime = 0x00000080
)

// allowedSyscalls are allowed unconditionally. Names with no number on the
// architecture compiled for (other arches, 32-bit ABIs) are skipped.
var allowedSyscalls = []string{
	// files and directories
	"access", "chdir", "chmod", "chown", "chown32", "close", "close_range", "copy_file_range",
	"creat", "dup", "dup2", "dup3", "faccessat", "faccessat2", "fadvise64", "fadvise64_64",
	"fallocate", "fchdir", "fchmod", "fchmodat", "fchmodat2", "fchown", "fchown32", "fchownat",
	"fcntl", "fcntl64", "fdatasync", "fgetxattr", "flistxattr", "flock", "fremovexattr",
	"fsetxattr", "fstat", "fstat64", "fstatat64", "newfstatat", "oldfstat", "oldlstat", "oldstat", "fstatfs", "fstatfs64", "fsync", "ftruncate",
	"ftruncate64", "futimesat", "getcwd", "getdents", "getdents64", "getxattr", "getxattrat",
	"inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch", "fanotify_mark",
	"lchown", "lchown32", "lgetxattr", "link", "linkat", "listxattr", "listxattrat", "llistxattr",
	"_llseek", "lremovexattr", "lseek", "lsetxattr", "lstat", "lstat64", "mkdir", "mkdirat",
	"mknod", "mknodat", "open", "openat", "openat2", "pread64", "preadv", "preadv2", "pwrite64",
	"pwritev", "pwritev2", "read", "readahead", "readlink", "readlinkat", "readv", "removexattr",
	"removexattrat", "rename", "renameat", "renameat2", "rmdir", "sendfile", "sendfile64",
	"setxattr", "setxattrat", "splice", "stat", "stat64", "statfs", "statfs64", "statx",
	"symlink", "symlinkat", "sync", "sync_file_range", "sync_file_range2", "syncfs", "tee",
	"truncate", "truncate64", "umask", "unlink", "unlinkat", "utime", "utimensat",
	"utimensat_time64", "utimes", "vmsplice", "write", "writev", "chroot",
	// the agent's FUSE mounts (see above)
	"mount", "umount2",
	"arm_fadvise64_64", "arm_sync_file_range", "cachestat",
	// async I/O (not io_uring)
	"io_cancel", "io_destroy", "io_getevents", "io_pgetevents", "io_pgetevents_time64",
	"io_setup", "io_submit", "ioprio_get", "ioprio_set",
	// polling, events, pipes
	"epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait", "epoll_pwait2",
	"epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "pipe", "pipe2", "poll", "ppoll",
	"ppoll_time64", "pselect6", "pselect6_time64", "select", "_newselect", "signalfd", "signalfd4",
	"timerfd_create", "timerfd_gettime", "timerfd_gettime64", "timerfd_settime",
	"timerfd_settime64", "ioctl",
	// memory
	"brk", "madvise", "membarrier", "memfd_create", "mincore", "mlock", "mlock2", "mlockall",
	"mmap", "mmap2", "mprotect", "mremap", "msync", "munlock", "munlockall", "munmap",
	"pkey_alloc", "pkey_free", "pkey_mprotect", "remap_file_pages", "map_shadow_stack", "mseal",
	// processes, threads, signals
	"arch_prctl", "capget", "capset", "execve", "execveat", "exit", "exit_group", "fork",
	"futex", "futex_requeue", "futex_time64", "futex_wait", "futex_waitv", "futex_wake",
	"get_robust_list", "get_thread_area", "getcpu", "getegid", "getegid32", "geteuid",
	"geteuid32", "getgid", "getgid32", "getgroups", "getgroups32", "getitimer", "getpgid",
	"getpgrp", "getpid", "getppid", "getpriority", "getresgid", "getresgid32", "getresuid",
	"getresuid32", "getrlimit", "getrusage", "getsid", "gettid", "getuid", "getuid32", "kill",
	"pidfd_open", "pidfd_send_signal", "prctl", "prlimit64", "process_mrelease", "restart_syscall",
	"rseq", "rt_sigaction", "rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn",
	"rt_sigsuspend", "rt_sigtimedwait", "rt_sigtimedwait_time64", "rt_tgsigqueueinfo",
	"sched_get_priority_max", "sched_get_priority_min", "sched_getaffinity", "sched_getattr",
	"sched_getparam", "sched_getscheduler", "sched_rr_get_interval",
	"sched_rr_get_interval_time64", "sched_setaffinity", "sched_setattr", "sched_setparam",
	"sched_setscheduler", "sched_yield", "seccomp", "set_robust_list", "set_thread_area",
	"set_tid_address", "setfsgid", "setfsgid32", "setfsuid", "setfsuid32", "setgid", "setgid32",
	"setgroups", "setgroups32", "setitimer", "setpgid", "setpriority", "setregid", "setregid32",
	"setresgid", "setresgid32", "setresuid", "setresuid32", "setreuid", "setreuid32",
	"setrlimit", "setsid", "setuid", "setuid32", "sigaltstack", "sigprocmask", "sigreturn",
	"tgkill", "tkill", "ugetrlimit", "vfork", "wait4", "waitid", "waitpid", "pause",
	"landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self",
	"breakpoint", "cacheflush", "set_tls",
	// time
	"alarm", "clock_getres", "clock_getres_time64", "clock_gettime", "clock_gettime64",
	"clock_nanosleep", "clock_nanosleep_time64", "gettimeofday", "nanosleep", "time",
	"timer_create", "timer_delete", "timer_getoverrun", "timer_gettime", "timer_gettime64",
	"timer_settime", "timer_settime64", "times", "adjtimex",
	// IPC
	"ipc", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive", "mq_timedreceive_time64",
	"mq_timedsend", "mq_timedsend_time64", "mq_unlink", "msgctl", "msgget", "msgrcv", "msgsnd",
	"semctl", "semget", "semop", "semtimedop", "semtimedop_time64", "shmat", "shmctl", "shmdt",
	"shmget",
	// sockets
	"accept", "accept4", "bind", "connect", "getpeername", "getsockname", "getsockopt", "listen",
	"recv", "recvfrom", "recvmmsg", "recvmmsg_time64", "recvmsg", "send", "sendmmsg", "sendmsg",
	"sendto", "setsockopt", "shutdown", "socketcall", "socketpair",
	// system information
	"getrandom", "sysinfo", "uname",
}
