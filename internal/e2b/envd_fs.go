package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sbxdev/sbx/api/gen/e2b/filesystem"
	"github.com/sbxdev/sbx/api/gen/e2b/filesystem/filesystemconnect"
	"github.com/sbxdev/sbx/api/gen/e2b/process/processconnect"
	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
)

// call is who a sandbox request acts as and which sandbox it is for.
type call struct {
	c       *clients
	sandbox string
}

type callKey struct{}

func withCall(ctx context.Context, c call) context.Context {
	return context.WithValue(ctx, callKey{}, c)
}

func callOf(ctx context.Context) call {
	c, _ := ctx.Value(callKey{}).(call)
	return c
}

// maxEnvdMessage bounds one message to envd's Connect services, after
// decompression.
const maxEnvdMessage = 4 << 20

// envdMux serves envd's Connect services and its HTTP endpoints.
func (h *Handler) envdMux() http.Handler {
	mux := http.NewServeMux()
	// A message is read whole, and gzip expanded, before a handler sees
	// it: bound both (Connect's default is no bound: four 1 MiB gzipped
	// Start requests of zeros grew the daemon by 14 GiB;
	// TestE2BEnvdRequestBounds). The largest envd message is a stdin chunk.
	opts := connect.WithReadMaxBytes(maxEnvdMessage)
	mux.Handle(filesystemconnect.NewFilesystemHandler(&fsServer{h: h}, opts))
	mux.Handle(processconnect.NewProcessHandler(&procServer{h: h}, opts))
	mux.HandleFunc("GET /files", h.getFile)
	mux.HandleFunc("POST /files", h.postFile)
	mux.HandleFunc("GET /health", h.health)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotImplemented, fmt.Sprintf("envd %s %s is not part of sbx's E2B-compatible API (docs/E2B.md lists what is)", r.Method, r.URL.Path))
	})
	return mux
}

// health answers envd's GET /health: 204 while the sandbox runs, 502
// (what E2B's proxy answers for a sandbox that is gone or paused, and what
// the SDK's isRunning reads as false) otherwise, a sandbox of someone
// else's included.
func (h *Handler) health(w http.ResponseWriter, r *http.Request) {
	cl := callOf(r.Context())
	resp, err := cl.c.sandboxes.GetSandbox(r.Context(), connect.NewRequest(&sbxv1.GetSandboxRequest{Sandbox: cl.sandbox}))
	switch {
	case err == nil && resp.Msg.GetSandbox().GetState() == sbxv1.SandboxState_SANDBOX_STATE_RUNNING:
		w.WriteHeader(http.StatusNoContent)
	case err == nil || connect.CodeOf(err) == connect.CodeNotFound:
		writeError(w, http.StatusBadGateway, "sandbox "+cl.sandbox+" is not running")
	default:
		writeAPIError(w, fmt.Errorf("checking sandbox %s: %w", cl.sandbox, err))
	}
}

// fsServer is envd's filesystem.Filesystem over sbx's file calls.
type fsServer struct {
	filesystemconnect.UnimplementedFilesystemHandler
	h *Handler
}

func entryOf(fi *sbxv1.FileInfo) *filesystem.EntryInfo {
	e := &filesystem.EntryInfo{
		Name: fi.GetName(), Path: fi.GetPath(), Size: fi.GetSize(), Mode: fi.GetMode() & 0o7777,
		Owner: strconv.FormatUint(uint64(fi.GetUid()), 10), Group: strconv.FormatUint(uint64(fi.GetGid()), 10),
		ModifiedTime: timestamppb.New(time.UnixMilli(fi.GetMtimeMs())),
	}
	mode := fs.FileMode(fi.GetMode() & 0o777)
	switch fi.GetType() {
	case sbxv1.FileType_FILE_TYPE_FILE:
		e.Type = filesystem.FileType_FILE_TYPE_FILE
	case sbxv1.FileType_FILE_TYPE_DIR:
		e.Type, mode = filesystem.FileType_FILE_TYPE_DIRECTORY, mode|fs.ModeDir
	case sbxv1.FileType_FILE_TYPE_SYMLINK:
		e.Type, mode = filesystem.FileType_FILE_TYPE_SYMLINK, mode|fs.ModeSymlink
		t := fi.GetSymlinkTarget()
		e.SymlinkTarget = &t
	}
	e.Permissions = mode.String()
	if e.Name == "" {
		e.Name = path.Base(e.Path)
	}
	return e
}

func (s *fsServer) stat(ctx context.Context, p string) (*filesystem.EntryInfo, error) {
	cl := callOf(ctx)
	resp, err := cl.c.sandboxes.Stat(ctx, connect.NewRequest(&sbxv1.StatRequest{Sandbox: cl.sandbox, Path: p}))
	if err != nil {
		return nil, fmt.Errorf("stat %s: %w", p, err)
	}
	return entryOf(resp.Msg.GetInfo()), nil
}

func (s *fsServer) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	e, err := s.stat(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

func (s *fsServer) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	cl, p := callOf(ctx), req.Msg.GetPath()
	// envd answers AlreadyExists for an existing directory (the SDK's
	// makeDir then returns false).
	if e, err := s.stat(ctx, p); err == nil {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("make dir %s: %s exists", p, strings.ToLower(strings.TrimPrefix(e.GetType().String(), "FILE_TYPE_"))))
	}
	if _, err := cl.c.sandboxes.MakeDir(ctx, connect.NewRequest(&sbxv1.MakeDirRequest{Sandbox: cl.sandbox, Path: p, Parents: true, Mode: 0o755})); err != nil {
		return nil, fmt.Errorf("make dir %s: %w", p, err)
	}
	e, err := s.stat(ctx, p)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

func (s *fsServer) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	cl := callOf(ctx)
	from, to := req.Msg.GetSource(), req.Msg.GetDestination()
	if _, err := cl.c.sandboxes.Rename(ctx, connect.NewRequest(&sbxv1.RenameRequest{Sandbox: cl.sandbox, From: from, To: to})); err != nil {
		return nil, fmt.Errorf("move %s to %s: %w", from, to, err)
	}
	e, err := s.stat(ctx, to)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

// maxListDepth bounds ListDir's and WatchDir's depth.
const maxListDepth = 32

func (s *fsServer) list(ctx context.Context, p string, depth uint32) ([]*sbxv1.FileInfo, error) {
	cl := callOf(ctx)
	if depth == 0 {
		depth = 1
	}
	if depth > maxListDepth {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("list dir %s: depth %d is over %d", p, depth, maxListDepth))
	}
	resp, err := cl.c.sandboxes.ListDir(ctx, connect.NewRequest(&sbxv1.ListDirRequest{Sandbox: cl.sandbox, Path: p, Recursive: depth > 1, MaxDepth: int32(depth)}))
	if err != nil {
		return nil, fmt.Errorf("list dir %s: %w", p, err)
	}
	return resp.Msg.GetEntries(), nil
}

func (s *fsServer) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	entries, err := s.list(ctx, req.Msg.GetPath(), req.Msg.GetDepth())
	if err != nil {
		return nil, err
	}
	out := make([]*filesystem.EntryInfo, 0, len(entries))
	for _, fi := range entries {
		out = append(out, entryOf(fi))
	}
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: out}), nil
}

func (s *fsServer) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	cl, p := callOf(ctx), req.Msg.GetPath()
	if _, err := cl.c.sandboxes.Remove(ctx, connect.NewRequest(&sbxv1.RemoveRequest{Sandbox: cl.sandbox, Path: p, Recursive: true})); err != nil {
		return nil, fmt.Errorf("remove %s: %w", p, err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// Watching polls: sbx's agent has no inotify stream, so WatchDir lists the
// directory every watchInterval and reports the differences (creates,
// writes as a changed size or mtime, removes). Events between two polls
// that cancel out are not seen, and a rename is a remove plus a create.
const (
	watchInterval   = 500 * time.Millisecond
	watchKeepalive  = 30 * time.Second
	maxWatchEntries = 10000
	// maxWatches bounds the watches open on one sandbox per caller: each
	// lists the directory twice a second.
	maxWatches = 16
)

type watchState struct {
	size  int64
	mtime int64
	entry *sbxv1.FileInfo
}

func (s *fsServer) snapshot(ctx context.Context, dir string, recursive bool) (map[string]watchState, error) {
	depth := uint32(1)
	if recursive {
		depth = maxListDepth
	}
	entries, err := s.list(ctx, dir, depth)
	if err != nil {
		return nil, err
	}
	if len(entries) > maxWatchEntries {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("watch dir %s: %d entries is over the %d a watch polls", dir, len(entries), maxWatchEntries))
	}
	m := make(map[string]watchState, len(entries))
	for _, fi := range entries {
		m[fi.GetPath()] = watchState{size: fi.GetSize(), mtime: fi.GetMtimeMs(), entry: fi}
	}
	return m, nil
}

func (s *fsServer) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], st *connect.ServerStream[filesystem.WatchDirResponse]) error {
	dir := strings.TrimSuffix(req.Msg.GetPath(), "/")
	if dir == "" {
		dir = "/"
	}
	release, err := s.h.watches.acquire(ctxKey(callOf(ctx)))
	if err != nil {
		return err
	}
	defer release()
	prev, err := s.snapshot(ctx, dir, req.Msg.GetRecursive())
	if err != nil {
		return err
	}
	if err := st.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	tick := time.NewTicker(watchInterval)
	defer tick.Stop()
	lastSent := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		cur, err := s.snapshot(ctx, dir, req.Msg.GetRecursive())
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		send := func(p string, t filesystem.EventType, fi *sbxv1.FileInfo) error {
			name := strings.TrimPrefix(strings.TrimPrefix(p, dir), "/")
			ev := &filesystem.FilesystemEvent{Name: name, Type: t}
			if req.Msg.GetIncludeEntry() && fi != nil {
				ev.Entry = entryOf(fi)
			}
			lastSent = time.Now()
			return st.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: ev}})
		}
		for p, c := range cur {
			o, ok := prev[p]
			var err error
			switch {
			case !ok:
				err = send(p, filesystem.EventType_EVENT_TYPE_CREATE, c.entry)
			case o.size != c.size || o.mtime != c.mtime:
				err = send(p, filesystem.EventType_EVENT_TYPE_WRITE, c.entry)
			}
			if err != nil {
				return err
			}
		}
		for p := range prev {
			if _, ok := cur[p]; !ok {
				if err := send(p, filesystem.EventType_EVENT_TYPE_REMOVE, nil); err != nil {
					return err
				}
			}
		}
		prev = cur
		if time.Since(lastSent) > watchKeepalive {
			lastSent = time.Now()
			if err := st.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		}
	}
}

// watchCounter counts open watches by sandbox and caller.
type watchCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *watchCounter) acquire(key string) (func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[key] >= maxWatches {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("watch dir: %d watches are open on this sandbox, the most allowed", maxWatches))
	}
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[key]++
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.n[key]--; c.n[key] <= 0 {
			delete(c.n, key)
		}
	}, nil
}

// getFile serves envd's GET /files?path=P: the file's bytes.
func (h *Handler) getFile(w http.ResponseWriter, r *http.Request) {
	cl, p := callOf(r.Context()), r.URL.Query().Get("path")
	if p == "" {
		writeError(w, http.StatusBadRequest, "path: required")
		return
	}
	info, err := cl.c.sandboxes.Stat(r.Context(), connect.NewRequest(&sbxv1.StatRequest{Sandbox: cl.sandbox, Path: p}))
	if err != nil {
		writeAPIError(w, fmt.Errorf("reading %s: %w", p, err))
		return
	}
	if info.Msg.GetInfo().GetType() == sbxv1.FileType_FILE_TYPE_DIR {
		writeError(w, http.StatusBadRequest, "reading "+p+": it is a directory")
		return
	}
	st, err := cl.c.sandboxes.ReadFile(r.Context(), connect.NewRequest(&sbxv1.ReadFileRequest{Sandbox: cl.sandbox, Path: p}))
	if err != nil {
		writeAPIError(w, fmt.Errorf("reading %s: %w", p, err))
		return
	}
	defer st.Close()
	// The first chunk (or the end) decides between an error and the body.
	more := st.Receive()
	if !more && st.Err() != nil {
		writeAPIError(w, fmt.Errorf("reading %s: %w", p, st.Err()))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(p)}))
	if !more {
		w.Header().Set("Content-Length", "0")
		w.WriteHeader(http.StatusOK)
		return
	}
	w.WriteHeader(http.StatusOK)
	for more {
		if _, err := w.Write(st.Msg().GetData()); err != nil {
			return
		}
		more = st.Receive()
	}
	if err := st.Err(); err != nil {
		h.log.Warn("e2b: read file ended early", "sandbox", cl.sandbox, "path", p, "err", err)
		panic(http.ErrAbortHandler) // cut the body: the client sees a truncated read, not a short file
	}
}

// maxUploadFiles bounds the files of one multipart upload.
const maxUploadFiles = 1000

// writtenJSON is envd's EntryInfo of POST /files.
type writtenJSON struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// postFile serves envd's POST /files: multipart parts named "file" (the
// part's file name is its path when the query has none) or one
// application/octet-stream body for ?path=.
func (h *Handler) postFile(w http.ResponseWriter, r *http.Request) {
	cl := callOf(r.Context())
	qpath := r.URL.Query().Get("path")
	body := http.MaxBytesReader(w, r.Body, h.cfg.MaxUploadBytes)
	ct, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if enc := r.Header.Get("Content-Encoding"); enc != "" && enc != "identity" {
		writeError(w, http.StatusUnsupportedMediaType, "Content-Encoding "+enc+" is not supported: upload without gzip")
		return
	}
	var out []writtenJSON
	write := func(p string, src io.Reader) bool {
		if p == "" {
			writeError(w, http.StatusBadRequest, "path: required (in the query or as the part's file name)")
			return false
		}
		if err := writeFile(r.Context(), cl, p, src); err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("upload over %d bytes", h.cfg.MaxUploadBytes))
			} else {
				writeAPIError(w, err)
			}
			return false
		}
		out = append(out, writtenJSON{Name: path.Base(p), Type: "file", Path: p})
		return true
	}
	switch ct {
	case "multipart/form-data":
		mr := multipart.NewReader(body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				writeError(w, http.StatusBadRequest, "reading the multipart body: "+err.Error())
				return
			}
			if part.FormName() != "file" {
				continue
			}
			if len(out) >= maxUploadFiles {
				writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("more than %d files in one upload", maxUploadFiles))
				return
			}
			p := qpath
			if p == "" {
				// The part's file name is a whole path (Part.FileName
				// would keep only its last element).
				_, cd, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
				p = cd["filename"]
			}
			if !write(p, part) {
				return
			}
		}
	case "application/octet-stream", "":
		if !write(qpath, body) {
			return
		}
	default:
		writeError(w, http.StatusUnsupportedMediaType, "Content-Type "+ct+": want multipart/form-data or application/octet-stream")
		return
	}
	if len(out) == 0 {
		writeError(w, http.StatusBadRequest, "no file in the upload (multipart parts must be named \"file\")")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// writeFile streams src into p (creating its parent directories).
func writeFile(ctx context.Context, cl call, p string, src io.Reader) error {
	st := cl.c.sandboxes.WriteFile(ctx)
	err := st.Send(&sbxv1.WriteFileRequest{Msg: &sbxv1.WriteFileRequest_Header{Header: &sbxv1.WriteFileHeader{
		Sandbox: cl.sandbox, Path: p, Mode: 0o644, MakeParents: true}}})
	buf := make([]byte, 256<<10)
	for err == nil {
		n, rerr := src.Read(buf)
		if n > 0 {
			err = st.Send(&sbxv1.WriteFileRequest{Msg: &sbxv1.WriteFileRequest_Data{Data: buf[:n]}})
		}
		if errors.Is(rerr, io.EOF) {
			break
		}
		if rerr != nil {
			_, _ = st.CloseAndReceive()
			return fmt.Errorf("writing %s: %w", p, rerr)
		}
	}
	if err != nil && !errors.Is(err, io.EOF) {
		_, _ = st.CloseAndReceive()
		return fmt.Errorf("writing %s: %w", p, err)
	}
	if _, err := st.CloseAndReceive(); err != nil {
		return fmt.Errorf("writing %s: %w", p, err)
	}
	return nil
}
