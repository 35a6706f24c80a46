package server

import (
	"context"
	"fmt"
	"time"

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
	// accessTenant: it works on the caller's tenant's own image store,
	// volumes or codebases (each tenant has its own; names are per
	// tenant), or makes images in that store (builds, snapshots: a
	// snapshot's sandbox, a sync's sandbox resolve as for accessScoped).
	// Scoped tokens may not: they manage child sandboxes only.
	accessTenant
	// accessAdmin: it describes every tenant: the daemon's admin token
	// only (and the single-user owner, who is told there are no tenants).
	accessAdmin
	// accessObserve: a read-only view that the handler filters by the
	// Principal (sandbox.CanSee): a tenant sees its own sandboxes, a scoped
	// token its children, the admin token every tenant's.
	accessObserve
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
	sbxv1connect.SandboxServiceUpdateSandboxProcedure:     accessScoped,
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
	sbxv1connect.SandboxServiceLogsProcedure:              accessScoped,
	sbxv1connect.SandboxServiceWaitProcedure:              accessScoped,
	sbxv1connect.PortServiceGetPortProcedure:              accessScoped,
	sbxv1connect.PortServiceListPortsProcedure:            accessScoped,
	sbxv1connect.SessionServiceCreateSessionProcedure:     accessScoped,
	sbxv1connect.SessionServiceSessionExecProcedure:       accessScoped,
	sbxv1connect.SessionServiceListSessionsProcedure:      accessScoped,
	sbxv1connect.SessionServiceCloseSessionProcedure:      accessScoped,
	sbxv1connect.CodeServiceRunCodeProcedure:              accessScoped,
	sbxv1connect.CodeServiceCreateContextProcedure:        accessScoped,
	sbxv1connect.CodeServiceListContextsProcedure:         accessScoped,
	sbxv1connect.ProcessServiceStartProcessProcedure:      accessScoped,
	sbxv1connect.ProcessServiceListProcessesProcedure:     accessScoped,
	sbxv1connect.ProcessServiceGetProcessProcedure:        accessScoped,
	sbxv1connect.ProcessServiceConnectProcessProcedure:    accessScoped,
	sbxv1connect.ProcessServiceSendProcessInputProcedure:  accessScoped,
	sbxv1connect.ProcessServiceSignalProcessProcedure:     accessScoped,
	sbxv1connect.ProcessServiceWaitProcessProcedure:       accessScoped,
	sbxv1connect.ProcessServiceRemoveProcessProcedure:     accessScoped,
	sbxv1connect.CodeServiceCloseContextProcedure:         accessScoped,
	sbxv1connect.SandboxServiceSnapshotSandboxProcedure:   accessTenant, // makes an image
	sbxv1connect.CodebaseServiceSyncCodebaseProcedure:     accessTenant,
	sbxv1connect.CodebaseServiceCreateCodebaseProcedure:   accessTenant,
	sbxv1connect.CodebaseServiceListCodebasesProcedure:    accessTenant,
	sbxv1connect.CodebaseServiceGetCodebaseProcedure:      accessTenant,
	sbxv1connect.CodebaseServiceDownloadCodebaseProcedure: accessTenant,
	sbxv1connect.CodebaseServiceDeleteCodebaseProcedure:   accessTenant,
	sbxv1connect.ImageServicePullImageProcedure:           accessTenant,
	sbxv1connect.ImageServiceImportImageProcedure:         accessTenant,
	sbxv1connect.ImageServiceExportImageProcedure:         accessTenant,
	sbxv1connect.ImageServiceListImagesProcedure:          accessTenant,
	sbxv1connect.ImageServiceGetImageProcedure:            accessTenant,
	sbxv1connect.ImageServiceTagImageProcedure:            accessTenant,
	sbxv1connect.ImageServiceRemoveImageProcedure:         accessTenant,
	sbxv1connect.ImageServicePruneImagesProcedure:         accessTenant,
	sbxv1connect.ImageServiceBuildImageProcedure:          accessTenant,
	sbxv1connect.VolumeServiceCreateVolumeProcedure:       accessTenant,
	sbxv1connect.VolumeServiceListVolumesProcedure:        accessTenant,
	sbxv1connect.VolumeServiceGetVolumeProcedure:          accessTenant,
	sbxv1connect.VolumeServiceRemoveVolumeProcedure:       accessTenant,
	sbxv1connect.TenantServiceGetTenantProcedure:          accessAny, // the caller's own
	sbxv1connect.TenantServiceListTenantsProcedure:        accessAdmin,
	sbxv1connect.ObserveServiceEventsProcedure:            accessObserve,
	sbxv1connect.ObserveServiceStatsProcedure:             accessObserve,
}

// admit checks procedure's rule against ctx's Principal.
func admit(ctx context.Context, procedure string) error {
	a, ok := rpcAccess[procedure]
	if !ok {
		return connect.NewError(connect.CodePermissionDenied, fmt.Errorf("%s has no tenancy rule: refused", procedure))
	}
	p := tenant.FromContext(ctx)
	switch {
	case p.Admin && a != accessAny && a != accessAdmin && a != accessObserve:
		// The admin token is no tenant: it must never act as the owner "".
		return toConnect(fmt.Errorf("%s: the admin token manages tenants only; use a tenant's token: %w", procedure, errdefs.ErrPermissionDenied))
	case a == accessAdmin && !p.Admin && (p.Tenant != "" || p.Scope != ""):
		return toConnect(fmt.Errorf("%s: needs the daemon's admin token: %w", procedure, errdefs.ErrPermissionDenied))
	case p.Only != "" && !envdProcedures[procedure]:
		return toConnect(fmt.Errorf("%s: a sandbox's E2B envd token reaches that sandbox's envd and code interpreter only: %w", procedure, errdefs.ErrPermissionDenied))
	case a == accessTenant && p.Scope != "":
		return toConnect(fmt.Errorf("%s: a scoped sandbox token manages child sandboxes only: %w", procedure, errdefs.ErrPermissionDenied))
	}
	return nil
}

// tenancyInterceptor applies rpcAccess to every RPC, unary and streaming,
// and has the request's Observer (observe.go) count it.
type tenancyInterceptor struct{}

func (tenancyInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		start := time.Now()
		if err := admit(ctx, req.Spec().Procedure); err != nil {
			observerFrom(ctx).called(ctx, req.Spec().Procedure, nil, 0, err)
			return nil, err
		}
		resp, err := next(ctx, req)
		observerFrom(ctx).called(ctx, req.Spec().Procedure, req.Any(), time.Since(start), err)
		return resp, err
	}
}

func (tenancyInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (tenancyInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		start := time.Now()
		o := observerFrom(ctx)
		if err := admit(ctx, conn.Spec().Procedure); err != nil {
			o.called(ctx, conn.Spec().Procedure, nil, 0, err)
			return err
		}
		if o == nil {
			return next(ctx, conn)
		}
		fc := &firstMessage{StreamingHandlerConn: conn}
		err := next(ctx, fc)
		o.called(ctx, conn.Spec().Procedure, fc.first, time.Since(start), err)
		return err
	}
}
