//go:build unix

package sbx

import "syscall"

// oNoFollow makes an open fail on a final symlink instead of following it.
const oNoFollow = syscall.O_NOFOLLOW

// oNonBlock makes opening a FIFO return at once instead of waiting for a writer.
const oNonBlock = syscall.O_NONBLOCK
