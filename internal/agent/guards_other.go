//go:build !linux

package agent

import (
	"errors"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

type lockdownState struct{ enabled bool }

func (s *Server) lockdown() error { return nil }

func (s *Server) mountGuards(ps []*sbxv1.PathPolicy) error {
	if len(ps) == 0 {
		return nil
	}
	return connect.NewError(connect.CodeUnimplemented, errors.New("configure: path policies need Linux"))
}
