package server

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// Calls whose back ends are still being built answer Unimplemented with a
// reason rather than pretending.

func (s *Server) UpdateNetwork(context.Context, *connect.Request[sbxv1.UpdateNetworkRequest]) (*connect.Response[sbxv1.UpdateNetworkResponse], error) {
	return nil, connect.NewError(connect.CodeUnimplemented, errors.New("network policies are not implemented yet: sandboxes have loopback only"))
}
