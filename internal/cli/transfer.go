package cli

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sbxdev/sbx/internal/sandbox"
)

// transfer shows how a long transfer goes on the terminal: one line on
// stderr, redrawn at most 5 times a second, ended by done. Nothing is shown
// when stderr is not a terminal (scripts, CI logs), so the output of a
// command stays what it was. A nil *transfer does nothing.
type transfer struct {
	w     io.Writer
	what  string
	total atomic.Int64 // 0: unknown
	n     atomic.Int64
	start time.Time
	stop  chan struct{}
	wg    sync.WaitGroup
}

// newTransfer starts a progress line for what (total bytes if known, else
// 0; -1: no bytes to count, only the time taken), or returns nil when
// stderr is not a terminal.
func (a *app) newTransfer(what string, total int64) *transfer {
	f, ok := a.stderr.(*os.File)
	if !ok || !isTerminal(f) {
		return nil
	}
	p := &transfer{w: f, what: what, start: time.Now(), stop: make(chan struct{})}
	p.total.Store(total)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.draw(false)
			}
		}
	}()
	return p
}

func (p *transfer) line() string {
	n, total := p.n.Load(), p.total.Load()
	el := time.Since(p.start)
	if total < 0 {
		return p.what + ": " + el.Round(time.Second).String()
	}
	s := p.what + ": " + sandbox.FormatBytes(n)
	if total > 0 {
		s += fmt.Sprintf(" of %s (%d%%)", sandbox.FormatBytes(total), min(100, n*100/total))
	}
	if secs := el.Seconds(); secs >= 0.5 {
		s += fmt.Sprintf(", %s/s", sandbox.FormatBytes(int64(float64(n)/secs)))
	}
	return s + ", " + el.Round(time.Second).String()
}

func (p *transfer) draw(final bool) {
	end := ""
	if final {
		end = "\n"
	}
	// \r and erase-line: redraw in place.
	fmt.Fprintf(p.w, "\r\x1b[K%s%s", p.line(), end)
}

// add counts n more bytes.
func (p *transfer) add(n int64) {
	if p != nil {
		p.n.Add(n)
	}
}

// set sets the bytes moved (and the total, if known) from a callback.
func (p *transfer) set(n, total int64) {
	if p != nil {
		p.n.Store(n)
		if total != 0 {
			p.total.Store(total)
		}
	}
}

// done stops redrawing and leaves the final line.
func (p *transfer) done() {
	if p == nil {
		return
	}
	close(p.stop)
	p.wg.Wait()
	p.draw(true)
}

type transferReader struct {
	r io.Reader
	p *transfer
}

func (r transferReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	r.p.add(int64(n))
	return n, err
}

// reader counts what is read from r (r itself for a nil p).
func (p *transfer) reader(r io.Reader) io.Reader {
	if p == nil {
		return r
	}
	return transferReader{r, p}
}

type transferWriter struct {
	w io.Writer
	p *transfer
}

func (w transferWriter) Write(b []byte) (int, error) {
	n, err := w.w.Write(b)
	w.p.add(int64(n))
	return n, err
}

// writer counts what is written to w (w itself for a nil p).
func (p *transfer) writer(w io.Writer) io.Writer {
	if p == nil {
		return w
	}
	return transferWriter{w, p}
}

// sizedReader says how many bytes it has left (Len, as *bytes.Reader
// does), so that the SDK sends a file whose progress is counted over the
// raw file route like the bare file.
type sizedReader struct {
	r    io.Reader
	left int64
}

func (s *sizedReader) Read(b []byte) (int, error) {
	n, err := s.r.Read(b)
	s.left -= int64(n)
	return n, err
}

func (s *sizedReader) Len() int { return int(max(s.left, 0)) }
