//go:build unix

package sbx

import "syscall"

// oNoFollow makes an open fail on a final symlink instead of following it.
const oNoFollow = syscall.O_NOFOLLOW
