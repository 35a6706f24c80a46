// Command sbx-agent is the init process of every sandbox: it serves the
// agent API to the sbx daemon and runs commands, terminals and file
// operations inside the sandbox. See internal/agent.
//
//	sbx-agent [--listen-fd N | --listen unix:/path | --listen tls:host:port] [--ready-fd N] [--exec-fd N | --exec unix:/path | --exec tls:host:port] [--tls-dir DIR] [--seccomp] [--nofile N] [--user-cgroup-fd N]... [-- CMD ARGS...]
//
// Run as `sbx-agent sbx-install BINDIR TLSSRC TLSDST` (a Kubernetes pod's
// init container) it installs itself for the box's container (agent.Install).
//
// Run by the daemon on the host as `sbx-agent sbx-box-userns-helper ...`,
// it makes a box's user namespace instead (idmap.Helper).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"

	"github.com/sbxdev/sbx/internal/agent"
	"github.com/sbxdev/sbx/internal/idmap"
	"github.com/sbxdev/sbx/internal/podfw"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == agent.FileWriterArg {
		if err := agent.FileWriterHelper(); err != nil {
			fmt.Fprintln(os.Stderr, "sbx-agent: file writer:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == agent.InstallArg {
		if err := agent.Install(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "sbx-agent: install:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == podfw.Arg {
		r, err := podfw.Parse(os.Args[2:])
		if err == nil {
			err = podfw.Apply(r)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "sbx-agent: pod firewall:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == idmap.HelperArg {
		if err := idmap.Helper(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "sbx-agent: box user namespace:", err)
			os.Exit(1)
		}
		return
	}
	opts, err := parseArgs(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "sbx-agent:", err)
		os.Exit(2)
	}
	if err := agent.Run(context.Background(), opts); err != nil {
		fmt.Fprintln(os.Stderr, "sbx-agent:", err)
		os.Exit(1)
	}
}

func parseArgs(args []string) (agent.Options, error) {
	fs := flag.NewFlagSet("sbx-agent", flag.ContinueOnError)
	opts := agent.Options{}
	fs.IntVar(&opts.ListenFD, "listen-fd", -1, "serve on this inherited listening socket `fd`")
	fs.IntVar(&opts.ReadyFD, "ready-fd", -1, "write one byte on this inherited `fd` and close it once serving")
	fs.IntVar(&opts.ExecFD, "exec-fd", -1, "serve framed execs on this inherited listening socket `fd`")
	fs.BoolVar(&opts.Seccomp, "seccomp", false, "install the sandbox's seccomp filter before anything else")
	fs.Uint64Var(&opts.NoFile, "nofile", 0, "set RLIMIT_NOFILE (soft and hard) to `n` for the agent and everything it starts (0: soft up to hard)")
	fs.Func("user-cgroup-fd", "fork user processes in the cgroup whose inherited `tasks` file is `fd` (repeatable)", func(v string) error {
		fd, err := strconv.Atoi(v)
		if err != nil || fd < 0 {
			return fmt.Errorf("not an fd: %q", v)
		}
		opts.UserCgroupFDs = append(opts.UserCgroupFDs, fd)
		return nil
	})
	fs.StringVar(&opts.Listen, "listen", "", "serve on this `address` (unix:/path, tls:host:port)")
	fs.StringVar(&opts.ExecListen, "exec", "", "serve framed execs on this `address` (unix:/path, tls:host:port)")
	fs.StringVar(&opts.TLSDir, "tls-dir", "", "read (and remove) the tls: listeners' certificates and key from `dir`")
	version := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return opts, err
	}
	if *version {
		fmt.Println(agent.Version)
		os.Exit(0)
	}
	opts.Entrypoint = fs.Args()
	return opts, nil
}
