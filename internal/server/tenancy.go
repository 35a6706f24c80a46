package server

import (
	"context"
	"fmt"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/tenant"
)

// access is how an RPC treats the caller's Principal.
type access int

const (
	// accessAny: anyone authenticated (it names nothing of anyone's).
	accessAny access = iota + 1
	// accessScoped: it names sandboxes, sessions or code contexts, and the
	// manager and codeexec resolve every such name as the caller's
	// Principal sees it (another tenant's, or for a scoped token anything
	// but its own children, answers exactly like a missing one).
	accessScoped
	// accessOwner: it reads or changes the daemon-wide image, volume or
	// codebase stores, which are not kept per tenant yet: only the
	// single-user owner (no tenant, no scope) may call it.
	accessOwner
)

// rpcAccess lists every RPC the daemon serves. An RPC missing here is
// refused to everyone (TestEveryRPCHasATenancyRule fails first).
var rpcAccess = map[string]access{
	sbxv1connect.SandboxServiceVersionProcedure:           accessAny,
	sbxv1connect.SandboxServiceCreateSandboxProcedure:     accessScoped,
	sbxv1connect.SandboxServiceGetSandboxProcedure:        accessScoped,
	sbxv1connect.SandboxServiceListSandboxesProcedure:     accessScoped,
	sbxv1connect.SandboxServiceStopSandboxProcedure:       accessScoped,
	sbxv1connect.SandboxServiceStartSandboxProcedure:      accessScoped,
	sbxv1connect.SandboxServiceDestroySandboxProcedure:    accessScoped,
	sbxv1connect.SandboxServiceUpdateNetworkProcedure:     accessScoped,
	sbxv1connect.SandboxServiceExecProcedure:              accessScoped,
	sbxv1connect.SandboxServiceExecInteractiveProcedure:   accessScoped,
	sbxv1connect.SandboxServiceReadFileProcedure:          accessScoped,
	sbxv1connect.SandboxServiceWriteFileProcedure:         accessScoped,
	sbxv1connect.SandboxServiceListDirProcedure:           accessScoped,
	sbxv1connect.SandboxServiceStatProcedure:              accessScoped,
	sbxv1connect.SandboxServiceMakeDirProcedure:           accessScoped,
	sbxv1connect.SandboxServiceRemoveProcedure:            accessScoped,
	sbxv1connect.SandboxServiceRenameProcedure:            accessScoped,
	sbxv1connect.SandboxServiceUploadTarProcedure:         accessScoped,
	sbxv1connect.SandboxServiceDownloadTarProcedure:       accessScoped,
	sbxv1connect.PortServiceGetPortProcedure:              accessScoped,
	sbxv1connect.PortServiceListPortsProcedure:            accessScoped,
	sbxv1connect.SessionServiceCreateSessionProcedure:     accessScoped,
	sbxv1connect.SessionServiceSessionExecProcedure:       accessScoped,
	sbxv1connect.SessionServiceListSessionsProcedure:      accessScoped,
	sbxv1connect.SessionServiceCloseSessionProcedure:      accessScoped,
	sbxv1connect.CodeServiceRunCodeProcedure:              accessScoped,
	sbxv1connect.CodeServiceCreateContextProcedure:        accessScoped,
	sbxv1connect.CodeServiceListContextsProcedure:         accessScoped,
	sbxv1connect.CodeServiceCloseContextProcedure:         accessScoped,
	sbxv1connect.SandboxServiceSnapshotSandboxProcedure:   accessOwner, // makes an image
	sbxv1connect.CodebaseServiceSyncCodebaseProcedure:     accessOwner,
	sbxv1connect.CodebaseServiceCreateCodebaseProcedure:   accessOwner,
	sbxv1connect.CodebaseServiceListCodebasesProcedure:    accessOwner,
	sbxv1connect.CodebaseServiceGetCodebaseProcedure:      accessOwner,
	sbxv1connect.CodebaseServiceDownloadCodebaseProcedure: accessOwner,
	sbxv1connect.CodebaseServiceDeleteCodebaseProcedure:   accessOwner,
	sbxv1connect.ImageServicePullImageProcedure:           accessOwner,
	sbxv1connect.ImageServiceImportImageProcedure:         accessOwner,
	sbxv1connect.ImageServiceExportImageProcedure:         accessOwner,
	sbxv1connect.ImageServiceListImagesProcedure:          accessOwner,
	sbxv1connect.ImageServiceGetImageProcedure:            accessOwner,
	sbxv1connect.ImageServiceTagImageProcedure:            accessOwner,
	sbxv1connect.ImageServiceRemoveImageProcedure:         accessOwner,
	sbxv1connect.ImageServicePruneImagesProcedure:         accessOwner,
	sbxv1connect.ImageServiceBuildImageProcedure:          accessOwner,
	sbxv1connect.VolumeServiceCreateVolumeProcedure:       accessOwner,
	sbxv1connect.VolumeServiceListVolumesProcedure:        accessOwner,
	sbxv1connect.VolumeServiceGetVolumeProcedure:          accessOwner,
	sbxv1connect.VolumeServiceRemoveVolumeProcedure:       accessOwner,
}

// admit checks procedure's rule against ctx's Principal.
func admit(ctx context.Context, procedure string) error {
	a, ok := rpcAccess[procedure]
	if !ok {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%s has no tenancy rule: refused", procedure))
	}
	if p := tenant.FromContext(ctx); a == accessOwner && (p.Tenant != "" || p.Scope != "") {
		what := "tenants"
		if p.Scope != "" {
			what = "scoped sandbox tokens"
		}
		return toConnect(fmt.Errorf("%s: not available to %s on this daemon (images, volumes and codebases are the daemon owner's; tenants use the %q image): %w",
			procedure, what, "host", errdefs.ErrPermissionDenied))
	}
	return nil
}

// tenancyInterceptor applies rpcAccess to every RPC, unary and streaming.
type tenancyInterceptor struct{}

func (tenancyInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if err := admit(ctx, req.Spec().Procedure); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (tenancyInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (tenancyInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if err := admit(ctx, conn.Spec().Procedure); err != nil {
			return err
		}
		return next(ctx, conn)
	}
}
