package server

import (
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/internal/tenant"
)

// The bytes of API requests being read are bounded per tenant and in all.
// Each request message may be large (maxRequestMessage for bulk
// procedures), and the daemon holds what it has read of a message until the
// message is whole and handed over: a client that sends 40 MiB of a message
// and stalls keeps 40 MiB (and more, as the read buffer doubles) of the
// daemon's memory for as long as it likes. Before, 12 such BuildImage
// requests of one tenant at once made the daemon hold 1.4 GiB before the
// builder's own budget could refuse them (TestRequestBytesBudget).
//
// A RequestBudget charges each request's message to its caller's key (the
// tenant, or its boxes' scoped and envd tokens together) as soon as its
// size is known: an enveloped message (Connect streaming, gRPC) when its
// 5-byte prefix is read, at its declared size; an unenveloped one (Connect
// unary) at its Content-Length, or as it is read when it has none. A
// stream's message is released when the next one starts or the stream
// ends after it, and everything at the request's end. A message that would take its key past the tenant
// bound, or all keys past the total, fails the request at once with
// ResourceExhausted naming the bound.
type RequestBudget struct {
	perKey, total int64

	mu   sync.Mutex
	used map[string]int64 // by key
	all  int64
}

// Default request byte bounds: one tenant may have four of the largest
// messages (maxRequestMessage) being read at once, and the daemon sixteen.
const (
	DefaultRequestBytesPerTenant = 4 * maxRequestMessage
	DefaultRequestBytesTotal     = 16 * maxRequestMessage
)

// NewRequestBudget returns a budget of perTenant bytes a key and total in
// all (0: the defaults).
func NewRequestBudget(perTenant, total int64) *RequestBudget {
	if perTenant <= 0 {
		perTenant = DefaultRequestBytesPerTenant
	}
	if total <= 0 {
		total = DefaultRequestBytesTotal
	}
	return &RequestBudget{perKey: perTenant, total: total, used: map[string]int64{}}
}

// budgetKey is whose budget p's requests use.
func budgetKey(p tenant.Principal) string {
	switch {
	case p.Admin:
		return "\x00admin"
	case p.Scope != "" || p.Only != "":
		return p.Tenant + "\x00boxes"
	}
	return p.Tenant
}

// reserve charges n bytes to key, or says which bound it would break.
func (b *RequestBudget) reserve(key string, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used[key]+n > b.perKey {
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf(
			"requests being read: this tenant's would hold %d bytes, more than its bound of %d (sbx serve --request-bytes-per-tenant); retry when its other requests are in",
			b.used[key]+n, b.perKey))
	}
	if b.all+n > b.total {
		return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf(
			"requests being read: the daemon's would hold %d bytes, more than its bound of %d (sbx serve --request-bytes-total); retry shortly",
			b.all+n, b.total))
	}
	b.used[key] += n
	b.all += n
	return nil
}

func (b *RequestBudget) release(key string, n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.all -= n
	if b.used[key] -= n; b.used[key] <= 0 {
		delete(b.used, key)
	}
}

// Held returns the bytes charged now, to key and in all (tests).
func (b *RequestBudget) Held(key string) (int64, int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used[key], b.all
}

// wrap charges r's body to its Principal's key; call the returned done
// when the request has been served. A refusal comes as the body's first
// read error, so that Connect reports it in the request's own protocol.
func (b *RequestBudget) wrap(r *http.Request) (done func()) {
	if b == nil || r.Body == nil || r.Body == http.NoBody {
		return func() {}
	}
	ct := r.Header.Get("Content-Type")
	body := &budgetBody{ReadCloser: r.Body, b: b, key: budgetKey(tenant.FromContext(r.Context())),
		enveloped: strings.HasPrefix(ct, "application/connect+") || strings.HasPrefix(ct, "application/grpc"),
		readMax:   maxSmallRequestMessage}
	if bulkProcedures[r.URL.Path] {
		body.readMax = maxRequestMessage
	}
	if !body.enveloped && r.ContentLength > 0 {
		// Connect refuses more than the procedure's bound whatever the
		// header says; a compressed body is charged at what it may expand to.
		n := body.cost(r.ContentLength, compressedRequest(r.Header))
		if err := b.reserve(body.key, n); err != nil {
			body.err = err
		} else {
			body.held = n
		}
		body.prepaid = true
	} else if !body.enveloped && compressedRequest(r.Header) {
		body.expand = true
	}
	r.Body = body
	return body.done
}

// budgetBody charges what is read through it (see RequestBudget).
type budgetBody struct {
	io.ReadCloser
	b   *RequestBudget
	key string
	// enveloped: messages come as a 5-byte prefix (flags, big-endian size)
	// and their bytes; prefix collects a prefix, left counts the current
	// message's bytes still to come.
	enveloped bool
	prefix    [5]byte
	prefixN   int
	left      int64
	// prepaid: the whole unenveloped body was charged up front.
	prepaid bool
	// expand: an unenveloped compressed body of unknown length, charged
	// at what each piece read may expand to.
	expand bool
	raw    int64 // bytes read of an expand body
	// readMax is the procedure's bound on one message (requestbounds.go).
	readMax int64

	mu   sync.Mutex
	held int64
	err  error
}

func (c *budgetBody) Read(p []byte) (int, error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return 0, c.err
	}
	c.mu.Unlock()
	n, err := c.ReadCloser.Read(p)
	if n > 0 {
		if cerr := c.charge(p[:n]); cerr != nil {
			return 0, cerr
		}
	}
	if n == 0 && err == io.EOF {
		c.ended()
	}
	return n, err
}

// ended releases a stream's charge when its body ends at a message
// boundary: the reader came back for another message after the last was
// handed over, so nothing of the request is being read any more. Before,
// a server-streaming call's one request message stayed charged for the
// call's life: six Exec calls each with 48 MiB of stdin for a sleep held
// a tenant's whole 256 MiB, and the sixth was refused although the agent
// had the first five's stdin (TestExecStdinNotHeldByTheDaemon). A unary
// body stays charged until the request ends: Connect decompresses it only
// once it has read it all.
func (c *budgetBody) ended() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.enveloped && c.left == 0 && c.prefixN == 0 {
		c.b.release(c.key, c.held)
		c.held = 0
	}
}

// charge accounts for bytes just read.
func (c *budgetBody) charge(p []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.enveloped {
		if c.prepaid {
			return nil
		}
		n := int64(len(p))
		if c.expand {
			// What the body so far may make the daemon hold, less what
			// is charged already.
			c.raw += n
			n = c.cost(c.raw, true) - c.held
		}
		if err := c.b.reserve(c.key, n); err != nil {
			c.err = err
			return err
		}
		c.held += n
		return nil
	}
	for len(p) > 0 {
		if c.left > 0 {
			k := min(c.left, int64(len(p)))
			c.left -= k
			p = p[k:]
			continue
		}
		k := copy(c.prefix[c.prefixN:], p)
		c.prefixN += k
		p = p[k:]
		if c.prefixN < len(c.prefix) {
			return nil
		}
		// A new message: the previous one has been handed over.
		c.prefixN = 0
		c.b.release(c.key, c.held)
		c.held = 0
		size := int64(binary.BigEndian.Uint32(c.prefix[1:]))
		charge := c.cost(size, c.prefix[0]&1 != 0)
		if err := c.b.reserve(c.key, charge); err != nil {
			c.err = err
			return err
		}
		c.held, c.left = charge, size
	}
	return nil
}

// done releases what the request still holds.
func (c *budgetBody) done() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.b.release(c.key, c.held)
	c.held = 0
	if c.err == nil {
		c.err = io.ErrClosedPipe
	}
}

// cost is what a message of size bytes on the wire may make the daemon
// hold while it is read and handed over: its bytes, capped at the
// procedure's bound plus one (Connect refuses larger ones unread); and, for
// a compressed one, also what it may expand to (boundedGzip: maxExpansion
// times its size, at least minExpansionBound, at most the bound). Before,
// a compressed message was charged its compressed bytes: ten 60 MiB
// WriteFile data messages, 0.75 MiB each gzipped, passed a 128 MiB budget
// (TestRequestBytesBudgetCompressed).
func (c *budgetBody) cost(size int64, compressed bool) int64 {
	wire := min(size, c.readMax+1)
	if !compressed {
		return wire
	}
	return wire + min(max(size*maxExpansion, minExpansionBound), c.readMax+1)
}
