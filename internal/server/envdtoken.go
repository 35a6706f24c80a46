package server

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/sbxdev/sbx/api/gen/sbx/v1/sbxv1connect"
	"github.com/sbxdev/sbx/internal/atomicfile"
	"github.com/sbxdev/sbx/internal/tenant"
)

// A sandbox's E2B envd access token (the envdAccessToken and
// trafficAccessToken the E2B API returns; E2B's SDKs send it as
// X-Access-Token to envd and the code interpreter) is the sandbox's own
// secret, not the caller's API key: a program in one sandbox, or anything
// it talks to, may hold it, and it must open nothing else. It is
//
//	sbx_envd.<sandbox-id>.<base64url HMAC-SHA256(key, "e2b-envd\x00" + sandbox-id)>
//
// with the daemon's envd key (random, 32 bytes, kept in its data directory,
// so tokens survive a restart; nothing per sandbox is stored). It is valid
// while that sandbox exists and acts as a Principal that sees it alone
// (tenant.Principal.Only) and may call only envdProcedures: the RPCs the
// E2B API makes envd and the code interpreter of. It opens no port through
// the proxy, observes nothing, and reaches no other endpoint.
const envdTokenPrefix = "sbx_envd."

// EnvdKeyFile is the envd key's file in the daemon's data directory.
const EnvdKeyFile = "e2b-envd.key"

// envdKeyLen is the envd key's length.
const envdKeyLen = 32

// LoadEnvdKey returns the envd key in dir, making it on the first start.
func LoadEnvdKey(dir string) ([]byte, error) {
	p := filepath.Join(dir, EnvdKeyFile)
	key, err := os.ReadFile(p)
	switch {
	case err == nil && len(key) == envdKeyLen:
		return key, nil
	case err == nil:
		return nil, fmt.Errorf("reading the E2B envd key %s: %d bytes, want %d (remove it to make a new one; sandboxes' envd tokens change)", p, len(key), envdKeyLen)
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("reading the E2B envd key: %w", err)
	}
	key = make([]byte, envdKeyLen)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("making the E2B envd key: %w", err)
	}
	if err := atomicfile.WriteFile(p, key, 0o600); err != nil {
		return nil, fmt.Errorf("writing the E2B envd key: %w", err)
	}
	return key, nil
}

// EnvdToken returns sandbox id's envd access token under key.
func EnvdToken(key []byte, id string) string {
	return envdTokenPrefix + id + "." + base64.RawURLEncoding.EncodeToString(envdMAC(key, id))
}

func envdMAC(key []byte, id string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("e2b-envd\x00" + id))
	return m.Sum(nil)
}

// envdSandbox returns the sandbox tok is the envd token of; false when tok
// is no envd token or its MAC is wrong.
func envdSandbox(key []byte, tok string) (string, bool) {
	rest, ok := strings.CutPrefix(tok, envdTokenPrefix)
	if !ok || len(key) == 0 {
		return "", false
	}
	i := strings.LastIndexByte(rest, '.')
	if i <= 0 {
		return "", false
	}
	id := rest[:i]
	mac, err := base64.RawURLEncoding.DecodeString(rest[i+1:])
	if err != nil || !hmac.Equal(mac, envdMAC(key, id)) {
		return "", false
	}
	return id, true
}

// envdPrincipal returns who an envd token acts as: its sandbox's owner,
// seeing that sandbox alone. False for anything else, a sandbox that no
// longer exists, or a tenant no longer in the tenants file.
func (f *Front) envdPrincipal(tok string) (tenant.Principal, bool) {
	if f.mgr == nil || f.cfg.BoxEndpoint {
		return tenant.Principal{}, false
	}
	id, ok := envdSandbox(f.cfg.EnvdKey, tok)
	if !ok {
		return tenant.Principal{}, false
	}
	owner, ok := f.mgr.Owner(id)
	if !ok {
		return tenant.Principal{}, false
	}
	p := tenant.Principal{Tenant: owner, Only: id}
	if owner != "" {
		if f.cfg.Tenants == nil {
			return tenant.Principal{}, false
		}
		q, ok := f.cfg.Tenants.Current().Quotas(owner)
		if !ok {
			return tenant.Principal{}, false
		}
		p.Quotas = q
	}
	return p, true
}

// envdProcedures are the RPCs an envd token may call: what internal/e2b
// makes of envd's filesystem and process services and of the code
// interpreter, on the token's sandbox.
var envdProcedures = map[string]bool{
	sbxv1connect.SandboxServiceVersionProcedure:          true,
	sbxv1connect.SandboxServiceGetSandboxProcedure:       true,
	sbxv1connect.SandboxServiceReadFileProcedure:         true,
	sbxv1connect.SandboxServiceWriteFileProcedure:        true,
	sbxv1connect.SandboxServiceListDirProcedure:          true,
	sbxv1connect.SandboxServiceStatProcedure:             true,
	sbxv1connect.SandboxServiceMakeDirProcedure:          true,
	sbxv1connect.SandboxServiceRemoveProcedure:           true,
	sbxv1connect.SandboxServiceRenameProcedure:           true,
	sbxv1connect.ProcessServiceStartProcessProcedure:     true,
	sbxv1connect.ProcessServiceListProcessesProcedure:    true,
	sbxv1connect.ProcessServiceGetProcessProcedure:       true,
	sbxv1connect.ProcessServiceConnectProcessProcedure:   true,
	sbxv1connect.ProcessServiceSendProcessInputProcedure: true,
	sbxv1connect.ProcessServiceSignalProcessProcedure:    true,
	sbxv1connect.ProcessServiceWaitProcessProcedure:      true,
	sbxv1connect.CodeServiceRunCodeProcedure:             true,
	sbxv1connect.CodeServiceCreateContextProcedure:       true,
	sbxv1connect.CodeServiceListContextsProcedure:        true,
	sbxv1connect.CodeServiceCloseContextProcedure:        true,
}

// envdPathAllowed reports whether an envd token may send an API request
// to path (only envdProcedures' paths: no /exec, /mcp, /metrics, ...).
func envdPathAllowed(path string) bool {
	return envdProcedures[path]
}
