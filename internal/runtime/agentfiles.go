package runtime

import (
	"fmt"
	"net"
	"os"
)

// AgentFDArgs are the agent's flags naming the fds AgentFiles.Extra gives it.
var AgentFDArgs = []string{"--listen-fd", "3", "--ready-fd", "4", "--exec-fd", "5"}

// AgentFDCount is how many fds AgentFDArgs names (3 to 3+AgentFDCount-1);
// a driver's own extra fds for the agent follow.
const AgentFDCount = 3

// AgentFiles are what a driver hands a box's agent: listening sockets for its
// API and for framed execs, made before it starts so that a Dial never races
// its start, and a pipe on which it says it serves.
type AgentFiles struct {
	// Extra are the agent's fds 3 (the API socket), 4 (the ready pipe's
	// write end) and 5 (the exec socket), in exec.Cmd.ExtraFiles order.
	Extra []*os.File
	// Ready is the ready pipe's read end (see agentconn.AwaitReady).
	Ready *os.File
}

// NewAgentFiles listens on Unix sockets at apiSock and execSock (their
// files stay when the daemon's copies close) and makes the ready pipe.
func NewAgentFiles(apiSock, execSock string) (_ *AgentFiles, err error) {
	var files []*os.File
	defer func() {
		if err != nil {
			for _, f := range files {
				f.Close()
			}
		}
	}()
	for _, path := range []string{apiSock, execSock} {
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			return nil, fmt.Errorf("listen on agent socket: %w", err)
		}
		ln.SetUnlinkOnClose(false)
		f, err := ln.File()
		ln.Close()
		if err != nil {
			return nil, fmt.Errorf("agent socket fd: %w", err)
		}
		files = append(files, f)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("agent ready pipe: %w", err)
	}
	return &AgentFiles{Extra: []*os.File{files[0], w, files[1]}, Ready: r}, nil
}

// CloseExtra closes the daemon's copies of Extra, once the agent has its
// own: then only the agent holds the pipe's write end, and its exit reads
// as EOF on Ready.
func (a *AgentFiles) CloseExtra() {
	for _, f := range a.Extra {
		f.Close()
	}
}
