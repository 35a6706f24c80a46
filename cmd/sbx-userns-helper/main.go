// Command sbx-userns-helper makes a box's user namespace for the oci driver
// (idmap.Helper, run by idmap.BoxNamespace once per create). It does what
// `sbx-agent sbx-box-userns-helper` does, as a small static binary: every
// create starts it, and the agent's Go start (its size, its packages'
// init) cost several ms of each. The driver uses it when it lies beside
// the agent binary and falls back to the agent otherwise.
package main

import (
	"fmt"
	"os"

	"github.com/sbxdev/sbx/internal/idmap"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != idmap.HelperArg {
		fmt.Fprintf(os.Stderr, "sbx-userns-helper: run by the sbx daemon only (first argument %s)\n", idmap.HelperArg)
		os.Exit(2)
	}
	if err := idmap.Helper(os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "sbx-userns-helper:", err)
		os.Exit(1)
	}
}
