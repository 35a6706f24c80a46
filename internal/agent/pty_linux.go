package agent

import (
	"fmt"
	"os"

	"github.com/creack/pty"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// openPTY opens a pseudo-terminal pair sized to size (default 24x80).
func openPTY(size *sbxv1.TerminalSize) (master, slave *os.File, err error) {
	master, slave, err = pty.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("opening pty: %w", err)
	}
	if size == nil || size.GetRows() == 0 || size.GetCols() == 0 {
		size = &sbxv1.TerminalSize{Rows: 24, Cols: 80}
	}
	if err := setPTYSize(master, size); err != nil {
		master.Close()
		slave.Close()
		return nil, nil, err
	}
	return master, slave, nil
}

// setPTYSize applies size to the terminal (TIOCSWINSZ); the kernel sends the
// foreground process group SIGWINCH.
func setPTYSize(master *os.File, size *sbxv1.TerminalSize) error {
	if size.GetRows() == 0 || size.GetCols() == 0 {
		return nil
	}
	ws := &pty.Winsize{Rows: uint16(size.GetRows()), Cols: uint16(size.GetCols())}
	if err := pty.Setsize(master, ws); err != nil {
		return fmt.Errorf("resizing pty: %w", err)
	}
	return nil
}
