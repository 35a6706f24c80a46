package server

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/sbxdev/sbx/internal/tenant"
)

// envelope is a Connect streaming message of size bytes (only its first
// have bytes of payload present).
func envelope(size, have int) []byte {
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(size)), bytes.Repeat([]byte{'x'}, have)...)
}

func budgetRequest(t *testing.T, who tenant.Principal, contentType string, body []byte, contentLength int64) *http.Request {
	t.Helper()
	r, err := http.NewRequest(http.MethodPost, "http://sbx/sbx.v1.SandboxService/WriteFile", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Content-Type", contentType)
	r.ContentLength = contentLength
	return r.WithContext(tenant.WithPrincipal(r.Context(), who))
}

// TestRequestBudget: a message is charged to its caller's key when its size
// is known (an envelope's prefix; a unary body's Content-Length), a stream's
// message released when the next starts and everything at the request's
// end; past the tenant's bound or the total, reading fails with
// ResourceExhausted naming the flag, and other keys are unaffected.
func TestRequestBudget(t *testing.T) {
	const mib = 1 << 20
	b := NewRequestBudget(100*mib, 150*mib)
	acme, beta := tenant.Principal{Tenant: "acme"}, tenant.Principal{Tenant: "beta"}
	read := func(r *http.Request) error {
		_, err := io.ReadAll(r.Body)
		return err
	}
	exhausted := func(err error, flag string) bool {
		var ce *connect.Error
		return errors.As(err, &ce) && ce.Code() == connect.CodeResourceExhausted && strings.Contains(err.Error(), flag)
	}

	// Two stalled 40 MiB messages of acme: 80 MiB held.
	var dones []func()
	for range 2 {
		r := budgetRequest(t, acme, "application/connect+proto", envelope(40*mib, 1024), -1)
		dones = append(dones, b.wrap(r))
		if err := read(r); err != nil {
			t.Fatalf("acme's message within its bound: %v", err)
		}
	}
	if got, _ := b.Held("acme"); got != 80*mib {
		t.Fatalf("acme holds %d, want %d", got, 80*mib)
	}
	// A third passes acme's 100 MiB: refused at its prefix.
	r := budgetRequest(t, acme, "application/connect+proto", envelope(40*mib, 10), -1)
	done := b.wrap(r)
	if err := read(r); !exhausted(err, "--request-bytes-per-tenant") {
		t.Errorf("acme's third 40 MiB message: got %v, want ResourceExhausted naming --request-bytes-per-tenant", err)
	}
	done()
	// beta's unary 60 MiB passes (140 of 150 MiB in all); another 20 MiB
	// of beta's breaks the total.
	r = budgetRequest(t, beta, "application/proto", make([]byte, 60*mib), 60*mib)
	doneBeta := b.wrap(r)
	if err := read(r); err != nil {
		t.Errorf("beta's 60 MiB unary request: %v", err)
	}
	r = budgetRequest(t, beta, "application/proto", make([]byte, 20*mib), 20*mib)
	done = b.wrap(r)
	if err := read(r); !exhausted(err, "--request-bytes-total") {
		t.Errorf("beta past the total: got %v, want ResourceExhausted naming --request-bytes-total", err)
	}
	done()
	doneBeta()
	for _, d := range dones {
		d()
	}
	if a, all := b.Held("acme"); a != 0 || all != 0 {
		t.Fatalf("after every request ended: acme holds %d, all %d; want 0", a, all)
	}

	// A stream of many 1 MiB messages holds one at a time: 300 MiB pass a
	// 100 MiB bound.
	var stream []byte
	for range 300 {
		stream = append(stream, envelope(mib, mib)...)
	}
	r = budgetRequest(t, acme, "application/connect+proto", stream, int64(len(stream)))
	done = b.wrap(r)
	if err := read(r); err != nil {
		t.Errorf("a stream of 300 1 MiB messages: %v", err)
	}
	if got, _ := b.Held("acme"); got != 0 {
		t.Errorf("after the stream ended at a message boundary acme holds %d, want 0 (its request is read)", got)
	}
	done()

	// A server-streaming call's one message (an Exec's stdin) is let go
	// once its body has ended, though the call goes on: three 40 MiB
	// calls pass a 100 MiB bound one after the other.
	dones = dones[:0]
	for i := range 3 {
		r = budgetRequest(t, acme, "application/connect+proto", envelope(40*mib, 40*mib), 40*mib+5)
		dones = append(dones, b.wrap(r))
		if err := read(r); err != nil {
			t.Errorf("server-streaming call %d of 40 MiB after the others' bodies ended: %v", i, err)
		}
	}
	for _, d := range dones {
		d()
	}
	if _, all := b.Held("acme"); all != 0 {
		t.Errorf("after the stream: %d held, want 0", all)
	}
}

// TestRequestBudgetCompressed: a compressed message is charged what it may
// expand to (maxExpansion times its size, at least minExpansionBound, at
// most the procedure's bound) besides its own bytes, enveloped or unary,
// with or without a Content-Length.
func TestRequestBudgetCompressed(t *testing.T) {
	const mib = 1 << 20
	who := tenant.Principal{Tenant: "acme"}
	for _, tc := range []struct {
		name   string
		path   string
		ct     string
		enc    string
		body   []byte
		length int64
		want   int64
	}{
		{"enveloped 1 MiB gzip, bulk", "/sbx.v1.SandboxService/WriteFile", "application/connect+proto", "",
			append(binary.BigEndian.AppendUint32([]byte{1}, mib), make([]byte, 16)...), -1, mib + maxRequestMessage + 1},
		{"enveloped 10 KiB gzip, bulk", "/sbx.v1.SandboxService/WriteFile", "application/connect+proto", "",
			append(binary.BigEndian.AppendUint32([]byte{1}, 10<<10), make([]byte, 16)...), -1, 10<<10 + minExpansionBound},
		{"enveloped 1 MiB gzip, small procedure", "/sbx.v1.SandboxService/ListDir", "application/connect+proto", "",
			append(binary.BigEndian.AppendUint32([]byte{1}, mib), make([]byte, 16)...), -1, mib + maxSmallRequestMessage + 1},
		{"enveloped 1 MiB plain", "/sbx.v1.SandboxService/WriteFile", "application/connect+proto", "",
			append(binary.BigEndian.AppendUint32([]byte{0}, mib), make([]byte, 16)...), -1, mib},
		{"unary gzip with length", "/sbx.v1.SandboxService/ListDir", "application/proto", "gzip",
			make([]byte, 100<<10), 100 << 10, 100<<10 + maxSmallRequestMessage + 1},
		{"unary gzip without length", "/sbx.v1.SandboxService/ListDir", "application/proto", "gzip",
			make([]byte, 30<<10), -1, 30<<10 + 3000<<10},
		{"unary identity without length", "/sbx.v1.SandboxService/ListDir", "application/proto", "identity",
			make([]byte, 30<<10), -1, 30 << 10},
	} {
		b := NewRequestBudget(1<<40, 1<<40)
		r, err := http.NewRequest(http.MethodPost, "http://sbx"+tc.path, bytes.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("Content-Type", tc.ct)
		if tc.enc != "" {
			r.Header.Set("Content-Encoding", tc.enc)
		}
		r.ContentLength = tc.length
		r = r.WithContext(tenant.WithPrincipal(r.Context(), who))
		done := b.wrap(r)
		if _, err := io.ReadAll(r.Body); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got, _ := b.Held("acme"); got != tc.want {
			t.Errorf("%s: got %d held, want %d", tc.name, got, tc.want)
		}
		done()
		if got, all := b.Held("acme"); got != 0 || all != 0 {
			t.Errorf("%s: after the request got %d and %d held, want 0", tc.name, got, all)
		}
	}
}
