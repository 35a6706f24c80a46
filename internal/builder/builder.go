// Package builder runs image recipes (sbxv1.Recipe): from a base image, each
// step either changes the image config (env, workdir, entrypoint, cmd,
// user) or runs in a fresh sandbox (apt_install, pip_install, npm_install,
// run, copy) whose filesystem diff becomes the step's layer. Steps are
// cached by sha256(parent key + step): an unchanged recipe only recomposes
// stored layers, and a changed step reruns from there on. It also makes the
// "debian:bookworm" base with debootstrap on the host.
//
// It drives sandboxes only through internal/sandbox's Manager and stores
// images only through internal/image's Store; the daemon wires it and the
// RPC server calls it. A build runs as its request's tenant
// (tenant.FromContext): its base, steps' images and cache live in that
// tenant's store, and its step sandboxes are the tenant's, counted against
// its quotas.
package builder

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sbxv1 "github.com/sbxdev/sbx/api/gen/sbx/v1"
	"github.com/sbxdev/sbx/internal/errdefs"
	"github.com/sbxdev/sbx/internal/image"
	"github.com/sbxdev/sbx/internal/sandbox"
	"github.com/sbxdev/sbx/internal/tenant"
)

// BuildLabel marks the sandboxes builds run steps in.
const BuildLabel = "sbx.build"

// Config wires a Builder.
type Config struct {
	Manager *sandbox.Manager
	// Stores gives each build its tenant's image store and step cache.
	Stores Stores
	// Resources of build sandboxes (zero fields: the manager's defaults),
	// each cut down to the tenant's quota.
	Resources *sbxv1.Resources
	// Storage, when set, is asked after every stored step whether the
	// tenant's images still fit its storage quota; an error ends the build.
	Storage func(ctx context.Context) error
	// Pull, when set, fetches a `from` image the tenant's store does not
	// have (within its storage quota; server.Puller.Pull).
	Pull func(ctx context.Context, ref string, progress func(image.Progress)) (*image.Image, error)
	// StepTimeout bounds one step (default 1h).
	StepTimeout time.Duration
	// Mirror is the Debian mirror debootstrap uses ("" = the one the
	// host's apt sources name, else deb.debian.org).
	Mirror string
	// MemoryBudget and TenantMemoryBudget bound the bytes builds under way
	// hold in the daemon's memory, all of them and one tenant's (0:
	// DefaultMemoryBudget, DefaultTenantMemoryBudget; see budget.go).
	MemoryBudget, TenantMemoryBudget int64

	Logger *slog.Logger
}

// Stores gives a build the image store and step cache directory of ctx's
// tenant (the step cache is one small JSON file per key, under the store).
type Stores interface {
	BuildStore(ctx context.Context) (store *image.Store, cacheDir string, err error)
}

// Builder runs recipes. Builds may run concurrently.
type Builder struct {
	cfg Config
	log *slog.Logger
	// debianMu serialises making the debian base.
	debianMu sync.Mutex
	// mem is charged what each build under way holds.
	mem *memoryBudget
}

// New returns a Builder.
func New(cfg Config) (*Builder, error) {
	if cfg.Manager == nil || cfg.Stores == nil {
		return nil, errors.New("builder needs a manager and stores")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.StepTimeout == 0 {
		cfg.StepTimeout = time.Hour
	}
	return &Builder{cfg: cfg, log: cfg.Logger, mem: newMemoryBudget(cfg.MemoryBudget, cfg.TenantMemoryBudget)}, nil
}

// build is one build's tenant's store and step cache.
type build struct {
	*Builder
	store    *image.Store
	cacheDir string
}

// Emit receives build events in order; an error from it aborts the build.
type Emit = func(*sbxv1.ImageProgress) error

func status(s string) *sbxv1.ImageProgress {
	return &sbxv1.ImageProgress{Event: &sbxv1.ImageProgress_Status{Status: s}}
}

func stepEvent(i int, desc, phase string, d time.Duration) *sbxv1.ImageProgress {
	return &sbxv1.ImageProgress{Event: &sbxv1.ImageProgress_Step{Step: &sbxv1.BuildStep{
		Index: int32(i), Description: desc, Phase: phase, DurationMs: d.Milliseconds()}}}
}

// Build runs req's recipe and tags the result with req.Tag (if set). Events
// (statuses, step phases, step output) go to emit; the caller sends the
// final `done` itself.
func (b *Builder) Build(ctx context.Context, req *sbxv1.BuildImageRequest, emit Emit) (*image.Image, error) {
	// Charged before the context is parsed: a build that does not fit
	// makes nothing of its request.
	held := heldBytes(req)
	who := tenant.FromContext(ctx).Tenant
	if err := b.mem.charge(who, held); err != nil {
		return nil, err
	}
	defer b.mem.release(who, held)
	if req.GetDockerfile() != "" {
		if req.GetRecipe() != nil {
			return nil, fmt.Errorf("build: give a recipe or a Dockerfile, not both: %w", errdefs.ErrInvalidArgument)
		}
		recipe, err := DockerfileRecipe(req.GetDockerfile(), req.GetContext(), req.GetBuildArgs())
		if err != nil {
			return nil, err
		}
		req = &sbxv1.BuildImageRequest{Recipe: recipe, Tag: req.GetTag(), NoCache: req.GetNoCache()}
	} else if len(req.GetContext()) > 0 || len(req.GetBuildArgs()) > 0 {
		return nil, fmt.Errorf("build: a context and build args go with a Dockerfile only: %w", errdefs.ErrInvalidArgument)
	}
	r := req.GetRecipe()
	if err := validate(r); err != nil {
		return nil, err
	}
	if req.GetTag() != "" {
		if err := validTag(req.GetTag()); err != nil {
			return nil, err
		}
	}
	store, cacheDir, err := b.cfg.Stores.BuildStore(ctx)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cacheDir, 0o700); err != nil {
		return nil, fmt.Errorf("create build cache: %w", err)
	}
	return (&build{Builder: b, store: store, cacheDir: cacheDir}).run(ctx, req, emit)
}

// heldBytes is the most a build of req holds in the daemon's memory: the
// request itself (the caller keeps it until the build ends) and, for a
// Dockerfile, its context's parsed entries and the tars of its copies at
// their bound.
func heldBytes(req *sbxv1.BuildImageRequest) int64 {
	n := int64(proto.Size(req))
	if req.GetDockerfile() != "" {
		n += int64(len(req.GetContext())) + copyAllowance(len(req.GetContext()))
	}
	return n
}

// run runs a validated request's recipe.
func (b *build) run(ctx context.Context, req *sbxv1.BuildImageRequest, emit Emit) (*image.Image, error) {
	start := time.Now()
	r := req.GetRecipe()
	// Intermediate images of this build survive a prune until it ends.
	lease := b.store.NewLease()
	defer lease.Release()
	ctx = image.WithLease(ctx, lease)
	network := b.networkAvailable(ctx)
	cur, err := b.base(ctx, r, network, emit)
	if err != nil {
		return nil, err
	}
	for i, step := range r.GetSteps() {
		n := i + 1
		desc := describe(step)
		key := stepKey(cur.Digest, step)
		if !req.GetNoCache() {
			if img, ok := b.fromCache(ctx, cur, key, desc); ok {
				cur = img
				if err := emit(stepEvent(n, desc, "cached", 0)); err != nil {
					return nil, err
				}
				continue
			}
		}
		if needsNetwork(step) && !network {
			return nil, fmt.Errorf("step %d (%s): sandbox networking is not available yet: %w", n, kind(step), errdefs.ErrFailedPrecondition)
		}
		if err := emit(stepEvent(n, desc, "running", 0)); err != nil {
			return nil, err
		}
		t0 := time.Now()
		var next *image.Image
		if configOnly(step) {
			next, err = b.store.Compose(ctx, cur.Digest, nil, image.ImageSpec{
				Config: applyConfig(cur.Config, step), CreatedBy: desc, Intermediate: true})
		} else {
			next, err = b.runStep(ctx, n, step, cur, emit)
		}
		if err != nil {
			return nil, err
		}
		if b.cfg.Storage != nil {
			if err := b.cfg.Storage(ctx); err != nil {
				return nil, fmt.Errorf("step %d (%s): %w", n, kind(step), err)
			}
		}
		if err := b.remember(ctx, key, desc, cur, next); err != nil {
			b.log.Warn("build cache: not saving step", "step", desc, "err", err)
		}
		cur = next
		if err := emit(stepEvent(n, desc, "done", time.Since(t0))); err != nil {
			return nil, err
		}
	}
	if tag := req.GetTag(); tag != "" {
		if err := b.store.Tag(ctx, cur.Digest, tag); err != nil {
			return nil, fmt.Errorf("tag the result: %w", err)
		}
		if cur, err = b.store.Get(ctx, tag); err != nil {
			return nil, err
		}
	}
	b.log.Info("image built", "tag", req.GetTag(), "digest", cur.Digest, "steps", len(r.GetSteps()), "took", time.Since(start).Round(time.Millisecond))
	return cur, nil
}

func validTag(tag string) error {
	// The store checks it for real when tagging; this only fails early.
	if tag == "" || len(tag) > 255 {
		return fmt.Errorf("tag %q: %w", tag, errdefs.ErrInvalidArgument)
	}
	return nil
}

// networkAvailable reports whether the default runtime gives sandboxes a
// network (the "network" capability).
func (b *Builder) networkAvailable(ctx context.Context) bool {
	for _, rt := range b.cfg.Manager.Runtimes(ctx) {
		if rt.GetIsDefault() {
			return slices.Contains(rt.GetCapabilities(), "network")
		}
	}
	return false
}

// base resolves the recipe's `from`, making debian:bookworm if needed.
func (b *build) base(ctx context.Context, r *sbxv1.Recipe, network bool, emit Emit) (*image.Image, error) {
	from := r.GetFrom()
	if from == sandbox.HostImage {
		return nil, fmt.Errorf("from: host: building on the built-in host image is not supported yet "+
			"(its /usr is the host's, not a layer); use debian:bookworm or another image: %w", errdefs.ErrInvalidArgument)
	}
	img, err := b.store.Get(ctx, from)
	if err == nil {
		return img, nil
	}
	if errdefs.IsNotFound(err) && !isDebianBookworm(from) && b.cfg.Pull != nil && !strings.HasPrefix(from, "sha256:") {
		if err := emit(status("pulling " + from)); err != nil {
			return nil, err
		}
		var emitErr error
		img, err := b.cfg.Pull(ctx, from, func(p image.Progress) {
			if emitErr == nil {
				emitErr = emit(&sbxv1.ImageProgress{Event: &sbxv1.ImageProgress_Layer{Layer: &sbxv1.LayerProgress{
					Digest: p.Layer, CurrentBytes: p.Current, TotalBytes: p.Total, Phase: p.Status}}})
			}
		})
		if err != nil {
			return nil, fmt.Errorf("from %q: not in the image store, and pulling it failed: %w", from, err)
		}
		return img, emitErr
	}
	if !errdefs.IsNotFound(err) || !isDebianBookworm(from) {
		return nil, fmt.Errorf("from: %w (pull or import it first)", err)
	}
	// Nothing of the recipe can be cached without its base: fail now rather
	// than after debootstrap if a step will need the network.
	for i, s := range r.GetSteps() {
		if needsNetwork(s) && !network {
			return nil, fmt.Errorf("step %d (%s): sandbox networking is not available yet: %w", i+1, kind(s), errdefs.ErrFailedPrecondition)
		}
	}
	return b.ensureDebian(ctx, emit)
}

// cacheEntry is what a step's cache file holds: enough to recompose the
// step's image on its parent without running anything.
type cacheEntry struct {
	Step    string            `json:"step"`
	Layers  []image.LayerDesc `json:"layers,omitempty"`
	Config  image.ImageConfig `json:"config"`
	Created time.Time         `json:"created"`
}

func (b *build) cachePath(key string) string { return filepath.Join(b.cacheDir, key+".json") }

// fromCache recomposes a cached step's image; false means a miss (no
// entry, or its layer was pruned).
func (b *build) fromCache(ctx context.Context, cur *image.Image, key, desc string) (*image.Image, bool) {
	var e cacheEntry
	if err := readJSON(b.cachePath(key), &e); err != nil {
		return nil, false
	}
	img, err := b.store.Compose(ctx, cur.Digest, e.Layers, image.ImageSpec{
		Config: e.Config, CreatedBy: desc, Created: e.Created, Intermediate: true})
	if err != nil {
		b.log.Info("build cache: entry unusable, rerunning the step", "step", desc, "err", err)
		return nil, false
	}
	return img, true
}

// remember saves the step that turned parent into img under key.
func (b *build) remember(ctx context.Context, key, desc string, parent, img *image.Image) error {
	layers, err := b.store.LayersOf(ctx, img.Digest)
	if err != nil {
		return err
	}
	e := cacheEntry{Step: desc, Layers: layers[len(parent.Layers):], Config: img.Config, Created: img.Created}
	return writeJSON(b.cachePath(key), e)
}

// runStep runs a step in a sandbox created from cur and commits its diff.
func (b *build) runStep(ctx context.Context, n int, step *sbxv1.RecipeStep, cur *image.Image, emit Emit) (*image.Image, error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.StepTimeout)
	defer cancel()
	sb, err := b.cfg.Manager.Create(ctx, &sbxv1.CreateSandboxRequest{
		Image:     cur.Digest,
		Labels:    map[string]string{BuildLabel: "1"},
		TimeoutMs: b.cfg.StepTimeout.Milliseconds() + time.Minute.Milliseconds(),
		Resources: withinQuota(b.cfg.Resources, tenant.FromContext(ctx).Quotas),
	})
	if err != nil {
		return nil, fmt.Errorf("step %d (%s): create sandbox: %w", n, kind(step), err)
	}
	defer func() {
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer dcancel()
		if err := b.cfg.Manager.Destroy(dctx, sb.GetId()); err != nil && !errdefs.IsNotFound(err) {
			b.log.Warn("build: destroying step sandbox", "sandbox", sb.GetId(), "err", err)
		}
	}()
	if c := step.GetCopy(); c != nil {
		if err := b.upload(ctx, sb.GetId(), c); err != nil {
			return nil, fmt.Errorf("step %d (copy): %w", n, err)
		}
	} else {
		user := "" // the image's
		if needsNetwork(step) {
			user = "0" // package managers install system-wide
		}
		code, err := b.exec(ctx, sb.GetId(), command(step), user, emit)
		if err != nil {
			return nil, fmt.Errorf("step %d (%s): %w", n, describe(step), err)
		}
		if code != 0 {
			return nil, fmt.Errorf("step %d (%s) failed with exit code %d: %w", n, describe(step), code, errdefs.ErrFailedPrecondition)
		}
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := b.cfg.Manager.Diff(ctx, sb.GetId(), pw)
		pw.CloseWithError(err)
		done <- err
	}()
	img, err := b.store.CommitSpec(ctx, cur.Digest, pr, image.ImageSpec{
		Config: cur.Config, CreatedBy: describe(step), Intermediate: true})
	pr.CloseWithError(errors.New("commit ended"))
	if derr := <-done; derr != nil {
		return nil, fmt.Errorf("step %d (%s): read the sandbox's changes: %w", n, kind(step), derr)
	}
	if err != nil {
		return nil, fmt.Errorf("step %d (%s): store the layer: %w", n, kind(step), err)
	}
	return img, nil
}

// withinQuota cuts build sandbox resources r down to a tenant's quotas, so
// that a tenant with nothing else running can build (the create still
// counts against the quota and fails, naming it, when other sandboxes
// hold it). The disk stays within the memory it is kept in.
func withinQuota(r *sbxv1.Resources, q tenant.Quotas) *sbxv1.Resources {
	if r == nil {
		return nil
	}
	out := &sbxv1.Resources{MemoryBytes: r.GetMemoryBytes(), CpuMillis: r.GetCpuMillis(), Pids: r.GetPids(), DiskBytes: r.GetDiskBytes()}
	cut := func(v *int64, limit int64) {
		if limit > 0 && *v > limit {
			*v = limit
		}
	}
	cut(&out.MemoryBytes, q.MemoryBytes)
	cut(&out.CpuMillis, q.CPUMillis)
	cut(&out.DiskBytes, q.DiskBytes)
	if out.MemoryBytes > 0 {
		cut(&out.DiskBytes, sandbox.MaxDiskInMemory(out.MemoryBytes))
	}
	return out
}

// exec runs a shell command in a sandbox, streaming its output as log
// events, and returns its exit code.
func (b *Builder) exec(ctx context.Context, id, shell, user string, emit Emit) (int, error) {
	conn, release, err := b.cfg.Manager.Agent(ctx, id)
	if err != nil {
		return 0, err
	}
	defer release()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st := conn.Exec(ctx)
	defer st.CloseResponse() //nolint:errcheck
	start := &sbxv1.ExecRequest{Sandbox: id, Shell: shell, User: user}
	if err := st.Send(&sbxv1.ExecInput{Event: &sbxv1.ExecInput_Start{Start: start}}); err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("start command: %w", err)
	}
	_ = st.CloseRequest()
	for {
		msg, err := st.Receive()
		if err != nil {
			return 0, fmt.Errorf("command output: %w", err)
		}
		var out []byte
		switch e := msg.GetEvent().(type) {
		case *sbxv1.ExecOutput_Stdout:
			out = e.Stdout
		case *sbxv1.ExecOutput_Stderr:
			out = e.Stderr
		case *sbxv1.ExecOutput_Exited:
			if e.Exited.GetError() != "" {
				return 0, fmt.Errorf("command did not start: %s", e.Exited.GetError())
			}
			return int(e.Exited.GetExitCode()), nil
		}
		if len(out) > 0 {
			if err := emit(&sbxv1.ImageProgress{Event: &sbxv1.ImageProgress_Log{Log: out}}); err != nil {
				return 0, err
			}
		}
	}
}

// upload extracts a copy step's tar into its destination in the sandbox.
func (b *Builder) upload(ctx context.Context, id string, c *sbxv1.CopyStep) error {
	conn, release, err := b.cfg.Manager.Agent(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	st := conn.UploadTar(ctx)
	msgs := []*sbxv1.UploadTarRequest{{Msg: &sbxv1.UploadTarRequest_Header{Header: &sbxv1.UploadTarHeader{Sandbox: id, Path: c.GetDest()}}}}
	for data := c.GetTar(); len(data) > 0; {
		n := min(len(data), 256<<10)
		msgs = append(msgs, &sbxv1.UploadTarRequest{Msg: &sbxv1.UploadTarRequest_Data{Data: data[:n]}})
		data = data[n:]
	}
	for _, m := range msgs {
		if err := st.Send(m); err != nil {
			break // the agent ended the stream; CloseAndReceive says why
		}
	}
	if _, err := st.CloseAndReceive(); err != nil {
		var ce *connect.Error
		if errors.As(err, &ce) {
			return fmt.Errorf("upload to %s: %s", c.GetDest(), ce.Message())
		}
		return fmt.Errorf("upload to %s: %w", c.GetDest(), err)
	}
	return nil
}
