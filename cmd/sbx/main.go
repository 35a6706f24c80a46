// Command sbx is the sbx daemon (`sbx serve`) and its command-line client.
package main

import (
	"context"
	"os"

	"github.com/sbxdev/sbx/internal/cli"
)

func main() {
	os.Exit(cli.Main(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
