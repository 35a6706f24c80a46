//go:build !unix

package sbx

// oNoFollow is 0 where there is no O_NOFOLLOW: copyFile's same-file check
// still refuses a file swapped since the walk.
const oNoFollow = 0

// oNonBlock is 0 where there is no O_NONBLOCK: readIgnoreFile still refuses
// anything but a regular file before opening it.
const oNonBlock = 0
