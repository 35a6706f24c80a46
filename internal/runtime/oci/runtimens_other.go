//go:build !linux

package oci

import "os/exec"

// runCmd runs cmd (namespaces are Linux's).
func runCmd(cmd *exec.Cmd, _, _ string) error { return cmd.Run() }

// RuntimeRunner returns a function running commands as they are.
func RuntimeRunner(string) (func(*exec.Cmd) error, error) {
	return func(cmd *exec.Cmd) error { return cmd.Run() }, nil
}
