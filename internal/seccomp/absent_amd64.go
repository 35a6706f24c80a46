package seccomp

// nativeAbsent lists syscalls of other architectures and 32-bit ABIs that
// have no x86_64 number (32-bit variants: *32, *64, *_time64, multiplexers;
// other arches' calls), as far as profiles name them. Compile skips them and
// NativeNames drops them; a name in neither amd64Numbers nor here is a typo
// and an error. Newer x86_64 syscalls never go here, even if the host's
// libseccomp does not know them yet.
var nativeAbsent = setOf(
	"chown32", "fadvise64_64", "fchown32", "fcntl64", "fstat64", "fstatat64", "oldfstat",
	"oldlstat", "oldstat", "fstatfs64", "ftruncate64", "lchown32", "_llseek", "lstat64",
	"sendfile64", "stat64", "statfs64", "sync_file_range2", "truncate64", "utimensat_time64",
	"arm_fadvise64_64", "arm_sync_file_range", "io_pgetevents_time64", "ppoll_time64",
	"pselect6_time64", "_newselect", "timerfd_gettime64", "timerfd_settime64", "mmap2",
	"futex_time64", "getegid32", "geteuid32", "getgid32", "getgroups32", "getresgid32",
	"getresuid32", "getuid32", "rt_sigtimedwait_time64", "sched_rr_get_interval_time64",
	"setfsgid32", "setfsuid32", "setgid32", "setgroups32", "setregid32", "setresgid32",
	"setresuid32", "setreuid32", "setuid32", "sigprocmask", "sigreturn", "ugetrlimit", "waitpid",
	"breakpoint", "cacheflush", "set_tls", "clock_getres_time64", "clock_gettime64",
	"clock_nanosleep_time64", "timer_gettime64", "timer_settime64", "ipc",
	"mq_timedreceive_time64", "mq_timedsend_time64", "semtimedop_time64", "recv",
	"recvmmsg_time64", "send", "socketcall",
)

func setOf(names ...string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}
